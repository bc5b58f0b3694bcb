"""Every parameter a stage reads must be one DVC tracks, or DVC could call the stage up to date
under a configuration it never ran (an override in ``conf/local`` was once invisible that way).

Kedro loads every file named ``parameters*`` in ``conf/base`` and in the run's environment (the
profile; ``conf/local`` only when it is the profile), and ``dvc.yaml`` tracks ``conf/base`` and
``conf/${profile}``: the same files. This module finds those that set a stage's section where no
stage tracks it, and the overrides in ``conf/local`` that a run under another profile leaves unread.
"""

from __future__ import annotations

import logging
from pathlib import Path

import yaml

log = logging.getLogger(__name__)


def tracked_params(dvc_yaml: Path, profile: str) -> dict[str, set[str]]:
    """params file -> the top-level keys some stage tracks (``*``: the whole file) when ``profile``
    is the profile in force."""
    out: dict[str, set[str]] = {}
    if not dvc_yaml.is_file():  # a Kedro project without DVC: nothing to keep in step with
        return out
    for spec in yaml.safe_load(dvc_yaml.read_text())["stages"].values():
        for entry in spec.get("params", []):
            items = entry.items() if isinstance(entry, dict) else [(entry, None)]
            for path, keys in items:
                path = path.replace("${profile}", profile)
                out.setdefault(path, set()).update({k.split(".")[0] for k in keys} if keys else {"*"})
    return out


def unread_overrides(project: Path, env: str) -> list[str]:
    """One line per file of ``conf/local`` that sets parameters a run under ``env`` does not read
    (Kedro reads ``conf/local`` only as the local profile itself)."""
    if env == "local":
        return []
    root = project / "conf" / "local"
    out = []
    for f in sorted(root.glob("parameters*.y*ml")) if root.is_dir() else []:
        keys = {k for k, v in (yaml.safe_load(f.read_text()) or {}).items() if v}
        if keys:
            out.append(
                f"conf/local/{f.name} sets {', '.join(sorted(keys))}, which a run under the {env} profile "
                f"does not read (it reads conf/base and conf/{env}): put the override in "
                f"conf/{env}/{f.name}, or run under the local profile"
            )
    return out


def untracked(project: Path, env: str) -> list[str]:
    """One line per parameters file Kedro would read under ``env`` with keys DVC does not track."""
    tracked = tracked_params(project / "dvc.yaml", env)
    # Sections no stage reads (soup: a pipeline outside dvc.yaml) are Kedro's alone.
    staged = set().union(*tracked.values()) - {"*"}
    problems = []
    for folder in dict.fromkeys(("base", env)):
        root = project / "conf" / folder
        for f in sorted(root.rglob("*")) if root.is_dir() else []:
            rel = f.relative_to(root)
            if not (
                f.is_file()
                and f.suffix in (".yml", ".yaml")
                and any(p.startswith("parameters") for p in rel.parts)
            ):
                continue
            path = f"conf/{folder}/{rel}"
            keys = set(yaml.safe_load(f.read_text()) or {})
            known = tracked.get(path, set())
            loose = sorted((keys & staged) - known) if "*" not in known else []
            if loose:
                where = (
                    f"put them under their section in conf/{folder}/parameters_<stage>.yml"
                    if path not in tracked
                    else f"{path} may hold only {', '.join(sorted(known))}"
                )
                problems.append(
                    f"{path} sets {', '.join(loose)}, which no stage in dvc.yaml tracks as params, so DVC "
                    f"would not re-run a stage for it: {where}"
                )
    return problems
