"""The MLflow forwarder: what reaches MLflow from the engine's records (no tracking server)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import mlflow
from kedro.config import OmegaConfigLoader

from lehr import settings
from lehr.hooks.mlflow_tracking import MlflowTracking
from lehr.tracking import mlflow_store, step_forwarder


def test_a_long_replayed_history_reaches_mlflow_in_batches_within_its_limit(monkeypatch):
    sent = []

    class Client:
        def log_batch(self, run_id, metrics):
            sent.append((run_id, metrics))

    monkeypatch.setattr(mlflow, "MlflowClient", Client)
    monkeypatch.setenv(step_forwarder.RUN_ID_ENV, "run-1")
    forward = step_forwarder.mlflow_forwarder()
    records = [
        {
            "kind": "train",
            "step": s,
            "loss": 1 / s,
            "lr": 1e-3,
            "grad_norm": 0.5,
            "tok_per_s": 900,
            "mfu": None,
            "mem": "12 MB",
            "skipped": False,
        }
        for s in range(1, 301)
    ]
    forward(records)  # what a resumed run replays: 300 records x 4 numeric metrics
    forward.close()  # sending happens in a thread of its own; close waits for it
    assert [len(batch) for _, batch in sent] == [1000, 200]
    assert {run_id for run_id, _ in sent} == {"run-1"}
    got = {(m.key, m.step): m.value for _, batch in sent for m in batch}
    assert len(got) == 1200
    assert got[("train.loss", 250)] == 1 / 250 and got[("train.tok_per_s", 1)] == 900.0


def test_a_locked_tracking_store_neither_stalls_nor_stops_training(tmp_path, monkeypatch):
    """A real sqlite store, locked by another connection: sending waits in its own thread, and the
    metrics land once the lock goes (the same for a server that is down for a while)."""
    import sqlite3
    import time

    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        with mlflow.start_run() as run:
            forward = step_forwarder.mlflow_forwarder()
            blocker = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None)
            blocker.execute("BEGIN EXCLUSIVE")
            # The store stays locked until after this call returns: a sender that wrote in the caller's
            # thread could only block here or fail, so returning at all shows training does not wait.
            forward([{"kind": "train", "step": s, "loss": 1.0 / s} for s in range(1, 51)])
            time.sleep(3)
            blocker.execute("COMMIT")
            blocker.close()
            forward.close()
            history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "train.loss")
            assert sorted(m.step for m in history) == list(range(1, 51))
    finally:
        mlflow.set_tracking_uri(None)


def test_a_store_that_never_recovers_costs_a_warning_not_the_run(monkeypatch, caplog):
    import logging

    class Down:
        def log_batch(self, run_id, metrics):
            raise ConnectionError("connection refused")

    monkeypatch.setattr(step_forwarder, "CLOSE_WAIT_S", 1)
    forward = step_forwarder.Forwarder(Down(), "run-1")
    with caplog.at_level(logging.WARNING):
        forward([{"kind": "train", "step": 1, "loss": 2.0, "lr": 1e-3}])
        forward.close()
    assert "could not log metrics (connection refused)" in caplog.text
    assert "2 metric value(s) could not be logged and were dropped" in caplog.text


def test_a_queued_experiment_that_opens_a_new_store_keeps_its_artifacts_in_the_project(tmp_path, monkeypatch):
    """A queued `dvc exp run` runs in a temporary copy of the project (DVC_ROOT names the project):
    the store, and the artifacts of the experiment it creates, are the project's, not that copy's."""
    project, workspace = tmp_path / "project", tmp_path / "project/.dvc/tmp/exps/tmp1"
    workspace.mkdir(parents=True)
    monkeypatch.chdir(workspace)
    monkeypatch.setenv("DVC_ROOT", str(project))
    uri = mlflow_store.project_store("sqlite:///mlflow.db")
    # MLflow remembers the active experiment's id in the process; this store starts without one.
    monkeypatch.setattr(mlflow.tracking.fluent, "_active_experiment_id", None)
    mlflow.set_tracking_uri(uri)
    try:
        mlflow_store.use_experiment(uri, "lehr")
        with mlflow.start_run() as run:
            mlflow.log_text("{}", "reports/stable.json")
        where = Path(mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="reports"))
    finally:
        mlflow.set_tracking_uri(None)
    assert (project / "mlflow.db").is_file() and not (workspace / "mlruns").exists()
    assert (project / "mlruns" / "lehr" / run.info.run_id / "artifacts/reports/stable.json").is_file()
    assert (where / "stable.json").read_text() == "{}"


def test_an_experiment_whose_artifacts_are_in_a_deleted_copy_is_named_with_the_way_out(
    tmp_path, monkeypatch, caplog
):
    """A store made before lehr placed the artifacts (its experiment created by a queued run) keeps
    a location DVC deleted: every stage says so, naming the fix, and still tracks the run."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mlflow.tracking.fluent, "_active_experiment_id", None)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    try:
        mlflow.create_experiment(
            "lehr", artifact_location=(tmp_path / ".dvc/tmp/exps/tmp1/mlruns/1").as_uri()
        )
        with caplog.at_level("WARNING"):
            mlflow_store.use_experiment(uri, "lehr")
        assert (
            mlflow.get_experiment_by_name("lehr").experiment_id
            == mlflow.tracking.fluent._active_experiment_id
        )
    finally:
        mlflow.set_tracking_uri(None)
    assert "inside a temporary copy of the project that DVC deletes" in caplog.text
    assert "conf/base/mlflow.yml" in caplog.text


def _context_on(conf: Path) -> SimpleNamespace:
    """What the hook reads of a Kedro context, with the project's own config loader settings."""
    loader = OmegaConfigLoader(str(conf), **{**settings.CONFIG_LOADER_ARGS, "default_run_env": "local"})
    return SimpleNamespace(config_loader=loader, params={}, env="local", project_path=conf.parent)


def test_the_projects_mlflow_yml_is_obeyed_and_its_absence_means_the_defaults(tmp_path, monkeypatch):
    """`enabled: false` in conf/base/mlflow.yml turns tracking off, as the warning says it does (the
    loader's `in` never saw the file's key); a conf without the file tracks with the defaults."""
    (tmp_path / "conf/base").mkdir(parents=True)
    (tmp_path / "conf/local").mkdir()
    (tmp_path / "conf/base/mlflow.yml").write_text("enabled: false\nexperiment: mine\n")
    monkeypatch.delenv("LEHR_MLFLOW", raising=False)
    hook = MlflowTracking()
    hook.after_context_created(_context_on(tmp_path / "conf"))
    assert hook._settings == {"enabled": False, "experiment": "mine"}
    hook.before_pipeline_run({}, None, None)  # off: returns before touching any store
    assert hook._run is None and not (tmp_path / "mlflow.db").exists()

    (tmp_path / "conf/base/mlflow.yml").unlink()
    hook.after_context_created(_context_on(tmp_path / "conf"))
    assert hook._settings == {}
