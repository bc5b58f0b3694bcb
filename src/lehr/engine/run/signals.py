"""SIGTERM, SIGINT and SIGHUP ask the loop to finish its step, checkpoint and exit cleanly."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_received: str | None = None  # the signal that stopped the last loop of this process
_Handler = Callable[[int, FrameType | None], Any] | int | None  # what signal.signal takes and returns


def received() -> str | None:
    """The name of the signal that stopped this process's last training loop (``SIGINT``), or None:
    the run's summary says only that a signal stopped it, the stage says which (its exit status)."""
    return _received


class GracefulStop:
    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[signal.Signals, _Handler] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
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

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
