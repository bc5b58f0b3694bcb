"""Many experiments at once on one machine, on the smoke profile, with real DVC queues (minutes:
``make integration``, which CI runs beside ``make test``):

- two queued experiments that need the same new stable phase, run two at once by ``lehr queue start
  -j 2``, each on a core of its own: the stable phase is trained once, and both anneal from it;
- a queued experiment stopped during its stable phase by Ctrl-C of ``lehr queue start`` (SIGINT to
  its process group, as a terminal sends it) keeps its checkpoint in the project's run folder, shows
  no metrics in ``lehr experiments``, and the same experiment queued again resumes from it;
- a branch trained by hand (``kedro run --pipelines anneal``) changes no DVC output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lehr.project.experiment_refs import experiments_of
from tests import faults
from tests.e2e import copy_of, cores_of, env, runs_of, sh

pytestmark = [pytest.mark.slow, pytest.mark.integration]

STABLE = "conf/smoke/parameters_pretrain_stable.yml:pretrain"
ANNEAL = "conf/base/parameters_anneal.yml:anneal"


def stable_folders(repo: Path) -> set[str]:
    return {p.name for p in (repo / "data/06_models/stable_run").iterdir() if p.is_dir()}


def queue_log(repo: Path, name: str) -> str:
    return sh(repo, "dvc", "queue", "logs", name).stdout


def test_two_experiments_that_need_one_new_stable_phase_train_it_once_each_on_a_core(smoke_repo, tmp_path):
    repo = copy_of(smoke_repo, tmp_path / "repo")
    before = stable_folders(repo)
    for name, ratio in (("dupA", 0.2), ("dupB", 0.4)):
        sh(repo, "python", "-m", "lehr", "exp", "--queue", "-n", name,
           "-S", f"{STABLE}.warmup_steps=6", "-S", f"{ANNEAL}.decay_ratio={ratio}")  # fmt: skip
    # Slow checkpoint writes keep the first's stable phase going while the second starts.
    slow = {**faults.env(slow_checkpoint=1.0), "LEHR_MLFLOW": "1"}
    out = sh(repo, "python", "-m", "lehr", "queue", "start", "-j", "2", extra_env=slow)
    assert "2 at once" in out.stdout

    # One new stable run folder, in the project (not in DVC's temporary copies), trained once.
    new = stable_folders(repo) - before
    assert len(new) == 1, new
    logs = {name: queue_log(repo, name) for name in ("dupA", "dupB")}
    fresh = [name for name, log in logs.items() if "fresh run at step 0" in log]
    waited = [name for name, log in logs.items() if "nothing trained" in log]
    assert len(fresh) == 1 and len(waited) == 1 and fresh != waited, logs
    assert "waiting for it to end" in logs[waited[0]]
    # Both experiments hold the same stable phase, and their own anneals.
    head = sh(repo, "git", "rev-parse", "HEAD").stdout.strip()
    exps = dict(experiments_of(repo, head))
    assert set(exps) == {"dupA", "dupB"}
    shown = {
        n: json.loads(sh(repo, "git", "show", f"{sha}:data/08_reporting/metrics.json").stdout)
        for n, sha in exps.items()
    }
    assert shown["dupA"]["pre_anneal"] == shown["dupB"]["pre_anneal"]
    assert shown["dupA"]["anneal"]["branch"] != shown["dupB"]["anneal"]["branch"]

    # MLflow: each stage run names its host and share: one core each, side by side.

    runs, _ = runs_of(repo)
    queued = runs[runs["tags.dvc.exp_name"].isin(["dupA", "dupB"])]
    a, b = queued[queued["tags.lehr.stage"] == "anneal"].to_dict("records")
    cores = [set(cores_of(r["tags.lehr.cores"])) for r in (a, b)]
    assert [len(c) for c in cores] == [len(os.sched_getaffinity(0)) // 2] * 2, cores
    if a["start_time"] < b["end_time"] and b["start_time"] < a["end_time"]:
        assert not cores[0] & cores[1], cores
    assert set(queued["tags.lehr.host"]) == {os.uname().nodename}
    # The run that found the stable phase trained by the other is no attempt of it.
    stable = queued[queued["tags.lehr.stage"] == "pretrain_stable"]
    assert len(stable) == 2 and set(stable["tags.lehr.earlier_attempts"]) == {""}
    assert len(set(stable["tags.lehr.run_folder"])) == 1


@pytest.mark.parametrize("how", ["ctrl-c", "lehr queue stop"])
def test_a_stopped_queue_keeps_the_checkpoint_and_the_experiment_queued_again_resumes(
    how, smoke_repo, tmp_path
):
    repo = copy_of(smoke_repo, tmp_path / "repo")
    before = stable_folders(repo)
    queue_it = ["python", "-m", "lehr", "exp", "--queue", "-n", "stopped", "-S", f"{STABLE}.warmup_steps=7"]
    sh(repo, *queue_it)
    # Slow checkpoint writes leave time to stop it part way, after its first checkpoint.
    proc = subprocess.Popen(
        ["python", "-m", "lehr", "queue", "start", "-j", "1"],
        cwd=repo,
        env={**env(), **faults.env(slow_checkpoint=1.0)},
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 240
    while time.time() < deadline and not [
        c
        for c in (repo / "data/06_models/stable_run").glob("*/checkpoints/step_*")
        if c.parent.parent.name not in before
    ]:
        time.sleep(0.2)
    assert proc.poll() is None, proc.stdout.read()
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in its terminal sends
    else:  # from another terminal: it asks the `lehr queue start` above to stop, and waits for it
        said = sh(repo, "python", "-m", "lehr", "queue", "stop", timeout=300).stderr
        assert f"asking `lehr queue start` (pid {proc.pid}) to stop" in said
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == (130 if how == "ctrl-c" else 143), output
    assert "interrupted stopped" in output, output

    # Its checkpoints are in the project, not in the copy DVC deleted; no stage process is left.
    (folder,) = stable_folders(repo) - before
    steps = sorted(
        int(p.name.split("_")[1])
        for p in (repo / "data/06_models/stable_run" / folder).glob("checkpoints/step_*")
    )
    assert steps and steps[-1] < 60, steps
    assert not (repo / "data/06_models/stable_run" / folder / "pre_anneal").exists()
    assert "SIGINT received: finishing this step, then saving a checkpoint" in queue_log(repo, "stopped")
    assert not _kedro_processes(repo)
    # `lehr experiments` shows nothing for the stopped one (DVC keeps no commit of a failed run).
    table = sh(repo, "python", "-m", "lehr", "experiments").stdout
    assert "stopped" not in table.split("held-out bits per byte")[0], table

    # Queued again, the same experiment resumes from the last checkpoint and finishes.
    sh(repo, "dvc", "queue", "remove", "--failed")
    sh(repo, *queue_it[:6], "again", *queue_it[7:])
    sh(repo, "python", "-m", "lehr", "queue", "start", "-j", "1")
    log = queue_log(repo, "again")
    assert (
        f"resumed from checkpoint data/06_models/stable_run/{folder}/checkpoints/step_{steps[-1]:08d}" in log
    ), log
    assert "again" in dict(experiments_of(repo, sh(repo, "git", "rev-parse", "HEAD").stdout.strip()))


def test_a_branch_by_hand_changes_no_dvc_output(smoke_repo, tmp_path):
    repo = copy_of(smoke_repo, tmp_path / "repo")
    sh(repo, "kedro", "run", "--pipelines", "anneal", "--params", "anneal.branch=by-hand")
    assert sh(repo, "git", "status", "--porcelain").stdout == ""
    status = json.loads(sh(repo, "dvc", "status", "--json", "dvc.yaml").stdout)  # the main pipeline
    assert list(status) == ["evaluate"], status  # it scores the new branch; nothing else changed
    reports = repo / "data/08_reporting/by_hand"
    assert json.loads((reports / "anneal_metrics.json").read_text())["branch"] == "by-hand"
    assert (reports / "anneal_curve.csv").is_file()
    assert (repo / "data/06_models/branches/by-hand/final").is_dir()


def _kedro_processes(repo: Path) -> list:
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        try:
            if "kedro" in " ".join(proc.info["cmdline"] or []) and str(repo) in (proc.info["cwd"] or ""):
                found.append(proc)
        except psutil.Error:
            continue
    return found
