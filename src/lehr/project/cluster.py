"""A sweep of experiments on a SLURM cluster: ``python -m lehr cluster submit`` sends each of its
experiments (every combination of its ``-S`` values) as one task of a job array, through submitit,
and ``python -m lehr cluster gather`` brings them back, so that ``dvc exp show`` and ``lehr
experiments`` compare them on the machine that submitted them (docs/team.md).

DVC runs nothing remotely, so each task is a team member of its own: it clones the submitted commit
from the git remote into its own folder on shared storage, takes the outputs the commit records from
the DVC cache or remote, runs ``lehr exp`` there (its stages claim their share of the node through
the allocator, as on one machine), and pushes the experiment to the git and DVC remotes. A task
that SLURM requeues (``scontrol requeue``, preemption, or submitit's requeue before the time limit)
starts again in the same clone, and its training stage resumes from the checkpoint in its run
folder. Each task leaves one record (``records/<name>.json``) that the gatherer reads.
"""

from __future__ import annotations

import getpass
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
from lehr.project.experiments import taken_elsewhere

SWEEP_FILE = "sweep.json"
DVC = (sys.executable, "-m", "dvc")  # this environment's, on a node with no virtualenv on its PATH
TASK_MARK = "lehr-task"  # in a task clone's .git: the clone is whole
POLL_S = 5.0


class ClusterError(Explained, RuntimeError):
    """SLURM or a remote answered with an error: the message names the command and its answer."""


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
    experiments: dict[str, list[str]]  # name -> its -S values (a rung: its DVC stage), one task each
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
            return json.loads((Path(self.folder) / "records" / f"{name}.json").read_text())
        except FileNotFoundError:
            return None


# -- on the submitting machine -------------------------------------------------------------------
def plan(project: Path, env: str, sets: list[str], prefix: str) -> dict[str, list[str]]:
    """Every experiment of a sweep (DVC's own expansion of ``-S`` sweeps, ``key=1,2``), named
    ``<prefix>-<i>``, each as the ``-S`` values of one ``lehr exp``. Values a stage would refuse are
    refused here, before anything is queued."""
    from dvc.utils.cli_parse import to_path_overrides
    from dvc.utils.hydra import get_hydra_sweeps

    from lehr.project.experiments import check_sets

    problems = check_sets(project, env, sets)
    if problems:
        raise ValueError("\n".join(problems))
    combos = get_hydra_sweeps(to_path_overrides(sets)) if sets else [{}]
    width = len(str(len(combos)))
    return {
        f"{prefix}-{i + 1:0{width}d}": [f"{path}:{o}" for path, overrides in combo.items() for o in overrides]
        for i, combo in enumerate(combos)
    }


def plan_ladder(project: Path, env: str, rungs: str) -> dict[str, list[str]]:
    """The ladder's rungs (``all``, or sizes such as ``1,3``), each as the DVC stage one task runs:
    ``rung-<depth>`` -> ``[ladder/dvc.yaml:ladder_rung@<depth>]``. The ladder's params are checked
    as ``lehr check`` does, so that a refused ladder refuses here, before anything is queued."""
    import yaml

    from lehr.project.experiments import problems_of

    problems = problems_of(project, env)
    if problems:
        raise ValueError("\n".join(problems))
    sizes = yaml.safe_load((project / "conf/base/parameters_ladder.yml").read_text())["ladder"]["sizes"]
    wanted = sizes if rungs == "all" else [int(r) for r in rungs.split(",")]
    unknown = sorted(set(wanted) - set(sizes))
    if unknown:
        raise ValueError(
            f"--ladder {rungs}: no rung of size {', '.join(map(str, unknown))}; the ladder's sizes are "
            f"{sizes} (ladder.sizes in conf/base/parameters_ladder.yml)"
        )
    return {f"rung-{d}": [f"ladder/dvc.yaml:ladder_rung@{d}"] for d in wanted}


def refuse_unsubmittable(project: Path, git_remote: str) -> tuple[str, str, str, str]:
    """The commit, the git remote's URL, the DVC remote's URL and the DVC cache, or a ValueError
    naming what keeps the sweep from running elsewhere exactly as it would here."""
    dirty = _git(project, "status", "--porcelain", "--untracked-files=normal").splitlines()
    if dirty:
        paths = ", ".join(line[3:] for line in dirty[:8]) + (" ..." if len(dirty) > 8 else "")
        raise ValueError(
            f"the working tree has changes that no commit holds ({paths}): a task runs a commit, "
            "so commit them (or stash them) and push the commit first"
        )
    commit = _git(project, "rev-parse", "HEAD").strip()
    try:
        git_url = _git(project, "remote", "get-url", git_remote).strip()
    except ClusterError:
        raise ValueError(
            f"no git remote {git_remote!r}: the tasks clone the commit from it "
            f"(`git remote add {git_remote} URL`, or --git-remote NAME)"
        ) from None
    _git(project, "fetch", "--quiet", git_remote)
    if not _git(project, "branch", "--remotes", "--contains", commit, "--list", f"{git_remote}/*").strip():
        raise ValueError(
            f"commit {commit[:10]} is not on {git_remote} ({git_url}): the tasks clone it from there; "
            f"push it first (git push {git_remote} HEAD)"
        )
    dvc_url = default_dvc_remote(project)
    cache = _dvc(project, "cache", "dir").strip()
    return commit, _absolute_url(project, git_url), dvc_url, cache


def default_dvc_remote(project: Path) -> str:
    """The default DVC remote's URL as every clone would resolve it (a local path made absolute:
    DVC reads one relative to the config file's folder, .dvc/)."""
    name = subprocess.run([*DVC, "config", "core.remote"], cwd=project, capture_output=True, text=True)
    if name.returncode != 0 or not name.stdout.strip():
        raise ValueError(
            "no default DVC remote: the tasks push their outputs to it and gather pulls them from it. "
            "Add one with `dvc remote add -d NAME URL` (docs/team.md)"
        )
    url = _dvc(project, "config", f"remote.{name.stdout.strip()}.url").strip()
    return _absolute_url(project / ".dvc", url)


def submit(
    project: Path,
    sweep: Sweep,
    *,
    partition: str | None,
    account: str | None,
    time_min: int,
    gpus_per_task: int,
    cpus_per_task: int,
    at_once: int,
) -> tuple[Sweep, list]:
    """Every experiment of ``sweep`` as one task of a job array, at most ``at_once`` running; the
    sweep as submitted (its job id) and submitit's jobs."""
    folder = Path(sweep.folder)
    (folder / "records").mkdir(parents=True, exist_ok=True)
    executor = submitit.AutoExecutor(folder=folder / "logs", cluster=sweep.executor)
    params: dict = {"timeout_min": time_min, "cpus_per_task": cpus_per_task, "name": f"lehr-{sweep.id}"}
    if sweep.executor == "slurm":
        params |= {
            "slurm_array_parallelism": at_once,
            "slurm_additional_parameters": {"requeue": True},  # a preempted task comes back
            **({"slurm_partition": partition} if partition else {}),
            **({"slurm_account": account} if account else {}),
            **({"slurm_gpus_per_task": gpus_per_task} if gpus_per_task else {}),
        }
    executor.update_parameters(**params)
    sweep.write()  # the tasks read it: before the first can start
    try:
        names = list(sweep.experiments)
        jobs = executor.map_array(SweepTask(), [str(folder)] * len(names), names)
    except subprocess.CalledProcessError as e:  # sbatch said no: a partition, account or limit
        said = (e.output.decode() if isinstance(e.output, bytes) else str(e.output or "")).strip()
        raise ClusterError(f"sbatch refused the sweep: {said or e}") from None
    ids = [job.job_id for job in jobs]
    submitted = Sweep(**{**asdict(sweep), "job_id": ids[0].split("_")[0], "task_ids": ids})
    submitted.write()
    return submitted, jobs


def wait(sweep: Sweep, jobs: list | None = None, say=print) -> dict[str, dict]:
    """Each task's record, once every task has one or has left the queue without one (said so)."""
    folder = Path(sweep.folder)
    said: dict[str, str] = {}
    while True:
        live = _live_tasks(sweep, jobs)
        records: dict[str, dict] = {}
        for i, name in enumerate(sweep.experiments):
            record = sweep.record(name)
            if record is None and i not in live:
                record = {
                    "name": name,
                    "state": "lost",
                    "error": f"the task ended without a record: see its log in {folder / 'logs'}",
                }
            state = record["state"] if record else live[i]
            if said.get(name) != state:
                say(f"{name}: {state}" + (f" ({record['error']})" if record and record.get("error") else ""))
                said[name] = state
            if record is not None:
                records[name] = record
        if len(records) == len(sweep.experiments):
            return records
        time.sleep(POLL_S)


def _live_tasks(sweep: Sweep, jobs: list | None) -> dict[int, str]:
    """Task index -> its state, for the tasks still queued or running."""
    if jobs is not None:  # this process submitted them (the local executor always waits here)
        return {i: job.state.lower() for i, job in enumerate(jobs) if not job.done()}
    out = subprocess.run(
        ["squeue", "--noheader", "--array", "--jobs", sweep.job_id, "--format", "%i %T"],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        if "Invalid job id" in out.stderr:  # SLURM has forgotten the job: none is live
            return {}
        raise ClusterError(f"squeue --jobs {sweep.job_id} failed: {out.stderr.strip()}")
    states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
    return {i: states[task].lower() for i, task in enumerate(sweep.task_ids) if task in states}


def gather(project: Path, sweep: Sweep, records: dict[str, dict], say=print) -> list[str]:
    """Every finished experiment of the sweep into this project (``dvc exp pull``): its commit and,
    from the DVC remote, its outputs. Returns the names brought back."""
    done = [name for name, r in records.items() if r["state"] == "done"]
    if sweep.ladder:
        return _gather_rungs(project, sweep, done, say)
    for name in done:
        # DVC says "No experiments to pull." even as it brings one: the ref tells.
        pulled = subprocess.run(
            [*DVC, "exp", "pull", "--force", sweep.git_remote, name],
            cwd=project,
            capture_output=True,
            text=True,
        )
        if pulled.returncode != 0 or not _has_experiment(project, sweep.commit, name):
            said = (pulled.stderr or pulled.stdout).strip()
            raise ClusterError(f"dvc exp pull {sweep.git_remote} {name} brought nothing: {said}")
        say(f"{name}: pulled ({records[name]['host']}, {records[name]['seconds']:.0f} s)")
    return done


def _gather_rungs(project: Path, sweep: Sweep, done: list[str], say) -> list[str]:
    """Each finished rung into this workspace and ladder/dvc.lock, restored from DVC's run cache (the
    task's rung is the same stage, deps and params, so DVC finds its output by their hashes), not
    trained again. Its run cache comes from the DVC remote (--pull) unless the cache is shared."""
    for name in done:
        (target,) = sweep.experiments[name]
        out = _dvc(project, "repro", "--pull", "--single-item", target)
        if "is cached" not in out:
            raise ClusterError(f"{target} was not in DVC's run cache, and ran here: {out.strip()[-300:]}")
        say(f"{name}: restored from the run cache ({target})")
    say("`make ladder` (dvc repro ladder/dvc.yaml) fits the ladder; a rung not here trains first")
    return done


def submit_sweep(
    project: Path,
    env: str,
    sets: list[str],
    *,
    name: str | None,
    folder: Path,
    git_remote: str,
    local: bool,
    wait_for_it: bool,
    ladder: str | None = None,
    **slurm,
) -> int:
    """``python -m lehr cluster submit``: plan, refuse what cannot run elsewhere, submit, and (unless
    told not to wait) gather."""
    if local and not wait_for_it:
        raise ValueError(
            "--local runs the tasks as children of this command: it waits for them (drop --no-wait)"
        )
    id_ = name or sweep_id()
    if ladder and sets:
        raise ValueError(
            "--ladder runs the ladder's rungs as committed: -S values belong to a sweep of experiments"
        )
    experiments = plan_ladder(project, env, ladder) if ladder else plan(project, env, sets, id_)
    commit, git_url, dvc_url, cache = refuse_unsubmittable(project, git_remote)
    taken = [] if ladder else [line for exp in experiments for line in taken_elsewhere(project, exp)]
    if taken:
        raise ValueError("\n".join(taken))
    where = (folder / id_).resolve()
    if where.exists():
        raise ValueError(f"{where} exists: a sweep of that name was submitted; choose another --name")
    sweep = Sweep(
        id=id_,
        folder=str(where),
        commit=commit,
        git_remote=git_remote,
        git_url=git_url,
        dvc_remote_url=dvc_url,
        cache_dir=cache,
        experiments=experiments,
        executor="local" if local else "slurm",
        ladder=bool(ladder),
        cpus_per_task=slurm["cpus_per_task"],
        env={k: v for k, v in os.environ.items() if k.startswith("LEHR_")},
    )
    sweep, jobs = submit(project, sweep, **slurm)
    print(
        f"sweep {id_}: {len(experiments)} {'rung(s)' if ladder else 'experiment(s)'} of {commit[:10]} as "
        f"{'local jobs' if local else f'SLURM job {sweep.job_id}'}; folder {where}"
    )
    for exp, values in experiments.items():
        print(f"  {exp}: {' '.join(values) or '(the commit as it is)'}")
    if not wait_for_it:
        print(f"gather them when they end: python -m lehr cluster gather {where}")
        return 0
    return _gathered(project, sweep, wait(sweep, jobs if local else None))


def gather_later(project: Path, folder: Path) -> int:
    """``python -m lehr cluster gather FOLDER``: wait for the sweep's tasks, then pull them here."""
    sweep = Sweep.read(folder)
    return _gathered(project, sweep, wait(sweep))


def _gathered(project: Path, sweep: Sweep, records: dict[str, dict]) -> int:
    done = gather(project, sweep, records)
    failed = [f"{n} ({r['state']}: {r.get('error')})" for n, r in records.items() if r["state"] != "done"]
    what = "rung(s)" if sweep.ladder else "experiment(s)"
    then = "`make ladder` fits them" if sweep.ladder else "`python -m lehr experiments` compares them"
    print(f"{len(done)} of {len(records)} {what} here: {then}")
    if failed:
        print(f"lehr: error: not gathered: {'; '.join(failed)}", file=sys.stderr)
        return 1
    return 0


# -- on a node: one task --------------------------------------------------------------------------
class SweepTask(submitit.helpers.Checkpointable):
    """One experiment of a sweep. Checkpointable: when SLURM's time limit nears, submitit requeues
    the task (its default ``checkpoint``), and the requeued task resumes in the same clone."""

    def __call__(self, folder: str, name: str) -> dict | None:
        _note_stop_signals()
        sweep = Sweep.read(Path(folder))
        started = time.time()
        clone = Path(folder) / "clones" / name
        log = _say_to(Path(folder) / "logs" / f"{name}.txt")
        try:
            _clone(sweep, clone, log)
            if sweep.ladder:
                record = _rung(sweep, clone, name, log)
            else:
                record = _experiment(sweep, clone, name, log)
        except StoppedBySignal as e:
            # SLURM's requeue or scancel: the stage saved its checkpoint. No record, so the gatherer
            # waits for the requeued try (or, cancelled, reports the task gone).
            log(str(e))
            return None
        except (TaskFailed, ClusterError) as e:
            record = {"name": name, "state": "failed", "error": str(e)}
        record |= {"host": socket.gethostname(), "seconds": round(time.time() - started, 1)}
        write_text_atomic(Path(folder) / "records" / f"{name}.json", json.dumps(record) + "\n")
        log(f"{record['state']}: {record.get('error') or record.get('experiment')}")
        return record


STOPS_RECEIVED: list[int] = []  # SIGTERM/SIGINT this task received: SLURM requeues or cancels it


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
    """A step ended by SIGTERM or SIGINT, as SLURM stops a job it requeues or cancels."""


def _experiment(sweep: Sweep, clone: Path, name: str, log) -> dict:
    """``lehr exp`` of the experiment in the task's clone (a requeued try resumes the training the
    last one checkpointed: its run folder is in the clone), pushed to the git and DVC remotes."""
    if not _has_experiment(clone, sweep.commit, name):
        cmd = [sys.executable, "-m", "lehr", "exp", "-n", name]
        for value in sweep.experiments[name]:
            cmd += ["-S", value]
        log(f"{' '.join(cmd)} (SLURM restart {os.environ.get('SLURM_RESTART_COUNT', '0')})")
        _step(cmd, clone, _stage_env(sweep), capture=False)
    pushed = _step([*DVC, "exp", "push", "origin", name], clone)
    if "diverged" in pushed:  # DVC pushes nothing then, and exits 0
        raise TaskFailed(f"the git remote holds another experiment named {name}: {pushed.strip()}")
    sha = _git(clone, "rev-parse", f"refs/exps/{sweep.commit[:2]}/{sweep.commit[2:]}/{name}").strip()
    return {"name": name, "state": "done", "experiment": sha}


def _rung(sweep: Sweep, clone: Path, name: str, log) -> dict:
    """The rung's DVC stage in the task's clone (a requeued try resumes from the rung's rolling
    checkpoints there), its output and run-cache entry pushed to the DVC remote."""
    (target,) = sweep.experiments[name]
    log(f"dvc repro {target} (SLURM restart {os.environ.get('SLURM_RESTART_COUNT', '0')})")
    _step([*DVC, "repro", target], clone, _stage_env(sweep), capture=False)
    _step([*DVC, "push", "--run-cache", target], clone)
    return {"name": name, "state": "done", "experiment": target}


def _stage_env(sweep: Sweep) -> dict[str, str]:
    """The environment of a task's stages: the sweep's LEHR_* settings, the task's share of the
    node, and this environment's commands (kedro, which dvc.yaml's stages call) on the PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, **sweep.env, **_share_env(sweep), "PATH": path}


def _clone(sweep: Sweep, clone: Path, log) -> None:
    """The task's own clone of the sweep's commit, made whole or not at all (a requeued task finds
    it whole, or makes it again), with the DVC cache and remote the sweep uses."""
    if (clone / ".git" / TASK_MARK).is_file():
        return
    partial = clone.with_name(clone.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # this task's own unfinished clone, from a killed try
    partial.parent.mkdir(parents=True, exist_ok=True)
    _step(["git", "clone", "--quiet", "--no-checkout", sweep.git_url, str(partial)], partial.parent)
    _step(["git", "checkout", "--quiet", "--detach", sweep.commit], partial)
    # The submitting project's cache, on shared storage: the shards are linked, not copied per task.
    _step([*DVC, "cache", "dir", "--local", sweep.cache_dir], partial)
    _step([*DVC, "config", "--local", "cache.type", "reflink,hardlink,copy"], partial)
    _step([*DVC, "remote", "add", "--local", "--force", "--default", "sweep", sweep.dvc_remote_url], partial)
    (partial / ".git" / TASK_MARK).write_text(f"{sweep.id}\n")
    partial.rename(clone)
    # What the commit's dvc.lock records: from the shared cache, else the remote. An output on
    # neither is made again by its stage.
    pulled = subprocess.run([*DVC, "pull", "--quiet", "dvc.yaml"], cwd=clone, capture_output=True, text=True)
    if pulled.returncode != 0:
        log("dvc pull: not every output is in the cache or remote; the stages that made them run again")


def _has_experiment(clone: Path, commit: str, name: str) -> bool:
    ref = f"refs/exps/{commit[:2]}/{commit[2:]}/{name}"
    return subprocess.run(["git", "show-ref", "--quiet", ref], cwd=clone).returncode == 0


def _share_env(sweep: Sweep) -> dict[str, str]:
    """The task's share for the allocator: where SLURM gave it fewer cores than the node shows (no
    binding), it declares how many tasks the node holds, so each claims its part."""
    given = int(os.environ.get("SLURM_CPUS_PER_TASK") or sweep.cpus_per_task or 0)
    visible = len(os.sched_getaffinity(0))
    if given and visible > given and "LEHR_JOBS" not in sweep.env:
        return {"LEHR_JOBS": str(visible // given)}
    return {}


def _step(cmd: list[str], cwd: Path, env: dict | None = None, capture: bool = True) -> str:
    """Run one step of a task; its output goes to the task's SLURM log (and is returned when
    captured). A failure raises TaskFailed; a step that ends after the task got SIGTERM or SIGINT
    raises StoppedBySignal."""
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=capture, text=True)
    said = (done.stdout or "") + (done.stderr or "")
    if capture:
        print(said, end="", flush=True)
    if done.returncode != 0 and STOPS_RECEIVED:
        raise StoppedBySignal(
            f"{' '.join(cmd[:6])} stopped by a signal (SLURM's requeue or scancel): no record; "
            "a requeued try goes on from the checkpoint"
        )
    if done.returncode != 0:
        raise TaskFailed(f"{' '.join(cmd)} exited {done.returncode} in {cwd}: {said.strip()[-300:]}")
    return said


def _say_to(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)

    def say(line: str) -> None:
        with path.open("a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {line}\n")
        print(f"lehr cluster: {line}", flush=True)

    return say


def _git(project: Path, *args: str) -> str:
    return _answer(["git", *args], project)


def _dvc(project: Path, *args: str) -> str:
    return _answer([*DVC, *args], project)


def _answer(cmd: list[str], cwd: Path) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).split())[-500:]
        raise ClusterError(
            f"{' '.join(cmd[2:] if cmd[0] == sys.executable else cmd)} (in {cwd}) failed: {said}"
        )
    return done.stdout


def _absolute_url(base: Path, url: str) -> str:
    if "://" in url or url.startswith("/") or ":" in url.split("/")[0]:
        return url  # a URL, an absolute path, or git's host:path
    return str((base / url).resolve())


def sweep_id() -> str:
    return f"{getpass.getuser()}-{time.strftime('%Y%m%d-%H%M%S')}"
