"""A helper node of a run across machines: it trains its share of a stage's run and writes nothing.

Node 0 runs the stage through Kedro (``kedro run --pipelines pretrain_stable --params ...``); the
static rendezvous gives its processes the first ranks, so it holds the run folder and writes the
checkpoints, the stage's outputs and its metrics. Every other node runs ``python -m lehr join
pretrain_stable`` with the same ``--env`` and ``--params`` (its own ``node_rank``): the same conf
and catalog make the same run config, this node's processes join the training, and the command
exits 0 when the run ends, with no stage outputs to save (Kedro would count their absence as a
failure, and so would SLURM).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from omegaconf import OmegaConf

from lehr.config_parts import from_mapping
from lehr.engine.config import TrainConfig
from lehr.engine.processes import launch
from lehr.params.stages import AnnealParams, PretrainParams
from lehr.training.job import anneal_job, check_stage_node, stable_job

STAGES = ("pretrain_stable", "anneal")


def runtime_params(dotlist: str) -> dict:
    """``--params`` as ``kedro run`` reads it (``a.b=1,c=x``, values typed as in YAML)."""
    items = [item.strip() for item in dotlist.split(",") if item.strip()]
    for item in items:
        if "=" not in item or not item.partition("=")[0].strip():
            raise ValueError(f"--params item {item!r} must be key=value, e.g. pretrain.launch.node_rank=1")
    # A DictConfig's container is a dict (omegaconf types to_container for any config)
    return cast(dict, OmegaConf.to_container(OmegaConf.from_dotlist(items)))


def stage_config(
    project: Path, stage: str, env: str | None, params: dict
) -> tuple[TrainConfig, PretrainParams]:
    """The run config ``stage`` would train on this node, from the project's conf and catalog."""
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    if stage not in STAGES:
        raise ValueError(f"a helper node joins a training stage: {' or '.join(STAGES)}, not {stage!r}")
    bootstrap_project(project)
    # Bound before the with: kedro's AbstractSession.__enter__ is typed to return an AbstractSession
    # (it returns self), which has no load_context.
    session = KedroSession.create(project_path=project, env=env, runtime_params=params or None)
    with session:
        context = session.load_context()
        catalog, values = context.catalog, context.params
        pretrain = _typed(PretrainParams, values["pretrain"], "pretrain")
        shards, tasks = catalog.load("shards"), catalog.load("heldout_tasks")
        if stage == "pretrain_stable":  # the same jobs as the stages' nodes build
            return stable_job(pretrain, shards, catalog.load("stable_run"), tasks), pretrain
        anneal = _typed(AnnealParams, values["anneal"], "anneal")
        runs = catalog.load("anneal_runs")
        return anneal_job(pretrain, anneal, shards, catalog.load("pre_anneal"), runs, tasks)[0], pretrain


def _typed(cls: type, value, section: str):
    """A section of the context's params: Kedro hands it typed (the node inputs' dataclasses)."""
    return value if isinstance(value, cls) else from_mapping(cls, value, section)


def join(project: Path, stage: str, env: str | None, params: dict) -> int:
    """Train this node's share; returns the node rank it ran as."""
    cfg, pretrain = stage_config(project, stage, env, params)
    check_stage_node(pretrain.launch, helper=True)
    launch.run(cfg, pretrain.launch)
    return pretrain.launch.node_rank
