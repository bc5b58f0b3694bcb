"""Crash-safe writes (a reader sees the old file or folder or the new one, never half of one),
recovery of what a killed writer left behind, and file hashes.

A write goes to a sibling ``.tmp-<name>-<pid>``; replacing a folder parks the old one at
``.old-<name>-<pid>`` for the instant between two renames. Those names are what ``recover`` looks for.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from lehr.errors.messages import no_room

log = logging.getLogger(__name__)
_LEFTOVER = re.compile(r"^\.(tmp|old)-(.+)-(\d+)$")
# The process's umask, read once at import (setting it to read it is not safe beside other threads).
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def as_umask_allows(path: str | Path) -> None:
    """Give a file the mode every other file gets: safetensors writes its files 0600 whatever the
    umask, so a checkpoint or an export was unreadable to the others sharing a machine or a DVC cache."""
    os.chmod(path, 0o666 & ~_UMASK)


def is_leftover(name: str) -> bool:
    """A name this module stages or parks a write under (``recover`` clears them)."""
    return _LEFTOVER.match(name) is not None


def same_tree(a: Path, b: Path) -> bool:
    """Whether two folders hold the same files with the same bytes (a rewrite would change nothing)."""
    if not (a.is_dir() and b.is_dir()):
        return False
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    if files != sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()):
        return False
    return all(
        (a / f).stat().st_size == (b / f).stat().st_size and sha256_file(a / f) == sha256_file(b / f)
        for f in files
    )


def sibling(path: Path, kind: str) -> Path:
    """Where a write of ``path`` by this process stages (``tmp``) or parks the old copy (``old``)."""
    return path.with_name(f".{kind}-{path.name}-{os.getpid()}")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = sibling(path, "tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def refuse_link(path: Path, writer: str = "lehr") -> None:
    """lehr writes, replaces and clears only folders of its own: a symbolic link where it would
    write could send its writes, and its clean-ups, anywhere."""
    if path.is_symlink():
        raise FileExistsError(
            f"{path} is a symbolic link (to {os.readlink(path)}), and {writer} writes only folders of "
            f"its own. Remove the link (`rm {path}`: what it points to stays) or choose another name; "
            "to keep the folder on another disk, link the folder that holds it instead."
        )


def _remove(path: Path) -> None:
    """A file, a folder, or a link as a link (never what it points to)."""
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def new_staging(target: Path) -> Path:
    """A new, empty folder beside ``target`` to build it in (``.tmp-<name>-<pid>``), after clearing
    what killed writers of ``target`` left."""
    refuse_link(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    recover(target.parent, target.name)
    staging = sibling(target, "tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    return staging


@contextlib.contextmanager
def staged_dir(target: Path, keep_if_same: bool = False) -> Iterator[Path]:
    """Build ``target`` whole or not at all: the ``with`` block writes into the folder it is given,
    which replaces ``target`` only when the block ends without an error; an error (a full disk)
    removes it and leaves ``target`` as it was, and a kill leaves a ``.tmp-`` folder the next
    writer clears. With ``keep_if_same``, a build that holds the same bytes as ``target`` leaves
    ``target`` untouched (its files' times too)."""
    staging = new_staging(target)
    try:
        yield staging
        if not (keep_if_same and same_tree(staging, target)):
            replace_dir(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def copy_tree(src: Path, dst: Path, shown_as: Path | None = None) -> None:
    """``shutil.copytree`` (links followed, modes and times kept) that stops at the first file it
    cannot write for want of room and raises that OSError, its errno kept and the file named as it
    will be (under ``shown_as``, the folder ``dst`` becomes): copytree gathered every failure into
    one ``shutil.Error`` of text tuples, which told a full disk from nothing else."""
    for folder, _, files in os.walk(src, followlinks=True):
        here = Path(folder)
        (dst / here.relative_to(src)).mkdir(parents=True, exist_ok=True)
        for name in sorted(files):
            target = dst / here.relative_to(src) / name
            try:
                shutil.copy2(here / name, target)
            except OSError as e:
                if no_room(e) is None:
                    raise
                raise OSError(e.errno, e.strerror, str((shown_as or dst) / target.relative_to(dst))) from e
    for folder, _, _ in os.walk(src, followlinks=True):  # after their files, which change their times
        shutil.copystat(folder, dst / Path(folder).relative_to(src))


def replace_dir(tmp: Path, dst: Path) -> None:
    """Move the complete folder ``tmp`` to ``dst``; an old ``dst`` goes only once the new one is in place."""
    old = sibling(dst, "old")
    fsync_dir(tmp)
    if dst.exists():
        os.replace(dst, old)
    os.replace(tmp, dst)
    fsync_dir(dst.parent)
    shutil.rmtree(old, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        pass
    return True


def recover(folder: Path, name: str | None = None) -> None:
    """Clear what writers killed mid-write left in ``folder`` (of ``name`` only, if given), with a
    warning for each.

    A staged ``.tmp-`` write is incomplete by definition and goes. An ``.old-`` folder is the
    previous copy of something being replaced: it goes back in place if the kill fell between the
    two renames (its replacement never landed), else it goes. Leftovers of a live process (another
    writer on this host) are not touched.
    """
    folder = Path(folder)
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        m = _LEFTOVER.match(path.name)
        if not m or name not in (None, m[2]) or (int(m[3]) != os.getpid() and _alive(int(m[3]))):
            continue
        kind, target = m[1], path.with_name(m[2])
        try:
            # A link is never a copy lehr parked there: it goes as a link, and is never restored.
            if kind == "old" and not path.is_symlink() and not os.path.lexists(target):
                os.replace(path, target)
                log.warning(
                    "restored %s from %s, left between two renames by a killed write", target, path.name
                )
                continue
            _remove(path)
        except FileNotFoundError:  # another process cleared it first
            continue
        log.warning("removed %s, left in %s by a killed write", path.name, folder)


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
