"""Kedro project settings."""

from kedro.config import OmegaConfigLoader

from lehr.tracking.hooks import MlflowTracking

HOOKS = (MlflowTracking(),)

CONFIG_LOADER_CLASS = OmegaConfigLoader
CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    # `--params tokenize.vocab_size=512` overrides one key and keeps its siblings.
    "merge_strategy": {"parameters": "soft"},
    "config_patterns": {"mlflow": ["mlflow*", "mlflow*/**"]},
}
