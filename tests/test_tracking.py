"""The MLflow forwarder: what reaches MLflow from the engine's records (no tracking server)."""

from __future__ import annotations

import mlflow

from lehr import tracking


def test_a_long_replayed_history_reaches_mlflow_in_batches_within_its_limit(monkeypatch):
    sent = []

    class Client:
        def log_batch(self, run_id, metrics):
            sent.append((run_id, metrics))

    monkeypatch.setattr(mlflow, "MlflowClient", Client)
    monkeypatch.setenv(tracking.RUN_ID_ENV, "run-1")
    forward = tracking.mlflow_forwarder()
    records = [{"kind": "train", "step": s, "loss": 1 / s, "lr": 1e-3, "grad_norm": 0.5, "tok_per_s": 900,
                "mfu": None, "mem": "12 MB", "skipped": False} for s in range(1, 301)]
    forward(records)  # what a resumed run replays: 300 records x 4 numeric metrics
    assert [len(batch) for _, batch in sent] == [1000, 200]
    assert {run_id for run_id, _ in sent} == {"run-1"}
    got = {(m.key, m.step): m.value for _, batch in sent for m in batch}
    assert len(got) == 1200
    assert got[("train.loss", 250)] == 1 / 250 and got[("train.tok_per_s", 1)] == 900.0
