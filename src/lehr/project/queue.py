"""``lehr queue``: DVC's experiment queue, run N at a time with each experiment on its own share of
the machine, and stopped whole.

``dvc queue start -j N`` runs N experiments at once but tells none of them about the others: each
stage's torch took every core, and two anneals side by side ran 5.4x slower each. ``lehr queue
start -j N`` declares N (``LEHR_JOBS``, which DVC's workers hand on to every stage they run), so
each stage claims 1/N of the cores or its own GPUs (``lehr.engine.processes.shares``). Ctrl-C of ``dvc
exp run --run-all`` only stops DVC following the logs; here it stops the queue: no queued
experiment starts, and each running one is interrupted as ``dvc queue kill`` does (SIGINT to its
process group), so that its training stage saves a checkpoint in the project's run folders, where
the same experiment queued again resumes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lehr.engine.processes import shares
from lehr.errors import Explained, Stopped


class QueueBusy(RuntimeError, Explained):
    """The queue is not free to start: one line says why and what to do."""


STOP_WAIT_S = 600  # how long a stop waits for the interrupted stages to save their checkpoints
STARTER = Path(".dvc/tmp/lehr-queue-start.json")  # the live `lehr queue start` of the project


def start(project: Path, jobs: int) -> int:
    """Run every queued experiment, ``jobs`` at a time; Ctrl-C or SIGTERM stops them all cleanly."""
    if jobs < 1:
        raise ValueError(f"-j {jobs}: give how many experiments run at once, from 1 up")
    no_workers_left(project)
    env = {**os.environ, shares.JOBS_ENV: str(jobs)}
    print(
        f"lehr queue: {jobs} at once, each on its share of this machine ({shares.JOBS_ENV}={jobs})",
        flush=True,
    )
    previous = signal.signal(signal.SIGTERM, _interrupt)
    proc = None
    starter = project / STARTER
    starter.parent.mkdir(parents=True, exist_ok=True)
    starter.write_text(json.dumps(_identity(os.getpid())))  # for `lehr queue stop` elsewhere
    try:
        proc = subprocess.Popen(["dvc", "exp", "run", "--run-all", "-j", str(jobs)], cwd=project, env=env)
        code = proc.wait()
        return 128 - code if code < 0 else code  # killed by signal n: 128 + n, as a shell says
    except (KeyboardInterrupt, Stopped) as e:
        # A second Ctrl-C must not cut the stop short: it is what keeps the experiments' work.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(
            "lehr queue: stopping: no queued experiment starts, the running ones save a checkpoint",
            file=sys.stderr,
        )
        stop(project)
        return Stopped.of(e).exit_status
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # DVC would go on waiting for the queued ones to start
            proc.wait()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with contextlib.suppress(OSError, ValueError):
            if json.loads(starter.read_text()) == _identity(os.getpid()):
                starter.unlink()


def stop_elsewhere(project: Path) -> None:
    """``lehr queue stop``: ask the live ``lehr queue start`` of this project to stop (it then
    stops as on Ctrl-C, and ends); with none, stop the queue here."""
    import psutil

    try:
        recorded = json.loads((project / STARTER).read_text())
        starter = psutil.Process(recorded["pid"])
        live = _identity(starter.pid) == recorded
    except (OSError, ValueError, KeyError, psutil.Error):
        live = False
    if not live:
        stop(project)
        return
    print(f"lehr queue: asking `lehr queue start` (pid {starter.pid}) to stop", file=sys.stderr)
    starter.send_signal(signal.SIGTERM)
    # Until it has ended: gone, or a zombie its parent has not reaped yet (psutil's wait would
    # wait on a zombie to the end of the timeout).
    deadline = time.monotonic() + STOP_WAIT_S + 60
    with contextlib.suppress(psutil.Error):
        while starter.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.5)


def _identity(pid: int) -> dict:
    import psutil

    return {"pid": pid, "started": psutil.Process(pid).create_time()}


def _interrupt(signum, frame) -> None:
    raise Stopped(f"stopped by {signal.Signals(signum).name}", signum, whole=False)


def no_workers_left(project: Path, wait_s: float = 120) -> None:
    """DVC's workers linger a minute after their queue empties, and one started by an earlier queue
    holds that queue's declaration (or none): it would run the next experiment on the wrong share.
    Idle ones are stopped first; a queue still running is refused by name."""
    from dvc.repo import Repo

    with Repo(str(project)) as repo:
        queue = repo.experiments.celery_queue
        running = [entry.name or entry.stash_rev[:7] for entry in queue.iter_active()]
        if running:
            raise QueueBusy(
                f"a queue is running here ({', '.join(running)}): wait for it, or stop it with "
                "`python -m lehr queue stop`, then start again"
            )
        if not queue.worker_status():
            return
        queue.celery.control.shutdown()
        deadline = time.monotonic() + wait_s
        while queue.worker_status():
            if time.monotonic() > deadline:
                raise QueueBusy(
                    f"DVC's queue workers here did not stop within {wait_s:.0f} s; they would run the "
                    "next experiments on an earlier queue's share. Stop them (`dvc queue stop --kill`), "
                    "then start again"
                )
            time.sleep(1)


def stop(project: Path) -> list[str]:
    """Stop the queue's workers taking new experiments, then interrupt the running ones (SIGINT to
    each one's process group, as ``dvc queue kill`` does). Returns the names interrupted."""
    import psutil
    from dvc.repo import Repo

    with Repo(str(project)) as repo:
        queue = repo.experiments.celery_queue
        queue.celery.control.shutdown()  # workers end after their current task; queued ones wait
        running = {entry: entry.name or entry.stash_rev[:7] for entry in queue.iter_active()}
        executors = []
        for entry in running:
            with contextlib.suppress(KeyError, psutil.Error):
                executors.append(psutil.Process(queue.proc[entry.stash_rev].pid))
        if running:
            queue.kill(list(running.values()))
    # Each stage finishes its step and saves its checkpoint: the stop is done when they have ended.
    _, alive = psutil.wait_procs(executors, timeout=STOP_WAIT_S)
    for proc in alive:
        print(f"lehr queue: pid {proc.pid} still runs {STOP_WAIT_S} s after the stop", file=sys.stderr)
    for name in running.values():
        print(
            f"lehr queue: interrupted {name}: its checkpoints are kept in the project's run folders; "
            "queue the same experiment again (same -S values) and it resumes from them",
            file=sys.stderr,
        )
    if not running:
        print("lehr queue: no experiment was running", file=sys.stderr)
    return list(running.values())


def shares_table() -> str:
    """Who holds which share of this machine now (``lehr shares``)."""
    held = shares.holders(shares.this_machine(_has_cuda()))
    if not held:
        return f"no lehr run holds a share of this machine ({shares.folder()})"
    by_pid: dict = {}
    for device, who in held.items():
        by_pid.setdefault((who.get("pid"), who.get("purpose"), who.get("cmd")), []).append(device)
    lines = [f"{'pid':>8s}  {'devices':24s} purpose / command"]
    for (pid, purpose, cmd), devices in sorted(by_pid.items(), key=lambda kv: str(kv[0][0])):
        lines.append(f"{pid!s:>8s}  {','.join(devices):24s} {purpose}: {cmd}")
    return "\n".join(lines)


def _has_cuda() -> bool:
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return True
    import torch

    return torch.cuda.is_available()
