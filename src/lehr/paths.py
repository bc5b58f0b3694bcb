"""The project on disk as its configuration describes it: the profile in force and the paths of
the catalog's datasets. Commands outside Kedro's runs (``python -m lehr runs``, the tracking
hook) read paths here, so the catalog stays the one place a path is written."""

from __future__ import annotations

import os
from pathlib import Path

import yaml


def portable(path: str | Path) -> str:
    """A path as a record keeps it: relative to the project (the working directory every stage and
    command runs in) when it lies inside, so that two clones of one commit record the same bytes;
    absolute only for what lies outside the project."""
    path = os.path.abspath(path)
    rel = os.path.relpath(path, os.getcwd())
    return path if rel == ".." or rel.startswith(".." + os.sep) else Path(rel).as_posix()


def project_root() -> Path:
    """The project whose work this is: DVC_ROOT, which DVC sets for every stage it runs and which,
    in a queued experiment's temporary copy, names the project the experiment was queued in."""
    return Path(os.environ.get("DVC_ROOT") or ".").resolve()


def in_experiment_copy() -> bool:
    """Whether this process runs in a queued experiment's temporary copy (DVC deletes it after)."""
    return project_root() != Path.cwd().resolve()


def run_by_dvc(stage: str) -> bool:
    """Whether this process is DVC running ``stage`` (DVC sets DVC_STAGE for every stage command:
    ``anneal``, or ``<dvc.yaml path>:anneal`` outside the project root)."""
    return os.environ.get("DVC_STAGE", "").rsplit(":", 1)[-1] == stage


def profile_in_force(project: Path) -> str:
    """The profile ``dvc repro`` runs (``conf/profile.yaml``); ``local`` without one."""
    path = project / "conf" / "profile.yaml"
    return yaml.safe_load(path.read_text())["profile"] if path.is_file() else "local"


def catalog(project: Path, env: str | None = None) -> dict:
    """The resolved catalog under ``env`` (default: the profile in force)."""
    from kedro.config import OmegaConfigLoader

    if not (project / "conf" / "base").is_dir():
        raise FileNotFoundError(
            f"{project} is no lehr project (it has no conf/base): run the command at the project's root"
        )

    loader = OmegaConfigLoader(
        conf_source=str(project / "conf"), base_env="base", default_run_env=env or profile_in_force(project)
    )
    return loader["catalog"]


def catalog_paths(project: Path, env: str | None = None) -> dict[str, Path]:
    """Dataset name -> its path (``path`` or ``filepath``), under ``env`` (default: the profile in force)."""
    return {name: project / where for name, where in catalog_files(project, env).items()}


def catalog_files(project: Path, env: str | None = None) -> dict[str, str]:
    """Dataset name -> its path as the catalog writes it, relative to the project: the path of the
    file in any commit of the project (``git show <commit>:<path>``)."""
    out = {}
    for name, spec in catalog(project, env).items():
        where = spec.get("path") or spec.get("filepath") if isinstance(spec, dict) else None
        if where:
            out[name] = where
    return out


def branch_homes(project: Path, env: str | None = None) -> tuple[Path, Path]:
    """The two homes of the anneal branches: the DVC anneal stage's, and the one of those made by hand."""
    spec = catalog(project, env)["anneal_branches"]
    return project / spec["path"], project / spec["by_hand"]


def dataset_path(catalog, name: str) -> Path | None:
    """Where a dataset of a live Kedro catalog reads and writes (None: it has no file)."""
    try:
        described = catalog.get(name)._describe()
    except Exception:  # memory datasets and the like have no file
        return None
    raw = described.get("path") or described.get("filepath")
    return Path(str(raw)) if raw else None
