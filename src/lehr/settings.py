"""Kedro project settings."""

import warnings
from pathlib import Path

from kedro.config import OmegaConfigLoader

from lehr.paths import profile_in_force
from lehr.project.conf_visibility import ConfigInForce
from lehr.stages.lines import StageLines
from lehr.tracking.hooks import MlflowTracking

HOOKS = (ConfigInForce(), MlflowTracking(), StageLines())

# Kedro's config loader registers its resolvers with an omegaconf call that omegaconf 2.4 (the
# one hydra-core pins) warns about at every run: Kedro's to change, nothing a user can act on.
warnings.filterwarnings("ignore", message=r"register_new_resolver\(\) is deprecated", category=UserWarning)


CONFIG_LOADER_CLASS = OmegaConfigLoader
CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": profile_in_force(Path.cwd()),  # Kedro runs in the project root
    # `--params tokenize.vocab_size=512` overrides one key and keeps its siblings.
    "merge_strategy": {"parameters": "soft"},
    "config_patterns": {"mlflow": ["mlflow*", "mlflow*/**"]},
}
