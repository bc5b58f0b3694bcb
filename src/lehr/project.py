"""The project on disk as its configuration describes it: the profile in force and the paths of
the catalog's datasets. Commands outside Kedro's runs (``python -m lehr runs``, the tracking
hook) read paths here, so the catalog stays the one place a path is written."""

from __future__ import annotations

from pathlib import Path

import yaml


def profile_in_force(project: Path) -> str:
    """The profile ``dvc repro`` runs (``conf/profile.yaml``); ``local`` without one."""
    path = project / "conf" / "profile.yaml"
    return yaml.safe_load(path.read_text())["profile"] if path.is_file() else "local"


def catalog_paths(project: Path, env: str | None = None) -> dict[str, Path]:
    """Dataset name -> its path (``path`` or ``filepath``), under ``env`` (default: the profile in force)."""
    from kedro.config import OmegaConfigLoader

    loader = OmegaConfigLoader(
        conf_source=str(project / "conf"), base_env="base", default_run_env=env or profile_in_force(project)
    )
    out = {}
    for name, spec in loader["catalog"].items():
        where = spec.get("path") or spec.get("filepath") if isinstance(spec, dict) else None
        if where:
            out[name] = project / where
    return out
