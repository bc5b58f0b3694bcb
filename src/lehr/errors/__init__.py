"""Errors whose message is the whole story: what is wrong, in which file, and what to do.

lehr raises a ``ValueError`` (or ``FileNotFoundError``) for every bad input and an ``Explained``
error for what it will not or cannot do (resume a checkpoint it cannot trust, write a folder
another run holds, reach a network that is not there). The
commands print such an error as one line and exit 2; anything else is a bug and keeps its
traceback. ``LEHR_TRACEBACK=1`` shows the traceback of every error.

A run a signal stops (Ctrl-C, ``kill``) is no error at all: ``Stopped`` carries the one line to
say and the exit status a shell gives a process that signal ended (130 for SIGINT, 143 for SIGTERM).

Here: the error types and the signals; ``messages`` turns an error into its line, and
``kedro_logs`` keeps Kedro from saying the same thing again around it. Where a parameter is set
(its YAML file and line) is ``lehr.params.key_lines``.
"""

from __future__ import annotations

import contextlib
import signal
import threading

EXIT = 2  # the exit status of an explained error (argparse's and click's for a usage error too)


class Explained(Exception):
    """Mixed into lehr's errors that are not bad input (a refused resume, a busy folder, no network):
    their message says what happened and what to do."""


class Stopped(BaseException):
    """A command or stage stopped by a signal. A BaseException, as KeyboardInterrupt is: no handler
    for errors takes it for a failure (Kedro neither logs it as a node's error nor suggests a resume),
    and the commands print its message alone and exit ``128 + signum``."""

    def __init__(self, message: str, signum: int = signal.SIGTERM, *, whole: bool = True):
        super().__init__(message)
        self.signum, self.whole = int(signum), whole  # whole: the message says what to do too

    @property
    def exit_status(self) -> int:
        return 128 + self.signum

    @classmethod
    def of(cls, error: BaseException, what: str = "") -> Stopped:
        """``error`` as the Stopped to say: a whole one as it is; a signal's bare stop, or a
        KeyboardInterrupt (Python's SIGINT), as ``stopped by <signal><what>``."""
        if isinstance(error, Stopped) and error.whole:
            return error
        signum = error.signum if isinstance(error, Stopped) else signal.SIGINT
        return cls(f"stopped by {signal.Signals(signum).name}{what}", signum)


@contextlib.contextmanager
def stop_on_signals():
    """SIGTERM raises ``Stopped`` (SIGINT already raises KeyboardInterrupt), so that what the
    command holds is let go and it ends with one line; a training loop installs its own handlers
    meanwhile (``lehr.engine.run.signals``). A SIGTERM ignored by whoever started the command stays
    ignored; outside the main thread, where handlers cannot be installed, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped(f"stopped by {signal.Signals(signum).name}", signum, whole=False)

    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
