"""A sweep on a SLURM cluster: ``python -m lehr cluster submit`` sends each of its experiments (every
combination of its ``-S`` values), or each of the ladder's rungs, as one task of a job array through
submitit, and ``python -m lehr cluster gather`` brings them back, so that ``dvc exp show`` and ``lehr
experiments`` compare them on the machine that submitted them (docs/team.md). What a task does on
its node is lehr.project.cluster_task's.
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from urllib.parse import urlparse

import submitit

from lehr.project.cluster_task import DVC, ClusterError, Sweep, SweepTask, dvc, git
from lehr.project.experiment_refs import experiment_ref
from lehr.project.experiments import taken_elsewhere

POLL_S = 5.0
LOST_AFTER = 3  # polls a task may be out of SLURM's queue with no record yet (a shared filesystem lags)
SQUEUE_TRIES = 4  # a busy slurmctld times out now and then: hours of waiting should not end on one


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

    from lehr.params.check import problems_of

    if not (project / "ladder/dvc.yaml").is_file():
        raise ValueError(
            f"{project} has no ladder stages (ladder/dvc.yaml): a sandbox has them when made with --ladder"
        )
    problems = problems_of(project, env)
    if problems:
        raise ValueError("\n".join(problems))
    sizes = yaml.safe_load((project / "conf/base/parameters_ladder.yml").read_text())["ladder"]["sizes"]
    try:
        wanted = sizes if rungs == "all" else [int(r) for r in rungs.split(",")]
    except ValueError:
        raise ValueError(f"--ladder {rungs}: give all, or sizes separated by commas, e.g. 1,3") from None
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
    dirty = git(project, "status", "--porcelain", "--untracked-files=normal").splitlines()
    if dirty:
        paths = ", ".join(line[3:] for line in dirty[:8]) + (" ..." if len(dirty) > 8 else "")
        raise ValueError(
            f"the working tree has changes that no commit holds ({paths}): a task runs a commit, "
            "so commit them (or stash them) and push the commit first"
        )
    commit = git(project, "rev-parse", "HEAD").strip()
    try:
        git_url = git(project, "remote", "get-url", git_remote).strip()
    except ClusterError:
        raise ValueError(
            f"no git remote {git_remote!r}: the tasks clone the commit from it "
            f"(`git remote add {git_remote} URL`, or --git-remote NAME)"
        ) from None
    git(project, "fetch", "--quiet", git_remote)
    if not git(project, "branch", "--remotes", "--contains", commit, "--list", f"{git_remote}/*").strip():
        raise ValueError(
            f"commit {commit[:10]} is not on {git_remote} ({git_url}): the tasks clone it from there; "
            f"push it first (git push {git_remote} HEAD)"
        )
    dvc_url = default_dvc_remote(project)
    cache = dvc(project, "cache", "dir").strip()
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
    url = dvc(project, "config", f"remote.{name.stdout.strip()}.url").strip()
    return _absolute_url(project / ".dvc", url)


def executor_for(
    sweep: Sweep,
    *,
    partition: str | None,
    account: str | None,
    time_min: int,
    gpus_per_task: int,
    cpus_per_task: int,
    at_once: int,
) -> submitit.AutoExecutor:
    """submitit's executor for the sweep's tasks: SLURM's options as sbatch takes them."""
    executor = submitit.AutoExecutor(folder=Path(sweep.folder) / "logs", cluster=sweep.executor)
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
    return executor


def submit(project: Path, sweep: Sweep, **slurm) -> tuple[Sweep, list]:
    """Every task of ``sweep`` as one task of a job array (``slurm``: executor_for's options); the
    sweep as submitted (its job id) and submitit's jobs."""
    folder = Path(sweep.folder)
    (folder / "records").mkdir(parents=True, exist_ok=True)
    executor = executor_for(sweep, **slurm)
    sweep.write()  # the tasks read it: before the first can start
    try:
        names = list(sweep.tasks)
        jobs = executor.map_array(SweepTask(), [str(folder)] * len(names), names)
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        shutil.rmtree(folder)  # this sweep's own folder, made above: nothing was submitted
        if isinstance(e, FileNotFoundError):
            raise ClusterError(
                "sbatch is not on this machine's PATH: submit from a machine of the cluster, or try "
                "the sweep here with --local"
            ) from None
        # sbatch printed its reason (a partition, account or limit) above.
        raise ClusterError(
            f"sbatch refused the sweep (its reason is above); nothing was submitted: {e}"
        ) from None
    ids = [job.job_id for job in jobs]
    submitted = Sweep(**{**asdict(sweep), "job_id": ids[0].split("_")[0], "task_ids": ids})
    submitted.write()
    return submitted, jobs


def wait(sweep: Sweep, jobs: list | None = None, say=print) -> dict[str, dict]:
    """Each task's record, once every task has one or has left the queue without one (said so)."""
    folder = Path(sweep.folder)
    said: dict[str, str] = {}
    absent: dict[str, int] = {}  # polls each task has been out of the queue without a record
    while True:
        live = _live_tasks(sweep, jobs)
        records: dict[str, dict] = {}
        for i, name in enumerate(sweep.tasks):
            record = sweep.record(name)
            absent[name] = absent.get(name, 0) + 1 if record is None and i not in live else 0
            if absent[name] >= LOST_AFTER:
                record = {
                    "name": name,
                    "state": "lost",
                    "error": f"the task ended without a record: see its log in {folder / 'logs'}",
                }
            state = record["state"] if record else live.get(i, "ending")
            if said.get(name) != state:
                say(f"{name}: {state}" + (f" ({record['error']})" if record and record.get("error") else ""))
                said[name] = state
            if record is not None:
                records[name] = record
        if len(records) == len(sweep.tasks):
            return records
        time.sleep(POLL_S)


def _live_tasks(sweep: Sweep, jobs: list | None) -> dict[int, str]:
    """Task index -> its state, for the tasks still queued or running."""
    if jobs is not None:  # this process submitted them (the local executor always waits here)
        return {i: job.state.lower() for i, job in enumerate(jobs) if not job.done()}
    if sweep.executor == "local":  # its tasks were children of the submit, which waited for them
        return {}
    cmd = ["squeue", "--noheader", "--array", "--jobs", sweep.job_id, "--format", "%i %T"]
    for attempt in range(SQUEUE_TRIES):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True)
        except FileNotFoundError:
            raise ClusterError(
                "squeue is not on this machine's PATH: gather on a machine of the cluster"
            ) from None
        if out.returncode == 0 or "Invalid job id" in out.stderr:
            break
        time.sleep(POLL_S * 2**attempt)
    else:
        raise ClusterError(f"squeue failed {SQUEUE_TRIES} times: {out.stderr.strip()}")
    if out.returncode != 0:  # SLURM has forgotten the job: none is live
        return {}
    states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
    return {i: states[task].lower() for i, task in enumerate(sweep.task_ids) if task in states}


def gather(project: Path, sweep: Sweep, records: dict[str, dict], say=print) -> dict[str, str]:
    """Every finished experiment of the sweep into this project (``dvc exp pull``): its commit and,
    from the DVC remote, its outputs. Returns why each task that is not here is not."""
    done = [name for name, r in records.items() if r["state"] == "done"]
    missing = {n: f"{r['state']}: {r.get('error')}" for n, r in records.items() if r["state"] != "done"}
    if sweep.ladder:
        return missing | _gather_rungs(project, sweep, done, say)
    for name in done:
        pulled = subprocess.run(
            [*DVC, "exp", "pull", "--force", sweep.git_remote, name],
            cwd=project,
            capture_output=True,
            text=True,
        )
        # DVC says "No experiments to pull." even as it brings one: the ref tells.
        if pulled.returncode != 0 or not _has_ref(project, experiment_ref(sweep.commit, name)):
            missing[name] = f"dvc exp pull {sweep.git_remote} {name} brought nothing: {pulled.stderr.strip()}"
            continue
        say(f"{name}: pulled ({records[name]['host']}, {records[name]['seconds']:.0f} s)")
    return missing


def _gather_rungs(project: Path, sweep: Sweep, done: list[str], say) -> dict[str, str]:
    """Each finished rung into this workspace and ladder/dvc.lock, restored from DVC's run cache (the
    task's rung is the same stage, code, params and data, so DVC finds its output by their hashes),
    not trained again. Its run cache comes from the DVC remote (--pull) unless the cache is shared.
    Only on the sweep's commit, unchanged: elsewhere the hashes differ, and DVC would train here."""
    head = git(project, "rev-parse", "HEAD").strip()
    if head != sweep.commit or git(project, "status", "--porcelain", "--untracked-files=no").strip():
        raise ValueError(
            f"the rungs were trained at commit {sweep.commit[:10]}, and this workspace is at {head[:10]}"
            f"{' with changes' if head == sweep.commit else ''}: gather them there (git checkout "
            f"{sweep.commit[:10]}, changes stashed), or DVC would train them here again"
        )
    missing = {}
    for name in done:
        (target,) = sweep.tasks[name]
        out = dvc(project, "repro", "--pull", "--single-item", target)
        # DVC's words: tests/project/test_cluster.py pins them
        if "is cached" in out or "didn't change" in out:
            how = "restored from the run cache" if "is cached" in out else "here already"
            say(f"{name}: {how} ({target})")
        else:
            missing[name] = f"{target} was not in DVC's run cache: it ran here instead ({out.strip()[-200:]})"
    say("`make ladder` (dvc repro ladder/dvc.yaml) fits the ladder; a rung not here trains first")
    return missing


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
    tasks = plan_ladder(project, env, ladder) if ladder else plan(project, env, sets, id_)
    commit, git_url, dvc_url, cache = refuse_unsubmittable(project, git_remote)
    taken = [] if ladder else taken_elsewhere(project, list(tasks))
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
        tasks=tasks,
        executor="local" if local else "slurm",
        ladder=bool(ladder),
        cpus_per_task=slurm["cpus_per_task"],
        env={k: v for k, v in os.environ.items() if k.startswith("LEHR_")},
    )
    if not local:
        _warn_of_untracked_tasks()
    sweep, jobs = submit(project, sweep, **slurm)
    _announce(sweep, local)
    if not wait_for_it:
        return 0
    return _gathered(project, sweep, wait(sweep, jobs if local else None))


def _announce(sweep: Sweep, local: bool) -> None:
    """What was submitted, and how to follow, cancel and gather it."""
    where, ladder, tasks, id_, commit = Path(sweep.folder), sweep.ladder, sweep.tasks, sweep.id, sweep.commit
    print(
        f"sweep {id_}: {len(tasks)} {'rung(s)' if ladder else 'experiment(s)'} of {commit[:10]} as "
        f"{'local jobs' if local else f'SLURM job {sweep.job_id}'}; folder {where}"
    )
    for task, values in tasks.items():
        print(f"  {task}: {' '.join(values) or '(the commit as it is)'}")
    print(
        f"logs: {where / 'logs'}; cancel: scancel {sweep.job_id or '(local: Ctrl-C)'}; gather them (again, "
        f"or after a Ctrl-C here, which leaves the tasks running): python -m lehr cluster gather {where}"
    )


def gather_later(project: Path, folder: Path) -> int:
    """``python -m lehr cluster gather FOLDER``: wait for the sweep's tasks, then pull them here."""
    sweep = Sweep.read(folder)
    return _gathered(project, sweep, wait(sweep))


def _gathered(project: Path, sweep: Sweep, records: dict[str, dict]) -> int:
    missing = gather(project, sweep, records)
    done = [n for n in records if n not in missing]
    what = "rung(s)" if sweep.ladder else "experiment(s)"
    then = "`make ladder` fits them" if sweep.ladder else "`python -m lehr experiments` compares them"
    print(f"{len(done)} of {len(records)} {what} here: {then}")
    for name, why in missing.items():
        print(f"lehr: error: {name} not gathered: {why}", file=sys.stderr)
    return 1 if missing else 0


def _warn_of_untracked_tasks() -> None:
    """A node cannot reach a tracking server on the submitting machine's 127.0.0.1, and without a
    server each task's clone keeps a store of its own: say so before the sweep goes."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    host = urlparse(uri).hostname if uri.startswith("http") else None
    if not uri or not host:
        why = "MLFLOW_TRACKING_URI is not set: each task's clone keeps its own mlflow.db"
    elif host == "localhost" or (_is_ip(host) and ipaddress.ip_address(host).is_loopback):
        why = f"MLFLOW_TRACKING_URI={uri} is a loopback address: tasks on other nodes will not reach it"
    else:
        return
    print(f"note: {why}; point it at the team's server by its host name (docs/team.md)", file=sys.stderr)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _has_ref(project: Path, ref: str) -> bool:
    return subprocess.run(["git", "show-ref", "--quiet", ref], cwd=project).returncode == 0


def _absolute_url(base: Path, url: str) -> str:
    if "://" in url or url.startswith("/") or ":" in url.split("/")[0]:
        return url  # a URL, an absolute path, or git's host:path
    return str((base / url).resolve())


def sweep_id() -> str:
    return f"{getpass.getuser()}-{time.strftime('%Y%m%d-%H%M%S')}"
