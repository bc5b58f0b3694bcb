"""Every folder under ``lehr/pipelines`` is a pipeline of the same name; ``__default__`` is the five
stages (``soup`` is optional and run by name)."""

from kedro.framework.project import find_pipelines
from kedro.pipeline import Pipeline


def register_pipelines() -> dict[str, Pipeline]:
    pipelines = find_pipelines(raise_errors=True)
    pipelines["__default__"] = sum((p for name, p in pipelines.items() if name != "soup"), Pipeline([]))
    return pipelines
