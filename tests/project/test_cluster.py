"""``python -m lehr cluster``: a sweep as a SLURM job array through submitit, gathered back.

The fast tests (``make test``) check what is refused before anything is submitted. The integration
tests (``make integration``, which starts a real one-node SLURM on 127.0.0.1 with
tests/slurm/cluster.sh and stops it after) submit a two-experiment sweep through sbatch and find
both in ``lehr experiments``, requeue a task part way through its training with ``scontrol
requeue`` and see it resume from its checkpoint, and run the same tasks through submitit's local
executor.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from lehr.project import cluster
from lehr.project.cluster_task import Sweep, share_env
from tests import ROOT, faults
from tests.e2e import sh, team

ANNEAL = "conf/base/parameters_anneal.yml:anneal"
STABLE = "conf/smoke/parameters_pretrain_stable.yml:pretrain"


# -- refused before anything is submitted ---------------------------------------------------------
@pytest.fixture
def repo(tmp_path) -> Path:
    """A git + DVC repo with one commit, pushed to a bare remote, and a DVC remote."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for cmd in (
        ["git", "init", "-q", "-b", "main"],
        ["dvc", "init", "-q"],
        ["git", "commit", "-qm", "first"],
        ["git", "init", "-q", "--bare", str(tmp_path / "remote.git")],
        ["git", "remote", "add", "origin", str(tmp_path / "remote.git")],
        ["dvc", "remote", "add", "-d", "store", "../store"],
        ["git", "commit", "-qam", "remote"],
        ["git", "push", "-q", "origin", "main"],
    ):
        sh(repo, *cmd)
    return repo


def test_a_pushed_clean_commit_with_a_dvc_remote_is_submittable(repo, tmp_path):
    commit, git_url, dvc_url, cache = cluster.refuse_unsubmittable(repo, "origin")
    assert commit == sh(repo, "git", "rev-parse", "HEAD").stdout.strip()
    assert git_url == str(tmp_path / "remote.git")
    assert dvc_url == str(tmp_path / "store")  # recorded relative to .dvc/, made absolute for every clone
    assert Path(cache) == repo / ".dvc" / "cache"


def test_a_dirty_tree_is_refused_naming_each_change(repo):
    (repo / "notes.txt").write_text("x")
    (repo / ".dvc" / "config").write_text("changed\n")
    with pytest.raises(ValueError, match=r"\(.dvc/config, notes.txt\).*commit them"):
        cluster.refuse_unsubmittable(repo, "origin")


def test_a_commit_the_remote_lacks_is_refused(repo):
    sh(repo, "git", "commit", "-qm", "not pushed", "--allow-empty")
    with pytest.raises(ValueError, match=r"is not on origin .*git push origin HEAD"):
        cluster.refuse_unsubmittable(repo, "origin")
    with pytest.raises(ValueError, match=r"no git remote 'upstream'"):
        cluster.refuse_unsubmittable(repo, "upstream")


def test_no_dvc_remote_is_refused(repo):
    sh(repo, "dvc", "remote", "default", "--unset")
    sh(repo, "git", "commit", "-qam", "no default remote")
    sh(repo, "git", "push", "-q", "origin", "main")
    with pytest.raises(ValueError, match=r"no default DVC remote.*dvc remote add -d"):
        cluster.refuse_unsubmittable(repo, "origin")


def test_a_sweep_is_every_combination_of_its_values_and_refuses_a_bad_one():
    sweep = cluster.plan(
        ROOT, "local", [f"{ANNEAL}.decay_ratio=0.2,0.4", f"{ANNEAL}.shape=linear,cosine"], "sw"
    )
    assert list(sweep) == ["sw-1", "sw-2", "sw-3", "sw-4"]
    assert sweep["sw-2"] == [f"{ANNEAL}.decay_ratio=0.2", f"{ANNEAL}.shape=cosine"]
    with pytest.raises(ValueError, match=r"anneal.decay_ratio = 2 must lie in \[0, 1\]"):
        cluster.plan(ROOT, "local", [f"{ANNEAL}.decay_ratio=2"], "sw")


def test_a_task_on_part_of_an_unbound_node_declares_the_node_shared(monkeypatch):
    sweep = Sweep(
        id="s", folder="/x", commit="c", git_remote="origin", git_url="/g", dvc_remote_url="/d",
        cache_dir="/c", tasks={}, executor="slurm", cpus_per_task=1,
    )  # fmt: skip
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert share_env(sweep) == ({"LEHR_JOBS": str(cores)} if cores > 1 else {})
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", str(cores))  # the whole node: nothing to declare
    assert share_env(sweep) == {}


def test_slurms_options_reach_sbatch(tmp_path):
    """Partition, account, time, GPUs and cores per task, and at most K tasks at once, as the job
    script submitit writes for sbatch has them (the test cluster has no GPUs to run them on)."""
    sweep = Sweep(
        id="sw", folder=str(tmp_path), commit="c", git_remote="origin", git_url="/g", dvc_remote_url="/d",
        cache_dir="/c", tasks={}, executor="slurm",
    )  # fmt: skip
    executor = cluster.executor_for(
        sweep, partition="gpu", account="lab", time_min=240, gpus_per_task=2, cpus_per_task=8, at_once=3
    )
    script = executor._executor._make_submission_file_text("python -u -m submitit.core._submit", "u")
    for line in ("--partition=gpu", "--account=lab", "--time=240", "--gpus-per-task=2", "--cpus-per-task=8",
                 "--requeue", "--signal=USR2@90", "--job-name=lehr-sw"):  # fmt: skip
        assert f"#SBATCH {line}\n" in script, script
    assert executor._executor.parameters["array_parallelism"] == 3  # sbatch --array=0-N%3


# -- through a real SLURM and submitit's local executor (make integration) -----------------------
@pytest.fixture
def slurm() -> dict[str, str]:
    """The test cluster's environment (SLURM_CONF); at the end, every job of this test's sweeps is
    cancelled, so that a failed test leaves nothing running."""
    conf = os.environ.get("SLURM_CONF") or f"{os.environ.get('LEHR_SLURM_DIR', '/tmp/lehr-slurm')}/slurm.conf"
    slurm_env = {**os.environ, "SLURM_CONF": conf}
    if subprocess.run(["sinfo", "--noheader"], env=slurm_env, capture_output=True).returncode != 0:
        pytest.fail(f"no SLURM answers through {conf}: start the test cluster with `make slurm-up`")
    yield {"SLURM_CONF": conf}
    for name in SWEEPS:
        subprocess.run(["scancel", "--name", f"lehr-{name}"], env=slurm_env, capture_output=True)


SWEEPS = ("sw", "rq", "lad")


def experiments_table(repo: Path) -> dict[str, str]:
    table = sh(repo, "python", "-m", "lehr", "experiments").stdout
    return {line.split()[0]: line for line in table.splitlines() if line.strip()}


@pytest.mark.slow
@pytest.mark.integration
def test_a_sweep_runs_as_a_slurm_job_array_and_comes_back(smoke_repo, tmp_path, slurm):
    a, _ = team(smoke_repo, tmp_path)
    out = sh(
        a, "python", "-m", "lehr", "cluster", "submit", "-n", "sw", "-S", f"{ANNEAL}.decay_ratio=0.2,0.4",
        "--partition", "debug", "--time", "20", "--cpus-per-task", "1", "--at-once", "2",
        "--folder", str(tmp_path / "shared"), extra_env=slurm, timeout=900,
    )  # fmt: skip
    assert "as SLURM job" in out.stdout and "2 of 2 experiment(s) here" in out.stdout, out.stdout
    rows = experiments_table(a)
    for name in ("sw-1", "sw-2"):
        assert "[" in rows[name], rows  # its difference from the baseline, with its interval
        record = json.loads((tmp_path / "shared/sw/records" / f"{name}.json").read_text())
        assert record["state"] == "done"
    # Each ran as a task of one array, in its own clone on the shared storage.
    logs = sorted(p.name for p in (tmp_path / "shared/sw/logs").glob("*_log.out"))
    job = json.loads((tmp_path / "shared/sw/sweep.json").read_text())["job_id"]
    assert logs == [f"{job}_0_0_log.out", f"{job}_1_0_log.out"], logs  # array task 0 and 1, process 0
    assert all((tmp_path / "shared/sw/clones" / n / ".git").is_dir() for n in ("sw-1", "sw-2"))


# SLURM's own requeue (SIGTERM to every process of the job), and submitit's signal before the time
# limit (USR2 to the job's steps: what `--signal=USR2@90` sends, as submitit's own tests send it).
REQUEUES = {"scontrol requeue": ["scontrol", "requeue"], "time limit": ["scancel", "--signal=USR2"]}


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("how", REQUEUES)
def test_a_task_requeued_mid_training_resumes_from_its_checkpoint(how, smoke_repo, tmp_path, slurm):
    a, _ = team(smoke_repo, tmp_path)
    # A new stable phase (warmup 7), with slow checkpoint writes: time to requeue it part way.
    out = sh(
        a, "python", "-m", "lehr", "cluster", "submit", "-n", "rq", "-S", f"{STABLE}.warmup_steps=7",
        "--time", "20", "--cpus-per-task", "2", "--folder", str(tmp_path / "shared"), "--no-wait",
        extra_env={**slurm, **faults.env(slow_checkpoint=1.0)},
    )  # fmt: skip
    folder = tmp_path / "shared/rq"
    assert f"python -m lehr cluster gather {folder}" in out.stdout
    (task,) = json.loads((folder / "sweep.json").read_text())["task_ids"]  # one task: a plain job
    runs = folder / "clones/rq-1/data/06_models/stable_run"
    deadline = time.time() + 300
    while not (saved := list(runs.glob("*/checkpoints/step_*"))):
        assert time.time() < deadline, (folder / "logs/rq-1.txt").read_text()
        time.sleep(0.5)
    sh(a, *REQUEUES[how], task, extra_env=slurm)
    run_folder = saved[0].parent.parent.name

    gathered = sh(a, "python", "-m", "lehr", "cluster", "gather", str(folder), extra_env=slurm, timeout=900)
    assert "1 of 1 experiment(s) here" in gathered.stdout, gathered.stdout
    log = (folder / "logs/rq-1.txt").read_text()
    assert "SLURM restart 0" in log and "SLURM restart 1" in log, log
    slurm_log = "".join((folder / f"logs/{task}_0_log.{kind}").read_text() for kind in ("out", "err"))
    stopped = re.search(r"stopped by SIGTERM at step (\d+); checkpoint saved", slurm_log)
    assert stopped, slurm_log[-3000:]
    step = int(stopped.group(1))
    resumed = f"resumed from checkpoint data/06_models/stable_run/{run_folder}/checkpoints/"
    assert f"{resumed}step_{step:08d}" in slurm_log, slurm_log[-3000:]
    assert "rq-1" in experiments_table(a)


@pytest.mark.slow
@pytest.mark.integration
def test_the_local_executor_runs_the_same_tasks_without_slurm(smoke_repo, tmp_path):
    a, _ = team(smoke_repo, tmp_path)
    out = sh(
        a, "python", "-m", "lehr", "cluster", "submit", "--local", "-n", "loc",
        "-S", f"{ANNEAL}.decay_ratio=0.3", "--folder", str(tmp_path / "shared"), timeout=900,
    )  # fmt: skip
    assert "as local jobs" in out.stdout and "1 of 1 experiment(s) here" in out.stdout, out.stdout
    assert "[" in experiments_table(a)["loc-1"]


@pytest.mark.slow
@pytest.mark.integration
def test_the_ladders_rungs_run_as_an_array_and_come_back_through_the_run_cache(smoke_repo, tmp_path, slurm):
    a, _ = team(smoke_repo, tmp_path, ladder=True)
    out = sh(
        a, "python", "-m", "lehr", "cluster", "submit", "-n", "lad", "--ladder", "1,2", "--time", "20",
        "--cpus-per-task", "1", "--at-once", "2", "--folder", str(tmp_path / "shared"),
        extra_env=slurm, timeout=900,
    )  # fmt: skip
    assert "2 of 2 rung(s) here" in out.stdout, out.stdout
    for d in (1, 2):
        assert f"rung-{d}: restored from the run cache (ladder/dvc.yaml:ladder_rung@{d})" in out.stdout
        assert (a / f"data/07_model_output/ladder/rung-{d}.json").is_file()
    # Gathered again, both are here already; the ladder's own stages find them done: nothing trains.
    again = sh(a, "python", "-m", "lehr", "cluster", "gather", str(tmp_path / "shared/lad"), extra_env=slurm)
    assert "rung-1: here already" in again.stdout and "2 of 2 rung(s) here" in again.stdout, again.stdout
    repro = sh(a, "dvc", "repro", "ladder/dvc.yaml:ladder_rung@1", "ladder/dvc.yaml:ladder_rung@2")
    assert "Running stage" not in repro.stdout, repro.stdout
