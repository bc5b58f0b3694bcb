"""Chaos: SIGKILL a stage at seeded random moments (two of three inside a checkpoint write), run
`dvc repro` again each time, and the final weights are bit-identical to an uninterrupted run.
The same for a DDP worker: torchrun restarts the group and the run resumes to the same result.

Figures (kills, resumes) are printed with ``pytest -s`` for docs/reliability.md."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from lehr.engine.config import Launch
from tests import faults
from tests.e2e import dir_hash, env, lock_hash, runs_of, sh

pytestmark = pytest.mark.slow
KILLS = 3  # per stage: two inside a checkpoint write, one anywhere in training
MLFLOW = {"LEHR_MLFLOW": "1"}  # as a person runs it: each attempt an MLflow run


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = load_file(a), load_file(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def present(run_dir: Path, pattern: str) -> set[Path]:
    """What matches now; the run renames folders while this walks, so a walk that hits one is retried."""
    while True:
        try:
            return set(run_dir.rglob(pattern))
        except FileNotFoundError:
            continue


def stage_command(dvc: subprocess.Popen) -> psutil.Process | None:
    """The stage's own command (``kedro run``) once DVC has started it, while it runs."""
    try:
        for child in psutil.Process(dvc.pid).children(recursive=True):
            if "kedro" in " ".join(child.cmdline()):
                return child
    except psutil.Error:
        pass
    return None


def untrained_copy(smoke_repo: Path, dest: Path) -> Path:
    """The session's smoke repo with its tokenizer and shards but nothing trained: no models, run
    folders or MLflow runs, and a DVC cache of the data stages' outputs only (so DVC can only
    train, never restore a model). That a from-scratch rebuild gives the same tokenizer and shards,
    the README tour's dvc.lock shows."""
    shutil.copytree(smoke_repo, dest, symlinks=True)
    models = [
        f"data/06_models/{name}"
        for name in ("stable_run", "pre_anneal", "branch_points", "anneal_runs", "anneal")
    ]
    for trained in (*models, ".dvc/cache", "mlruns"):
        shutil.rmtree(dest / trained)
    (dest / "mlflow.db").unlink()
    sh(dest, "dvc", "commit", "--force", "corpus", "tokenize", "shard")  # their outputs, back in the cache
    return dest


def kill_repeatedly(repo: Path, stage: str, run_dir: Path, seed: int) -> int:
    """Kill ``dvc repro <stage>`` KILLS times; returns how many kills landed mid-run.

    Kills land while the stage's command runs: that is lehr's code. DVC writes its own
    ``.dvc/tmp/rwlock`` in place, so a kill inside DVC's bookkeeping before or after the
    command can leave that file empty, which no stage can guard against (docs/reliability.md)."""
    rng, landed = random.Random(seed), 0
    for i in range(KILLS):
        debris = present(run_dir, ".tmp-step_*")
        started = time.time()
        proc = subprocess.Popen(
            ["dvc", "repro", stage],
            cwd=repo,
            env={**env(), **faults.env(slow_checkpoint=0.4), **MLFLOW},
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline, command = started + 90, None
        while time.time() < deadline and proc.poll() is None and command is None:
            command = stage_command(proc)
            time.sleep(0.01)
        if i % 2 == 0:  # aim inside a checkpoint write: its temporary folder exists only then
            while (
                time.time() < deadline
                and proc.poll() is None
                and not present(run_dir, ".tmp-step_*") - debris
            ):
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.3))
        else:  # anywhere in training, once this attempt has logged
            while (
                time.time() < deadline
                and proc.poll() is None
                and not any(m.stat().st_mtime > started for m in present(run_dir, "metrics.jsonl"))
            ):
                time.sleep(0.01)
            time.sleep(rng.uniform(0.2, 2.0))
        if proc.poll() is None and command is not None and command.is_running():
            os.killpg(proc.pid, signal.SIGKILL)
            landed += 1
        proc.wait()
    return landed


def test_kill_9_stable_and_anneal_resume_bit_identical(tmp_path, smoke_repo):
    """Each stage killed again and again (in a checkpoint write, or anywhere), then run to its end:
    the same bytes as the session's uninterrupted run, and in MLflow the same curve."""
    reference = smoke_repo.parent / "reference"  # the same stages, never interrupted
    repo = untrained_copy(smoke_repo, tmp_path / "repo")
    landed = kill_repeatedly(repo, "pretrain_stable", repo / "data/06_models/stable_run", seed=1)
    out = sh(repo, "dvc", "repro", "pretrain_stable", extra_env=MLFLOW)
    print(
        f"\npretrain_stable: {landed}/{KILLS} kills landed mid-run; final repro: "
        f"{'resumed' if 'resumed from checkpoint' in out.stderr else 'ran'}"
    )
    assert landed >= KILLS - 1
    assert not list((repo / "data/06_models/stable_run").rglob(".tmp-*")), "a killed write's leftovers remain"
    assert same_weights(
        reference / "pre_anneal.safetensors", repo / "data/06_models/pre_anneal/model.safetensors"
    )
    # Every file of it, to the byte (the optimizer state, the RNGs, the record), so DVC sees the
    # same pre_anneal as the uninterrupted run's and nothing after it re-runs.
    assert dir_hash(repo / "data/06_models/pre_anneal") == dir_hash(reference / "pre_anneal")
    pre_anneal = "data/06_models/pre_anneal"
    assert lock_hash(repo / "dvc.lock", pre_anneal) == lock_hash(reference / "dvc.lock", pre_anneal)
    # MLflow: every killed attempt that had started training is closed as KILLED and linked; the
    # finished one holds the whole curve (the history kept before the kills, replayed), the same
    # as the uninterrupted run's.
    runs, client = runs_of(repo)
    stable = runs[runs["tags.lehr.stage"] == "pretrain_stable"]
    attempts = stable[stable["tags.lehr.run_dir"].notna()].sort_values("start_time")
    assert attempts["tags.lehr.run_dir"].nunique() == 1 and len(attempts) >= 2
    assert list(attempts["status"]) == ["KILLED"] * (len(attempts) - 1) + ["FINISHED"]
    earlier = set(attempts.iloc[-1]["tags.lehr.earlier_attempts"].split(","))
    assert earlier == set(attempts.iloc[:-1]["run_id"])
    ref_runs, ref_client = runs_of(smoke_repo)
    ref = ref_runs[ref_runs["tags.lehr.stage"] == "pretrain_stable"].sort_values("start_time").iloc[0]
    curve = [(m.step, m.value) for m in client.get_metric_history(attempts.iloc[-1]["run_id"], "train.loss")]
    assert sorted(curve) == sorted(
        (m.step, m.value) for m in ref_client.get_metric_history(ref["run_id"], "train.loss")
    )

    landed = kill_repeatedly(repo, "anneal", repo / "data/06_models/anneal_runs", seed=2)
    sh(repo, "dvc", "repro", "anneal", extra_env=MLFLOW)
    print(f"anneal: {landed}/{KILLS} kills landed mid-run")
    assert landed >= KILLS - 1
    assert not list((repo / "data/06_models/anneal_runs").rglob(".tmp-*")), (
        "a killed write's leftovers remain"
    )
    (branch,) = [p.name for p in (repo / "data/06_models/anneal").iterdir() if not p.name.startswith(".")]
    assert same_weights(
        reference / "anneal" / f"{branch}.safetensors",
        repo / f"data/06_models/anneal/{branch}/final/model.safetensors",
    )


def test_killed_ddp_worker_is_restarted_and_resumes_to_the_same_result(tiny_config, tmp_path, trained):
    cfg = tiny_config(
        out_dir=str(tmp_path / "killed"),
        planned_steps=120,
        micro_batch=2,
        ckpt_every=20,
        eval_every=1000,
        log_every=10,
    )
    # The same 2-process run, never interrupted, on forked processes: they compute what torchrun's
    # workers do (tests/engine/test_fsdp.py's two-node test compares the two launches under FSDP).
    straight = trained(cfg, Launch(nproc_per_node=2))
    job = tmp_path / "killed.json"
    job.write_text(json.dumps({"config": cfg.to_dict(), "callbacks": []}))

    def torchrun(job_path: Path, summary: Path) -> subprocess.Popen:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node=2",
                "--max-restarts=1",
                "-m",
                "lehr.engine.processes.worker",
                str(job_path),
                str(summary),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    proc = torchrun(job, tmp_path / "killed.sum")
    latest = tmp_path / "killed" / "checkpoints" / "latest"
    deadline = time.time() + 120
    while time.time() < deadline and not latest.exists():
        time.sleep(0.05)
    workers = [
        p
        for p in psutil.Process(proc.pid).children(recursive=True)
        if "lehr.engine.processes.worker" in " ".join(p.cmdline())
    ]
    assert len(workers) == 2
    workers[1].send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-12000:]
    summary = json.loads((tmp_path / "killed.sum").read_text())
    assert summary["mode"] == "resume" and summary["step"] == 120
    weights = "final/model.safetensors"
    assert same_weights(straight / weights, tmp_path / "killed" / weights)
