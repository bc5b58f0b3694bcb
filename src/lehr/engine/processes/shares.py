"""A share of the machine for each run: its GPUs or its CPU cores, claimed before the run does any
work, so that runs side by side (``lehr queue start -j N``, two stages on one machine) never put two
runs on one GPU nor oversubscribe the cores (two torch processes on the same 2 cores ran 5.4x slower
each than one alone).

Every device is a file in the allocator's folder (``LEHR_SHARES_DIR``, else ``<tmp>/lehr-shares``); a
claim holds an exclusive ``flock`` on each of its devices' files, so the kernel ends the claim when
its holder dies, however it dies (kill -9 included). What the process was given is the machine:
its CPU affinity (a cpuset, SLURM's binding, ``taskset``) and ``CUDA_VISIBLE_DEVICES``.

How many runs share the machine is declared, since nothing else knows it (DVC does not tell a stage
its ``-j``): ``LEHR_JOBS=N`` gives each run 1/N of the cores, and on GPUs its ``nproc_per_node``
GPUs. Undeclared, a run on the CPU takes every core, as a single run always did, and a second run
waits for the first, saying so once; a run on GPUs takes the GPUs it launches processes on.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import random
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JOBS_ENV = "LEHR_JOBS"  # how many runs share this machine at once (lehr queue start -j N sets it)
FOLDER_ENV = "LEHR_SHARES_DIR"  # the allocator's folder: one per machine (tests give each worker its own)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Machine:
    """What this process may use: CPU core ids and GPU ids as ``CUDA_VISIBLE_DEVICES`` names them."""

    cores: tuple[int, ...]
    gpus: tuple[str, ...] = ()


@dataclass(frozen=True)
class Share:
    """What a run holds: its cores (all of them when it has the whole machine) and GPUs."""

    host: str
    cores: tuple[int, ...]
    gpus: tuple[str, ...]
    whole: bool  # no core pinned or capped (all of them, or none claimed), as before shares
    first_gpu_index: int | None = None  # where its first GPU is among those the process sees

    def describe(self) -> str:
        parts = [f"GPU {','.join(self.gpus)}"] if self.gpus else []
        if self.cores:
            parts.append(f"{'all ' if self.whole else ''}cores {_ranges(self.cores)}")
        return f"{self.host}: {' + '.join(parts) or 'nothing'}"

    def tags(self) -> dict[str, str]:
        """What MLflow and the timing files record of it (never a file DVC hashes)."""
        return {"host": self.host, "cores": _ranges(self.cores), "gpus": ",".join(self.gpus)}

    def threads(self, nproc: int) -> int:
        """Torch threads for each of the run's ``nproc`` processes."""
        return max(1, len(self.cores) // nproc)

    def env(self, nproc: int) -> dict[str, str]:
        """The environment of the processes the run launches: its GPUs, and its cores' thread count."""
        env = {"CUDA_VISIBLE_DEVICES": ",".join(self.gpus)} if self.gpus else {}
        if not self.whole:
            env["OMP_NUM_THREADS"] = str(self.threads(nproc))
        return env


def jobs() -> int | None:
    """The declared number of runs at once (``LEHR_JOBS``), or None when nobody declared it."""
    raw = os.environ.get(JOBS_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{JOBS_ENV}={raw!r}: give the number of runs at once, a whole number from 1 up")
    return int(raw)


def this_machine(with_gpus: bool) -> Machine:
    cores = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
    cores = cores or tuple(range(os.cpu_count() or 1))
    if not with_gpus:
        return Machine(cores)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return Machine(cores, tuple(g.strip() for g in visible.split(",") if g.strip()))
    import torch

    return Machine(cores, tuple(str(i) for i in range(torch.cuda.device_count())))


def wanted(machine: Machine, nproc: int, on_gpu: bool, declared: int | None) -> tuple[int, int]:
    """(cores, GPUs) a run of ``nproc`` processes claims, refused when the machine could never
    give them. Undeclared: every core on a CPU; on GPUs, its GPUs and no core."""
    have = len(machine.gpus) if on_gpu else len(machine.cores)
    if nproc > have:
        what = f"{have} GPU(s) (CUDA_VISIBLE_DEVICES)" if on_gpu else f"{have} CPU core(s) (its affinity)"
        raise ValueError(
            f"launch.nproc_per_node = {nproc}, but this process was given {what}; ask for at most that many"
        )
    if declared is None:
        return (0, nproc) if on_gpu else (len(machine.cores), 0)
    cores = max(len(machine.cores) // declared, 0 if on_gpu else nproc, 1)
    return min(cores, len(machine.cores)), nproc if on_gpu else 0


def folder() -> Path:
    return Path(os.environ.get(FOLDER_ENV) or Path(tempfile.gettempdir()) / "lehr-shares")


@contextlib.contextmanager
def claim(
    nproc: int, on_gpu: bool, purpose: str, machine: Machine | None = None, poll_s: float = 1.0
) -> Iterator[Share]:
    """Hold a share for the ``with`` block, waiting (with one line saying for whom) until it is free."""
    machine = machine or this_machine(on_gpu)
    declared = jobs()
    n_cores, n_gpus = wanted(machine, nproc, on_gpu, declared)
    root = folder()
    root.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(PermissionError):
        root.chmod(0o1777)  # one folder for every user of the machine, as /tmp is
    info = json.dumps(
        {"pid": os.getpid(), "cmd": " ".join(sys.argv)[:300], "purpose": purpose, "since": time.time()}
    )
    said = False
    while True:
        # One attempt at a time, so that two claimers never each hold part of what both need.
        with _allocator(root):
            held = _try(root, "cpu", machine.cores, n_cores) + _try(root, "gpu", machine.gpus, n_gpus)
            if len(held) == n_cores + n_gpus:
                break
            for fd, _ in held:
                os.close(fd)
            holders = _holders(root, machine)
        if not said:
            log.info(_waiting_line(n_cores, n_gpus, holders, declared))
            said = True
        time.sleep(poll_s * random.uniform(0.5, 1.5))
    try:
        for fd, _ in held:
            os.ftruncate(fd, 0)
            os.pwrite(fd, info.encode(), 0)
        cores = tuple(int(d) for kind, d in (name.split("-", 1) for _, name in held) if kind == "cpu")
        gpus = tuple(d for kind, d in (name.split("-", 1) for _, name in held) if kind == "gpu")
        # No core claimed (GPUs undeclared) pins nothing either: the CPU stays as it was.
        share = Share(
            socket.gethostname(),
            cores,
            gpus,
            whole=not 0 < len(cores) < len(machine.cores),
            first_gpu_index=machine.gpus.index(gpus[0]) if gpus else None,
        )
        if said:
            log.info("claimed %s for %s", share.describe(), purpose)
        yield share
    finally:
        for fd, _ in held:
            os.close(fd)  # releases the claim


def _try(root: Path, kind: str, devices: tuple[int | str, ...], count: int) -> list[tuple[int, str]]:
    """Take ``count`` free devices of ``kind``, or none (a part claim would starve two waiters)."""
    taken = []
    for device in devices if count else ():
        fd = _open_device(root / f"{kind}-{device}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        taken.append((fd, f"{kind}-{device}"))
        if len(taken) == count:
            return taken
    for fd, _ in taken:
        os.close(fd)
    return []


def _open_device(path: Path) -> int:
    """A device's file, made writable by every user of the machine. An existing file is opened
    without O_CREAT: in a sticky folder, the kernel refuses O_CREAT on another user's file
    (fs.protected_regular)."""
    try:
        return os.open(path, os.O_RDWR)
    except FileNotFoundError:
        pass
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return os.open(path, os.O_RDWR)
    with contextlib.suppress(PermissionError):
        os.fchmod(fd, 0o666)  # the umask took write from the others
    return fd


@contextlib.contextmanager
def _allocator(root: Path) -> Iterator[None]:
    fd = _open_device(root / ".allocator")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def holders(machine: Machine | None = None) -> dict[str, dict[str, Any]]:
    """Who holds each device of the machine now: ``{"cpu-0": {"pid", "cmd", "purpose", "since"}}``."""
    root = folder()
    if not root.is_dir():
        return {}
    with _allocator(root):  # no claim is half made while the files are read
        return _holders(root, machine or this_machine(False))


def _holders(root: Path, machine: Machine) -> dict[str, dict[str, Any]]:
    out = {}
    names = [f"cpu-{c}" for c in machine.cores] + [f"gpu-{g}" for g in machine.gpus]
    for name in names:
        path = root / name
        if not path.is_file():
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                continue  # free
            except BlockingIOError:
                try:
                    out[name] = json.loads(os.pread(fd, 4096, 0) or b"{}") or {"pid": "?"}
                except ValueError:
                    out[name] = {"pid": "?", "cmd": "a process that is starting"}
        finally:
            os.close(fd)
    return out


def _waiting_line(n_cores: int, n_gpus: int, holders: dict[str, dict[str, Any]], declared: int | None) -> str:
    wants = f"{n_gpus} free GPU(s)" if n_gpus else f"{n_cores} free CPU core(s)"
    by = sorted(
        {f"pid {h.get('pid')} ({h.get('purpose', '?')}: {h.get('cmd', '?')[:120]})" for h in holders.values()}
    )
    line = f"waiting for {wants}: held by {'; '.join(by) or 'runs that are ending'}"
    if declared is None and not n_gpus:
        line += (
            f". To run N at once, each on 1/N of the cores, declare it: `lehr queue start -j N`, or "
            f"{JOBS_ENV}=N in the environment of every run"
        )
    return line


def _ranges(ids: tuple[int, ...]) -> str:
    """(0, 1, 2, 5) -> "0-2,5"."""
    out: list[str] = []
    start: int | None = None
    prev: int | None = None
    for i in [*sorted(ids), None]:
        if prev is not None and i == prev + 1:  # prev is None exactly when start is
            prev = i
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = i
    return ",".join(out)


@contextlib.contextmanager
def pinned(share: Share, nproc: int) -> Iterator[None]:
    """This process (and what it starts) on the share's cores, with torch's threads to match; the
    whole machine changes nothing. Put back after the block, for the stage's later nodes."""
    if share.whole or not share.cores or not hasattr(os, "sched_setaffinity"):
        yield
        return
    import torch

    before_cores, before_threads = os.sched_getaffinity(0), torch.get_num_threads()
    _pin_every_thread(share.cores)
    torch.set_num_threads(share.threads(nproc))
    try:
        yield
    finally:
        _pin_every_thread(before_cores)
        torch.set_num_threads(before_threads)


def _pin_every_thread(cores: Iterable[int]) -> None:
    """The affinity of every thread of this process: the kernel sets one thread's at a time, and
    torch's OpenMP threads, once started, keep theirs. Threads started later inherit it."""
    tasks = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ["0"]
    for tid in tasks:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.sched_setaffinity(int(tid), cores)
