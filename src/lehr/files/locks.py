"""One writer per folder: an exclusive ``fcntl`` lock beside the folder, held for as long as a run
writes it. The kernel releases the lock when its holder dies, however it dies, so a kill never
leaves a stale lock; a second writer is refused at once with the holder's pid and command.

The lock file sits beside the folder (``.<name>.lehr.lock``), not in it, so a folder that is
swapped in whole keeps its lock, and DVC (``.dvcignore``) never hashes it into an output.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from lehr.errors import Explained
from lehr.files.atomic import refuse_link

log = logging.getLogger(__name__)


class FolderBusyError(RuntimeError, Explained):
    """Another live process holds the folder's lock; the message names it."""


def lock_path(folder: Path) -> Path:
    return folder.parent / f".{folder.name}.lehr.lock"


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        info = {}
    return (
        f"pid {info.get('pid', '?')}: {info.get('cmd', 'unknown command')}"
        if info
        else "a process that is starting"
    )


@contextlib.contextmanager
def hold(folder: str | Path, purpose: str, wait: bool = False) -> Iterator[None]:
    """Hold ``folder``'s lock for the ``with`` block, or raise FolderBusyError at once; with
    ``wait``, wait for the holder to end instead (one line says whom it waits for)."""
    folder = Path(folder)
    refuse_link(folder, f"lehr ({purpose})")
    folder.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path(folder), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if wait:
                log.info(
                    "%s is in use by %s: waiting for it to end, then going on from what it left",
                    folder,
                    _holder(fd),
                )
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                raise FolderBusyError(
                    f"{folder} is in use by another run ({_holder(fd)}); lehr lets one process write a "
                    "folder at a time. Wait for that run to finish, or stop it, then run again."
                ) from None
        os.ftruncate(fd, 0)
        os.pwrite(
            fd,
            json.dumps(
                {
                    "pid": os.getpid(),
                    "cmd": " ".join(sys.argv)[:300],
                    "purpose": purpose,
                    "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                }
            ).encode(),
            0,
        )
        yield
    finally:
        os.close(fd)  # releases the lock


def holder(folder: str | Path) -> str | None:
    """Who holds ``folder``'s lock now, or None if nobody does."""
    path = lock_path(Path(folder))
    if not path.is_file():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(fd)
        return None
    finally:
        os.close(fd)
