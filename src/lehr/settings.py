"""Kedro project settings."""

from pathlib import Path

from kedro.config import OmegaConfigLoader

from lehr.errors.kedro_logs import quiet_config_loader
from lehr.hooks.config_in_force import ConfigInForce
from lehr.hooks.mlflow_tracking import MlflowTracking
from lehr.hooks.stage_lines import StageLines
from lehr.paths import profile_in_force

HOOKS = (ConfigInForce(), MlflowTracking(), StageLines())

quiet_config_loader()


CONFIG_LOADER_CLASS = OmegaConfigLoader
CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": profile_in_force(Path.cwd()),  # Kedro runs in the project root
    # `--params tokenize.vocab_size=512` overrides one key and keeps its siblings.
    "merge_strategy": {"parameters": "soft"},
    "config_patterns": {"mlflow": ["mlflow*", "mlflow*/**"]},
}
