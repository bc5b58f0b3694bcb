"""What each run came from and what it measured: provenance, the MLflow store (``mlflow_store``)
and the engine's step records forwarded into MLflow (``step_forwarder``); the Kedro hook that
opens a stage's MLflow run is ``lehr.hooks.mlflow_tracking``."""
