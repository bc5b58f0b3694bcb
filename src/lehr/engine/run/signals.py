"""SIGTERM, SIGINT and SIGHUP ask the loop to finish its step, checkpoint and exit cleanly."""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_received: str | None = None  # the signal that stopped the last loop of this process


def received() -> str | None:
    """The name of the signal that stopped this process's last training loop (``SIGINT``), or None:
    the run's summary says only that a signal stopped it, the stage says which (its exit status)."""
    return _received


class GracefulStop:
    def __init__(self):
        self.requested: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        global _received
        if self.requested is None:
            self.requested = _received = signal.Signals(signum).name
            log.warning("%s received: finishing this step, then saving a checkpoint", self.requested)

    def __enter__(self) -> GracefulStop:
        global _received
        _received = None
        if threading.current_thread() is threading.main_thread():  # handlers only install there
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
