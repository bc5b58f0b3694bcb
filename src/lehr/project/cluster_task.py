"""One task of a sweep on a SLURM node (``python -m lehr cluster``, lehr.project.cluster submits it),
and the sweep's record that the submitting machine and every task share.

DVC runs nothing remotely, so each task is a team member of its own: it clones the submitted commit
from the git remote into its own folder on shared storage, takes the outputs the commit records from
the shared DVC cache or the remote, runs ``lehr exp`` there (or, for the ladder, a rung's stage;
its stages claim their share of the node through the allocator, as on one machine), and pushes the
result to the git and DVC remotes. It leaves one record, ``records/<name>.json``.

A task that SLURM stops to requeue it (``scontrol requeue``, preemption) or that submitit requeues
before the time limit writes no record: its training stage saved a checkpoint on the signal, and the
requeued task starts again in the same clone and resumes from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import submitit

from lehr.errors import Explained
from lehr.files.atomic import write_text_atomic
from lehr.project.experiment_refs import experiment_ref

SWEEP_FILE = "sweep.json"
DVC = (sys.executable, "-m", "dvc")  # this environment's, on a node with no virtualenv on its PATH
TASK_MARK = "lehr-task"  # in a task clone's .git: the clone is whole
STOP_GRACE_S = 75  # submitit signals 90 s before the time limit: the step saves and ends within it


class ClusterError(Explained, RuntimeError):
    """A command of the sweep's (git, DVC, SLURM's) failed: the message names it and its answer."""


@dataclass(frozen=True)
class Sweep:
    """What every task of a sweep needs, written once at submission beside the tasks' folders."""

    id: str
    folder: str  # on shared storage: clones/, records/, logs/
    commit: str  # every task runs this commit, as the git remote has it
    git_remote: str  # its name in the submitting project (for gather) ...
    git_url: str  # ... and where the tasks clone it from
    dvc_remote_url: str  # where tasks push their outputs (the project's default DVC remote)
    cache_dir: str  # the submitting project's DVC cache: tasks on shared storage share it
    tasks: dict[str, list[str]]  # name -> an experiment's -S values, or a rung's DVC stage
    executor: str  # "slurm", or "local" (submitit runs the same tasks on this machine)
    ladder: bool = False  # the tasks are the ladder's rungs, not experiments
    job_id: str = ""  # SLURM's: the array's (a sweep of one is a plain job)
    task_ids: list[str] = field(default_factory=list)  # each task's, in task order: 12_0, 12_1 (or 12)
    cpus_per_task: int = 0
    env: dict[str, str] = field(default_factory=dict)  # LEHR_* settings the tasks run with

    @classmethod
    def read(cls, folder: Path) -> Sweep:
        try:
            return cls(**json.loads((folder / SWEEP_FILE).read_text()))
        except FileNotFoundError:
            raise ValueError(
                f"{folder} holds no sweep ({SWEEP_FILE} is missing): name the folder that "
                "`python -m lehr cluster submit` printed"
            ) from None

    def write(self) -> None:
        write_text_atomic(Path(self.folder) / SWEEP_FILE, json.dumps(asdict(self), indent=1) + "\n")

    def record(self, name: str) -> dict | None:
        try:
            return json.loads(self._record_path(name).read_text())
        except FileNotFoundError:
            return None

    def write_record(self, record: dict) -> None:
        write_text_atomic(self._record_path(record["name"]), json.dumps(record) + "\n")

    def _record_path(self, name: str) -> Path:
        return Path(self.folder) / "records" / f"{name}.json"


class SweepTask(submitit.helpers.Checkpointable):
    """One task of a sweep. Checkpointable: on submitit's signal before the time limit (or a
    preemption), ``checkpoint`` lets the running step save and end, and submitit requeues the task."""

    def __call__(self, folder: str, name: str) -> dict | None:
        _note_stop_signals()
        sweep = Sweep.read(Path(folder))
        started = time.time()
        clone = Path(folder) / "clones" / name
        log = _say_to(Path(folder) / "logs" / f"{name}.txt")
        TASK_LOG[:] = [log]
        log(f"on {socket.gethostname()}, SLURM restart {os.environ.get('SLURM_RESTART_COUNT', '0')}")
        try:
            _clone(sweep, clone, log)
            record = (_rung if sweep.ladder else _experiment)(sweep, clone, name, log)
        except StoppedBySignal as e:
            # SLURM's requeue or scancel: the stage saved its checkpoint. No record, so the gatherer
            # waits for the requeued try (or, cancelled, reports the task gone).
            log(str(e))
            return None
        except (TaskFailed, ClusterError) as e:
            record = {"name": name, "state": "failed", "error": str(e)}
        record |= {"host": socket.gethostname(), "seconds": round(time.time() - started, 1)}
        sweep.write_record(record)
        log(f"{record['state']}: {record.get('error') or record.get('result')}")
        return record

    def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
        """The step running now stops as on SLURM's SIGTERM (the stage saves a checkpoint, ``lehr
        exp`` puts the clone's workspace back), then submitit requeues this same task."""
        STOPS_RECEIVED.append(signal.SIGUSR2)
        for say in TASK_LOG:
            say("submitit's signal (the time limit nears, or a preemption): the step saves, stops, requeues")
        for child in RUNNING:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGTERM)
            _wait_for_exit(child.pid, STOP_GRACE_S)
        return super().checkpoint(*args, **kwargs)


STOPS_RECEIVED: list[int] = []  # the stop signals this task got: SLURM requeues or cancels it
RUNNING: list[subprocess.Popen] = []  # the step running now, for checkpoint() to stop
TASK_LOG: list = []  # the task's log, for checkpoint() to write to


def _note_stop_signals() -> None:
    """Note a stop signal before submitit's handler sees it (it logs and ignores SIGTERM): SLURM
    sends it to every process of the job at once, so a step that then fails was stopped, not wrong."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)

        def note(signum, frame, previous=previous):
            STOPS_RECEIVED.append(signum)
            if callable(previous):
                previous(signum, frame)

        signal.signal(sig, note)


class TaskFailed(Exception):
    """A step of a task failed: the task's record says which, and its log why."""


class StoppedBySignal(Exception):
    """A step ended after the task got a stop signal, as SLURM stops a job it requeues or cancels."""


def _experiment(sweep: Sweep, clone: Path, name: str, log) -> dict:
    """``lehr exp`` of the experiment in the task's clone (a requeued try resumes the training the
    last one checkpointed: its run folder is in the clone), pushed to the git and DVC remotes."""
    ref = experiment_ref(sweep.commit, name)
    if not _has_ref(clone, ref):
        cmd = [sys.executable, "-m", "lehr", "exp", "-n", name]
        for value in sweep.tasks[name]:
            cmd += ["-S", value]
        log(" ".join(cmd))
        _step(cmd, clone, _stage_env(sweep), capture=False)
    pushed = _step([*DVC, "exp", "push", "origin", name], clone)
    if "diverged" in pushed:  # DVC pushes nothing then, and exits 0 (tests/project/test_team.py pins it)
        raise TaskFailed(f"the git remote holds another experiment named {name}: {pushed.strip()}")
    return {"name": name, "state": "done", "result": git(clone, "rev-parse", ref).strip()}


def _rung(sweep: Sweep, clone: Path, name: str, log) -> dict:
    """The rung's DVC stage in the task's clone (a requeued try resumes from the rung's rolling
    checkpoints there), its output and run-cache entry pushed to the DVC remote."""
    (target,) = sweep.tasks[name]
    log(f"dvc repro {target}")
    _step([*DVC, "repro", target], clone, _stage_env(sweep), capture=False)
    _step([*DVC, "push", "--run-cache", target], clone)
    return {"name": name, "state": "done", "result": target}


def _stage_env(sweep: Sweep) -> dict[str, str]:
    """The environment of a task's stages: the sweep's LEHR_* settings, the task's share of the
    node, and this environment's commands (kedro, which dvc.yaml's stages call) on the PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, **sweep.env, **share_env(sweep), "PATH": path}


def _clone(sweep: Sweep, clone: Path, log) -> None:
    """The task's own clone of the sweep's commit, made whole or not at all (a requeued task finds
    it whole, or makes it again), with the DVC cache and remote the sweep uses, and the outputs its
    dvc.lock records."""
    if not (clone / ".git" / TASK_MARK).is_file():
        partial = clone.with_name(clone.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)  # this task's own unfinished clone, from a killed try
        partial.parent.mkdir(parents=True, exist_ok=True)
        _step(["git", "clone", "--quiet", "--no-checkout", sweep.git_url, str(partial)], partial.parent)
        _step(["git", "checkout", "--quiet", "--detach", sweep.commit], partial)
        # The submitting project's cache, on shared storage: the shards are linked, not copied per task.
        _step([*DVC, "cache", "dir", "--local", sweep.cache_dir], partial)
        _step([*DVC, "config", "--local", "cache.type", "reflink,hardlink,copy"], partial)
        # The remote as the submitter resolved it: its own may be a relative path, or in config.local.
        _step(
            [*DVC, "remote", "add", "--local", "--force", "--default", "sweep", sweep.dvc_remote_url], partial
        )
        (partial / ".git" / TASK_MARK).write_text(f"{sweep.id}\n")
        partial.rename(clone)
    # On every try (a no-op once everything is there): from the shared cache, else the remote. An
    # output on neither is made again by its stage.
    pulled = subprocess.run([*DVC, "pull", "--quiet", "dvc.yaml"], cwd=clone, capture_output=True, text=True)
    if pulled.returncode != 0:
        why = (pulled.stderr or pulled.stdout).strip().splitlines()[-1:] or ["no answer"]
        log(f"dvc pull: not every output is in the cache or remote ({why[0]}): their stages run again")


def _has_ref(clone: Path, ref: str) -> bool:
    return subprocess.run(["git", "show-ref", "--quiet", ref], cwd=clone).returncode == 0


def share_env(sweep: Sweep) -> dict[str, str]:
    """The task's share for the allocator: where SLURM gave it fewer cores than the node shows (no
    binding), it declares how many tasks the node holds, so each claims its part."""
    given = int(os.environ.get("SLURM_CPUS_PER_TASK") or sweep.cpus_per_task or 0)
    visible = len(os.sched_getaffinity(0))
    if given and visible > given and "LEHR_JOBS" not in sweep.env:
        return {"LEHR_JOBS": str(visible // given)}
    return {}


def _step(cmd: list[str], cwd: Path, env: dict | None = None, capture: bool = True) -> str:
    """Run one step of a task in a process group of its own, deaf to submitit's USR2 (the default
    action of which is to die, checkpoint or not); its output goes to the task's SLURM log and is
    returned when captured. A failure raises TaskFailed; a step that ends after the task got a stop
    signal raises StoppedBySignal."""
    pipe = subprocess.PIPE if capture else None
    with subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=pipe,
        stderr=subprocess.STDOUT if capture else None,
        text=True,
        start_new_session=True,
        preexec_fn=_deaf_to_usr2,
    ) as child:
        RUNNING[:] = [child]
        said, _ = child.communicate()
    RUNNING.clear()
    said = said or ""
    if capture:
        print(said, end="", flush=True)
    if child.returncode != 0 and STOPS_RECEIVED:
        raise StoppedBySignal(
            f"{' '.join(cmd[:6])} stopped by {signal.Signals(STOPS_RECEIVED[0]).name} (SLURM's requeue "
            "or scancel, or submitit's before the time limit): no record; a requeued try resumes from its "
            "checkpoint"
        )
    if child.returncode != 0:
        raise TaskFailed(f"{' '.join(cmd)} exited {child.returncode} in {cwd}: {said.strip()[-300:]}")
    return said


def _deaf_to_usr2() -> None:
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # an ignored signal stays ignored across exec


def _wait_for_exit(pid: int, timeout: float) -> None:
    """Until ``pid`` has exited, without reaping it (the step's own ``communicate`` does, once the
    signal handler that calls this returns)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.2)


def _say_to(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)

    def say(line: str) -> None:
        with path.open("a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {line}\n")
        print(f"lehr cluster: {line}", flush=True)

    return say


def git(project: Path, *args: str) -> str:
    return answer(["git", *args], project)


def dvc(project: Path, *args: str) -> str:
    return answer([*DVC, *args], project)


def answer(cmd: list[str], cwd: Path, **kwargs) -> str:
    """``cmd``'s output, or a ClusterError naming the command and its answer."""
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, **kwargs)
    except FileNotFoundError:
        raise ClusterError(f"{cmd[0]} is not on this machine's PATH") from None
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).split())[-500:]
        raise ClusterError(
            f"{' '.join(cmd[2:] if cmd[0] == sys.executable else cmd)} (in {cwd}) failed: {said}"
        )
    return done.stdout
