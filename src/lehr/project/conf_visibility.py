"""Every parameter a stage reads must be one DVC tracks, or DVC could call the stage up to date
under a configuration it never ran (an override in ``conf/local`` was once invisible that way).

Kedro loads every file named ``parameters*`` in ``conf/base`` and in the run's environment (the
profile; ``conf/local`` only when it is the profile), and ``dvc.yaml`` tracks ``conf/base`` and
``conf/${profile}``: the same files. This module finds those that set a stage's section where no
stage tracks it, and the overrides in ``conf/local`` that a run under another profile leaves unread.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import yaml
from kedro.framework.hooks import hook_impl

from lehr.paths import profile_in_force

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


PROFILE_ENV = "LEHR_PROFILE"
# The runs that train on a data mix: refused at their start when it names a tier the data lacks
# (`lehr check` and `lehr exp` refuse it before anything runs; tokenize alone may run first).
MIX_READERS = {
    "pretrain_stable",
    "anneal",
    "__default__",
}  # the Kedro env of this run, for the provenance the nodes record


class ConfigInForce:
    """Kedro hook: names the profile a run is under (``LEHR_PROFILE``, recorded in provenance), and
    stops a pipeline run, before any node, when it would read params DVC does not track or, for a
    run that trains, when a data mix names a tier the data does not have (the engine would refuse it
    only once the data was loaded, without naming the parameter)."""

    def __init__(self):
        self._project, self._env, self._context = Path.cwd(), "local", None

    @hook_impl
    def after_context_created(self, context) -> None:
        self._project = Path(context.project_path)
        # Without --env, Kedro leaves context.env None and runs its default env: the profile in force.
        self._env = context.env or profile_in_force(self._project)
        self._context = context
        os.environ[PROFILE_ENV] = self._env

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        for line in unread_overrides(self._project, self._env):
            log.warning("%s", line)
        problems = untracked(self._project, self._env)
        if problems:
            raise ValueError("refusing to run: " + "; ".join(problems))
        names = set(run_params.get("pipeline_names") or ["__default__"])
        if self._context is not None and names & MIX_READERS:
            from lehr.paths import catalog_paths
            from lehr.stages.mix_checks import mix_problems

            paths = catalog_paths(self._project, self._env)
            problems = mix_problems(self._context.params, paths["corpus"], paths["shards"])
            if problems:
                raise ValueError("; ".join(problems))
