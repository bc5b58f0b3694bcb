"""An error as the one line a person reads: lehr's own, Kedro's parameter validation as one line
per parameter, and a full disk named as such whoever raised it."""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path

from lehr.errors import Explained

# Kedro's own: a parameter that fails its dataclass (the message is lehr's check) and a dataset
# that cannot load (the message names the dataset and carries lehr's reason).
_KEDRO = ("ParameterValidationError", "DatasetError")


def explained(error: BaseException) -> str | None:
    """The message of the first explained error in ``error``'s chain, or None (show the traceback).
    Kedro's parameter validation is said as lehr's own message, one line per parameter."""
    if os.environ.get("LEHR_TRACEBACK") == "1":
        return None
    full = _full_disk(error)
    if full:
        return full
    seen = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if type(link).__name__ == "ParameterValidationError" and type(link).__module__.startswith("kedro"):
            return "\n".join(parameter_problems(str(link))) or str(link).strip()
        if isinstance(link, (ValueError, FileNotFoundError, FileExistsError, Explained)) or (
            type(link).__name__ in _KEDRO and type(link).__module__.startswith("kedro")
        ):
            return str(link).strip()
        link = link.__cause__ or link.__context__
    return None


_NO_ROOM = {
    errno.ENOSPC: "the disk is full",
    errno.EFBIG: "the file-size limit (ulimit -f) is reached",
    errno.EDQUOT: "the disk quota is used up",
}
# How writers that are not Python's own pass an errno on: Rust's "(os error 27)" (safetensors) and
# Python's "[Errno 28]" inside a message that wraps it.
_ERRNO_IN_TEXT = re.compile(r"\(os error (\d+)\)|\[Errno (\d+)\]")


def no_room(error: BaseException | None, staged: Path | None = None) -> str | None:
    """What a failed write ran into, if it was a lack of room anywhere in ``error``'s chain (the disk
    full, a file-size limit, a quota), in words; else None. A writer that kept no errno at all
    (torch.save's "unexpected pos") is judged by what it left in ``staged``, the folder it wrote
    (a file at the file-size limit in force) and the room left there."""
    found = _no_room_in_chain(error)
    if found or staged is None or _has_errno(error):
        return found
    import resource

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    with contextlib.suppress(OSError):
        if limit != resource.RLIM_INFINITY and any(
            f.stat().st_size >= limit for f in staged.rglob("*") if f.is_file()
        ):
            return _NO_ROOM[errno.EFBIG]
        fs = os.statvfs(staged)
        if fs.f_bavail * fs.f_frsize < 1 << 20:
            return _NO_ROOM[errno.ENOSPC]
    return None


def _has_errno(error: BaseException | None) -> bool:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno is not None:
            return True
        error = error.__cause__ or error.__context__
    return False


def _no_room_in_chain(error: BaseException | None) -> str | None:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _NO_ROOM:
            return _NO_ROOM[error.errno]
        found = _ERRNO_IN_TEXT.search(str(error))
        if found and int(found.group(1) or found.group(2)) in _NO_ROOM:
            return _NO_ROOM[int(found.group(1) or found.group(2))]
        error = error.__cause__ or error.__context__
    return None


def _full_disk(error: BaseException | None) -> str | None:
    """A write that found no room, anywhere in the chain, said as what it is and what to do (every
    lehr write is staged beside its target, so what was there before is as it was). An explained
    error on the way already said it, with the artifact it was writing."""
    cause = no_room(error)
    if cause is None:
        return None
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, Explained):
            return str(error).strip()
        if isinstance(error, OSError) and error.errno in _NO_ROOM:
            where = f" writing {shown(Path(os.fsdecode(error.filename)))}" if error.filename else ""
            return (
                f"no room{where}: {_NO_ROOM[error.errno]}. Free space (or raise the limit) and run the same "
                "command again; every file it was replacing is as it was before"
            )
        error = error.__cause__ or error.__context__
    return f"no room: {cause}. Free space (or raise the limit) and run the same command again"


# One line of Kedro's ParameterValidationError per parameter, around the message of the exception
# its dataclass raised (kedro.validation: parameter_validator and model_factory).
_PROBLEM = re.compile(
    r"^- Parameter '(?P<key>[^']*)': (?:Failed to instantiate \w+ for parameter '[^']*': )?(?P<said>.*)$"
)
_NOT_A_MAPPING = re.compile(r"^Expected dict for dataclass \w+, got (?P<got>\w+)$")


def parameter_problems(message: str) -> list[str]:
    """What Kedro's parameter validation found, one line per parameter, each as lehr says it: the
    dataclass's own message when it is lehr's (``parameter anneal.lr = 0 must be positive``)."""
    problems = []
    for line in message.splitlines():
        m = _PROBLEM.match(line.strip())
        if m is None:
            continue
        key, said = m["key"], m["said"].strip()
        if re.match(r"(unknown )?parameter ", said):
            problems.append(said)
        elif said.endswith("value is None but type is not Optional"):
            problems.append(f"parameter {key} is empty (null): it must be a mapping of the keys of {key}")
        elif mapping := _NOT_A_MAPPING.match(said):
            problems.append(
                f"parameter {key} is a {mapping['got']}: it must be a mapping of the keys of {key}"
            )
        else:
            problems.append(f"parameter {key}: {said}")
    return problems


def shown(file: Path) -> str:
    """A path as a person at the project's root reads it: relative to here where it can be."""
    try:
        return str(file.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(file)
