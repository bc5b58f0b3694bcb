"""Errors whose message is the whole story: what is wrong, in which file, and what to do.

lehr raises a ``ValueError`` (or ``FileNotFoundError``) for every bad input and an ``Explained``
error for what it will not or cannot do (resume a checkpoint it cannot trust, write a folder
another run holds, reach a network that is not there). The
commands print such an error as one line and exit 2; anything else is a bug and keeps its
traceback. ``LEHR_TRACEBACK=1`` shows the traceback of every error.

A run a signal stops (Ctrl-C, ``kill``) is no error at all: ``Stopped`` carries the one line to
say and the exit status a shell gives a process that signal ended (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import threading
import warnings
from pathlib import Path

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


# Kedro's parameter validation logs each parameter that fails its dataclass, then raises the same
# text: lehr says it once (``quiet_errors``).
VALIDATOR = "kedro.validation.parameter_validator"
# Kedro's own words on a failed node: the error again, and a hint to resume with --from-nodes
# (lehr's stages resume by themselves).
NODE_FAILURE = (
    "kedro.pipeline.node",
    "kedro.runner.sequential_runner",
    "kedro.runner.parallel_runner",
    "kedro.runner.thread_runner",
)


@contextlib.contextmanager
def held_back(names: tuple[str, ...]):
    """Hold back the warnings and errors of the loggers ``names`` meanwhile, into the list it
    yields: an explained error is said in one line and they go; any other error ``release``s them
    before its traceback."""
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        held.append(record)
        return False

    loggers = [logging.getLogger(n) for n in names]
    for logger in loggers:
        logger.addFilter(hold)
    try:
        yield held
    finally:
        for logger in loggers:
            logger.removeFilter(hold)


def release(held: list[logging.LogRecord]) -> None:
    for record in held:
        logging.getLogger(record.name).handle(record)


def quiet_config_loader() -> None:
    """Kedro's config loader registers its resolvers with an omegaconf call that omegaconf 2.4 (the
    one hydra-core pins) warns about at every load: Kedro's to change, nothing a user can act on."""
    warnings.filterwarnings(
        "ignore", message=r"register_new_resolver\(\) is deprecated", category=UserWarning
    )


@contextlib.contextmanager
def quiet_errors(logger_name: str):
    """Drop the ERROR records of logger ``logger_name`` meanwhile (for a logger whose errors are
    raised too, and said by lehr); its other records, and every other logger's, pass."""

    def keep(record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR

    logger = logging.getLogger(logger_name)
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


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
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if type(error).__name__ == "ParameterValidationError" and type(error).__module__.startswith("kedro"):
            return "\n".join(parameter_problems(str(error))) or str(error).strip()
        if isinstance(error, (ValueError, FileNotFoundError, FileExistsError, Explained)) or (
            type(error).__name__ in _KEDRO and type(error).__module__.startswith("kedro")
        ):
            return str(error).strip()
        error = error.__cause__ or error.__context__
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
            where = f" writing {_shown(Path(os.fsdecode(error.filename)))}" if error.filename else ""
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


# -- where a parameter is set ---------------------------------------------------------------------
_KEY = re.compile(r"^(?:unknown )?parameter (?P<key>[A-Za-z0-9_.\-]+)")


def located(message: str, runtime_params: dict | None, conf: Path, env: str) -> str:
    """``message`` about a parameter, prefixed with where that parameter is set: ``--params``, or
    the YAML file and line under ``conf`` (``conf/smoke/parameters_anneal.yml:3``). Other messages,
    and a parameter set nowhere, are left as they are."""
    m = _KEY.match(message)
    where = m and where_set(m["key"].strip("."), runtime_params, conf, env)
    return f"{where}: {message}" if where else message


def where_set(key: str, runtime_params: dict | None, conf: Path, env: str) -> str | None:
    """Where the parameter ``key`` (``anneal.shape``, ``pretrain.stable_mix.gold``) gets its value:
    ``--params``, else the profile's YAML (which overrides base), else base's; for a key set nowhere
    (a missing one) the file that sets its nearest parent, base's first (where every key has its
    place). None when no file sets even its section."""
    path = key.split(".")
    if _given(runtime_params or {}, path):
        return "--params"
    files = {folder: _parameter_files(conf / folder) for folder in (env, "base")}
    for depth in range(len(path), 0, -1):
        order = (env, "base") if depth == len(path) else ("base", env)
        for f in (f for folder in order for f in files[folder]):
            line = _line_of(f, path[:depth])
            if line is not None:
                return f"{_shown(f)}:{line}"
    return None


def _given(mapping: dict, path: list[str]) -> bool:
    """Whether ``mapping`` (``--params``, nested) sets the key at ``path``, or a value above it that
    is no mapping (``pretrain.stable_mix=x``: its keys are all of --params)."""
    for part in path:
        if not isinstance(mapping, dict):
            return True
        if part not in mapping:
            return False
        mapping = mapping[part]
    return True


def _parameter_files(folder: Path) -> list[Path]:
    """The files Kedro reads parameters from (its patterns parameters*, parameters*/**, **/parameters*)."""
    if not folder.is_dir():
        return []
    return sorted(
        f
        for f in folder.rglob("*")
        if f.suffix in (".yml", ".yaml")
        and f.is_file()
        and any(part.startswith("parameters") for part in f.relative_to(folder).parts)
    )


def _line_of(file: Path, path: list[str]) -> int | None:
    """The line (1-based) of the key at ``path`` in a YAML file, or None where the file does not set it."""
    import yaml

    try:
        node = yaml.compose(file.read_text())
    except (OSError, yaml.YAMLError):
        return None
    line = None
    for part in path:
        if not isinstance(node, yaml.MappingNode):
            return None
        found = next(((k, v) for k, v in node.value if getattr(k, "value", None) == part), None)
        if found is None:
            return None
        line, node = found[0].start_mark.line + 1, found[1]
    return line


def _shown(file: Path) -> str:
    try:
        return str(file.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(file)
