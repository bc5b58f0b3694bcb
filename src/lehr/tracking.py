"""MLflow glue: forwards the engine's per-step records into the stage's MLflow run.

The engine calls ``mlflow_forwarder()`` by name (``lehr.tracking:mlflow_forwarder``) in the
process that is rank 0, in-process or under torchrun, so it never imports MLflow itself.
"""

from __future__ import annotations

import os

import mlflow

RUN_ID_ENV = "MLFLOW_RUN_ID"
CALLBACK = "lehr.tracking:mlflow_forwarder"


def current_run_env() -> dict[str, str]:
    """What launched workers need to log into this process's active run."""
    run = mlflow.active_run()
    if run is None:
        return {}
    return {RUN_ID_ENV: run.info.run_id, "MLFLOW_TRACKING_URI": mlflow.get_tracking_uri()}


def mlflow_forwarder():
    run = mlflow.active_run()
    run_id = run.info.run_id if run else os.environ.get(RUN_ID_ENV)
    if not run_id:
        return lambda record: None
    client = mlflow.MlflowClient()
    prefix = os.environ.get("LEHR_METRIC_PREFIX", "")

    def forward(record: dict) -> None:
        step = record["step"]
        metrics = [mlflow.entities.Metric(f"{prefix}{record['kind']}.{k}", float(v), 0, step)
                   for k, v in record.items()
                   if k not in ("step", "kind") and isinstance(v, (int, float)) and v is not None]
        client.log_batch(run_id, metrics=metrics, synchronous=False)

    return forward
