"""The hook that checks the config in force before a pipeline runs: its params tracked by DVC, its
data mixes against the data there is, and its profile named for the run's provenance."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from kedro.framework.hooks import hook_impl

from lehr.params.tracked import unread_overrides, untracked
from lehr.paths import profile_in_force

log = logging.getLogger(__name__)

PROFILE_ENV = "LEHR_PROFILE"  # the Kedro env of this run, for the provenance the nodes record
# The runs that train on a data mix: refused at their start when it names a tier the data lacks
# (`lehr check` and `lehr exp` refuse it before anything runs; tokenize alone may run first).
MIX_READERS = {
    "pretrain_stable",
    "anneal",
    "__default__",
}


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
            from lehr.params.mix_checks import mix_problems
            from lehr.paths import catalog_paths

            paths = catalog_paths(self._project, self._env)
            problems = mix_problems(self._context.params, paths["corpus"], paths["shards"])
            if problems:
                raise ValueError("; ".join(problems))
