"""Every folder under ``lehr/pipelines`` is a pipeline of the same name; ``__default__`` is the five
stages (``soup`` and the ladder's are run by name)."""

from kedro.framework.project import find_pipelines
from kedro.pipeline import Pipeline


def register_pipelines() -> dict[str, Pipeline]:
    pipelines = find_pipelines(raise_errors=True)
    by_name = ("soup", "ladder_rung", "ladder_fit")
    pipelines["__default__"] = sum((p for name, p in pipelines.items() if name not in by_name), Pipeline([]))
    return pipelines
