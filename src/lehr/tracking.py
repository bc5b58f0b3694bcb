"""MLflow glue: forwards the engine's per-step records into the stage's MLflow run.

The engine calls ``mlflow_forwarder()`` by name (``lehr.tracking:mlflow_forwarder``) in the
process that is rank 0, in-process or under torchrun, so it never imports MLflow itself. MLflow
is imported only when a run is active (the hook started one) or a run id was handed down.
"""

from __future__ import annotations

import os
import sys
import time

RUN_ID_ENV = "MLFLOW_RUN_ID"
CALLBACK = "lehr.tracking:mlflow_forwarder"
MAX_METRICS_PER_BATCH = 1000  # MLflow's limit for one log_batch call


def _active_run_id() -> str | None:
    if "mlflow" not in sys.modules:  # tracking is off in this process: nothing started a run
        return os.environ.get(RUN_ID_ENV)
    import mlflow

    run = mlflow.active_run()
    return run.info.run_id if run else os.environ.get(RUN_ID_ENV)


def current_run_env() -> dict[str, str]:
    """What launched workers need to log into this process's active run."""
    run_id = _active_run_id()
    if not run_id:
        return {}
    import mlflow

    return {RUN_ID_ENV: run_id, "MLFLOW_TRACKING_URI": mlflow.get_tracking_uri()}


def mark_attempt(run_dir: str) -> None:
    """Tag the stage's MLflow run with its rolling folder, and close earlier attempts on that folder
    that a kill left RUNNING: a folder has one writer at a time, so they are dead. The engine replays
    the kept history into this run, which alone then holds the whole curve."""
    if "mlflow" not in sys.modules:
        return
    import mlflow

    run = mlflow.active_run()
    if run is None:
        return
    client = mlflow.MlflowClient()
    earlier = [r for r in client.search_runs([run.info.experiment_id], f"tags.`lehr.run_dir` = '{run_dir}'")
               if r.info.run_id != run.info.run_id]
    for r in earlier:
        if r.info.status == "RUNNING":
            client.set_terminated(r.info.run_id, "KILLED")
    mlflow.set_tags({"lehr.run_dir": run_dir, "lehr.earlier_attempts": ",".join(r.info.run_id for r in earlier)})


def mlflow_forwarder():
    run_id = _active_run_id()
    if not run_id:
        return lambda records: None
    import mlflow
    from mlflow.entities import Metric

    client = mlflow.MlflowClient()

    def forward(records: list[dict]) -> None:
        now = int(time.time() * 1000)
        metrics = [Metric(f"{rec['kind']}.{k}", float(v), now, rec["step"]) for rec in records for k, v in rec.items()
                   if k not in ("step", "kind") and isinstance(v, (int, float)) and not isinstance(v, bool)]
        for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            client.log_batch(run_id, metrics=metrics[i:i + MAX_METRICS_PER_BATCH])

    return forward
