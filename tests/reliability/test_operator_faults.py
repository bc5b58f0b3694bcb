"""What an operator does at 3 a.m., for real: kill -9 a DDP stage (no worker may survive), start a
second run on a folder a live run writes (refused at once, naming the holder), `dvc repro` a stage
that `kedro run` is training (refused; the live run finishes untouched)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from lehr.engine.artifacts.state import State
from lehr.engine.config import Launch, TrainConfig
from lehr.files import locks
from tests import faults
from tests.e2e import env, sh
from tests.engine import forked

pytestmark = pytest.mark.slow
STABLE = ["kedro", "run", "--pipelines", "pretrain_stable", "--env", "smoke"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory, smoke_repo):
    """A copy of the session's finished smoke run: shards to train on, and runs to run beside."""
    path = tmp_path_factory.mktemp("ops") / "repo"
    shutil.copytree(smoke_repo, path, symlinks=True)
    return path


def start(repo: Path, *cmd: str, held: Path | None = None) -> subprocess.Popen:
    """``cmd`` in the background; ``held``: its checkpoint writes wait until that file exists, so
    that the run is still live, holding its folder, while a second command starts (their start-ups
    alone took many seconds beside parallel test workers, and a run paused for a fixed time had
    finished by then)."""
    return subprocess.Popen(
        cmd,
        cwd=repo,
        env={**env(), **(faults.env(held_checkpoint=held) if held else {})},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(cond, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline and proc.poll() is None and not cond():
        time.sleep(0.02)
    assert proc.poll() is None and cond(), "the run ended before the moment the test aims at"


def running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def live_folder(root: Path) -> Path | None:
    return (
        next((p for p in root.glob("*") if p.is_dir() and locks.holder(p)), None) if root.is_dir() else None
    )


def test_kill_9_of_a_ddp_stage_leaves_no_process_and_resumes(repo, smoke_repo, tmp_path):
    runs = repo / "data/06_models/stable_run"
    proc = start(repo, *STABLE, "--params", "pretrain.launch.nproc_per_node=2,pretrain.run_name=ddp")
    wait_for(lambda: (runs / "ddp/checkpoints/latest").is_file(), proc)
    family = psutil.Process(proc.pid).children(recursive=True)
    workers = [
        p
        for p in family
        if "lehr.engine.processes.worker" in p.cmdline() and "torch.distributed.run" not in p.cmdline()
    ]
    assert len(workers) == 2 and all(psutil.Process(w.pid).ppid() != proc.pid for w in workers)
    killed = time.time()
    os.killpg(
        proc.pid, signal.SIGKILL
    )  # the stage's group: kedro and torchrun; the workers have their own sessions
    proc.wait()
    # The kernel kills each worker as its parent dies (tests/engine/test_launch.py shows the
    # mechanism alone); here it took 0.06 s. Without it, workers that lost their agent went on
    # until their next use of its store (4 s here, never for some), writing the folder.
    while time.time() - killed < 10 and any(running(p) for p in family):
        time.sleep(0.01)
    print(f"workers gone {time.time() - killed:.2f} s after the kill")
    assert not any(running(p) for p in family), [p.cmdline() for p in family if running(p)]
    out = sh(repo, *STABLE, "--params", "pretrain.launch.nproc_per_node=2,pretrain.run_name=ddp")
    assert "resumed from checkpoint" in out.stderr + out.stdout
    assert not list(runs.rglob(".tmp-*")) and not list(Path(tempfile.gettempdir()).glob("lehr-launch-*"))
    # ...and exactly: the same 2-process run, never interrupted, ends with the same weights: the
    # configuration the stage recorded (the smoke profile's math, as the session's own run had it),
    # trained on forked processes into this test's folder (the record's paths are the project's).
    pre_anneal = repo / "data/06_models/pre_anneal"
    state = State.read(pre_anneal)
    assert state.world_size == 2
    assert state.math_hash == State.read(smoke_repo.parent / "reference/pre_anneal").math_hash
    recorded, straight = TrainConfig(**state.config), tmp_path / "straight"
    stop = dataclasses.replace(
        recorded.stop_rule, save_to=str(tmp_path / "pre_anneal"), keep_to=str(tmp_path / "points")
    )
    tasks = {name: str(repo / path) for name, path in recorded.task_files.items()}
    cfg = dataclasses.replace(
        recorded, out_dir=str(straight), shards=str(repo / recorded.shards), task_files=tasks, stop_rule=stop
    )
    forked.run(cfg, Launch(nproc_per_node=2))
    resumed = load_file(pre_anneal / "model.safetensors")
    ref = load_file(tmp_path / "pre_anneal/model.safetensors")
    assert resumed.keys() == ref.keys() and all(torch.equal(resumed[k], ref[k]) for k in ref)


def test_a_second_run_of_a_live_branch_is_refused(repo, tmp_path):
    anneal = ["kedro", "run", "--pipelines", "anneal", "--env", "smoke", "--params"]
    release = tmp_path / "release"
    first = start(repo, *anneal, "anneal.branch=C,anneal.shape=linear", held=release)
    try:
        wait_for(lambda: live_folder(repo / "data/06_models/anneal_runs") is not None, first)
        second = sh(repo, *anneal, "anneal.branch=C,anneal.shape=cosine", check=False)
    finally:
        release.touch()  # the held run goes on, whatever happened
    assert second.returncode != 0
    assert f"is in use by another run (pid {first.pid}" in second.stderr, second.stderr[-2000:]
    assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
    metrics = (repo / "data/06_models/branches/C/metrics.jsonl").read_text().splitlines()
    steps = [int(line.split('"step": ')[1].split(",")[0]) for line in metrics]
    assert steps == sorted(steps)  # one run's curve, not two interleaved


def test_dvc_repro_of_a_stage_kedro_is_training_is_refused(repo, tmp_path):
    runs = repo / "data/06_models/stable_run"
    for done in runs.glob(
        "auto-*"
    ):  # the default configuration trains afresh, in the folder DVC's run will want
        shutil.rmtree(done)
    release = tmp_path / "release"
    proc = start(repo, *STABLE, held=release)
    try:
        wait_for(lambda: live_folder(runs) is not None, proc)
        # forced: the rolling folder is not a DVC output, so DVC would otherwise find the stage up to date
        out = sh(repo, "dvc", "repro", "--force", "pretrain_stable", check=False)
    finally:
        release.touch()
    assert out.returncode != 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "is in use by another run" in out.stderr + out.stdout
    assert proc.wait(timeout=300) == 0, proc.stderr.read()[-2000:]


def test_a_tracking_store_on_a_full_disk_is_one_warning_and_the_stage_finishes(smoke_repo, tmp_path):
    """A real full disk under the store: a tmpfs exactly the store's size, mounted in a private mount
    namespace. MLflow's sqlite store logged ~40 lines of SQLAlchemy traceback before lehr's warning,
    whose reason was SQLAlchemy's advice on autoflush. (A file-size limit at the store's size is no
    test: a new run can fit in the slack of the store's pages, and then nothing fails.)"""
    repo = tmp_path / "repo"  # its own copy: the module's repo has runs of the tests before it
    shutil.copytree(smoke_repo, repo, symlinks=True)
    store = tmp_path / "store"
    store.mkdir()
    size = -(-(repo / "mlflow.db").stat().st_size // 4096) * 4096  # no page left for a journal
    full_disk = (
        f"mount -t tmpfs -o size={size} tmpfs {store} && cp mlflow.db {store}/ && "
        "exec kedro run --pipelines shard --env smoke"
    )
    if not faults.full_disk_allowed(tmp_path / "probe"):
        pytest.skip("this machine refuses user namespaces, so no tmpfs can be mounted as a full disk")
    out = sh(
        repo, "unshare", "--user", "--map-root-user", "--mount", "sh", "-c", full_disk,
        extra_env={"LEHR_MLFLOW": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{store}/mlflow.db"}, timeout=600,
    )  # fmt: skip
    said = out.stdout + out.stderr
    assert "Traceback" not in said and "SQLAlchemy" not in said, said[-3000:]
    (line,) = [row for row in said.splitlines() if "MLflow tracking at" in row]
    assert f"{store}/mlflow.db" in line and "database or disk is full" in line, line
    assert "(the disk that holds the store is full, or a file-size limit was reached)" in line, line
    assert "shard: done" in said, said[-2000:]


def test_a_tracking_server_that_does_not_answer_costs_seconds_and_a_warning(repo):
    """A socket that accepts connections and never answers: MLflow's client alone waited minutes."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        # The stage finishing at all is the point; the timeout only keeps a regression from hanging CI.
        out = sh(
            repo,
            "kedro",
            "run",
            "--pipelines",
            "shard",
            "--env",
            "smoke",
            extra_env={"LEHR_MLFLOW": "1", "MLFLOW_TRACKING_URI": uri},
            timeout=600,
        )
    finally:
        silent.close()
    assert f"MLflow tracking at {uri} is not available" in out.stderr and "LEHR_MLFLOW=0" in out.stderr
