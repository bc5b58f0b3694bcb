"""Running a training stage: its job (the engine config, built from the stage's params and the
catalog's data the same way for the Kedro node and for ``lehr join`` on another machine), the
rules of a run across machines, and the run itself."""

from __future__ import annotations

from pathlib import Path

from lehr import fixes
from lehr.engine.artifacts.state import State
from lehr.engine.config import Launch, TrainConfig
from lehr.engine.processes import launch
from lehr.params.stages import AnnealParams, PretrainParams
from lehr.paths import in_experiment_copy, project_root
from lehr.tracking import provenance, step_forwarder
from lehr.training.folder_names import anneal_run_dir, branch_name
from lehr.training.train_config import anneal_config, stable_config


def stable_job(pretrain: PretrainParams, shards: dict, runs_root: Path, tasks: dict) -> TrainConfig:
    return stable_config(pretrain, shards, runs_root, provenance.collect("pretrain_stable", shards), tasks)


def anneal_job(
    pretrain: PretrainParams,
    anneal: AnnealParams,
    shards: dict,
    origin: Path,
    runs_root: Path,
    tasks: dict,
) -> tuple[TrainConfig, str]:
    """The branch's config and its name; ``origin`` is the checkpoint it starts from (``origin_of``)."""
    branch = branch_name(pretrain, anneal)
    run_dir = anneal_run_dir(runs_root, branch, origin)
    prov = provenance.collect("anneal", shards, {anneal.origin: origin})
    return anneal_config(pretrain, anneal, shards, origin, run_dir, prov, tasks), branch


def origin_of(anneal: AnnealParams, pre_anneal: Path, branch_points: dict[str, Path]) -> Path:
    """The checkpoint ``anneal.origin`` names: ``pre_anneal``, or a branch point the same stable
    run kept (a point of another run would branch a model the stable phase did not make)."""
    if anneal.origin == "pre_anneal":
        return pre_anneal
    if anneal.origin not in branch_points:
        raise ValueError(
            f"anneal.origin = {anneal.origin!r} names no branch point of the stable run; its branch points "
            f"are: {', '.join(sorted(branch_points)) or 'none'}. Use one of them or pre_anneal, or add the "
            "token count to pretrain.branch_points and run pretrain_stable again."
        )
    point = branch_points[anneal.origin]
    ours, theirs = (State.read(p).out_dir for p in (pre_anneal, point))
    if ours != theirs:
        raise ValueError(
            f"branch point {point} was kept by another stable run ({theirs}) than {pre_anneal} ({ours}): "
            f"run pretrain_stable again (`{fixes.rebuild('pretrain_stable')}`), so that both are of one run."
        )
    return point


def check_stage_node(lc: Launch, helper: bool = False) -> None:
    """Across machines, the stage runs on node 0, which the static rendezvous gives rank 0, and
    ``lehr join`` on the others (``helper``); refused before any work otherwise, naming the command."""
    if helper and (lc.nnodes == 1 or lc.node_rank == 0):
        raise ValueError(
            f"`lehr join` is for nodes 1 .. nnodes-1 of a run across machines (here nnodes = {lc.nnodes}, "
            f"node_rank = {lc.node_rank}); node 0 runs the stage itself: `{fixes.run_stage('<stage>')}`"
        )
    if lc.nnodes == 1:
        return
    if not helper and lc.node_rank != 0:
        raise ValueError(
            f"pretrain.launch.node_rank = {lc.node_rank}: the stage runs on node 0, which writes its "
            f"outputs; on this node run `{fixes.join_node('<stage>')}` with the same --env and --params"
        )
    if lc.rdzv_backend != "static":
        raise ValueError(
            f"pretrain.launch.rdzv_backend = {lc.rdzv_backend!r}: a stage across machines needs "
            "`static`, which gives node 0 (where the stage saves its outputs) rank 0"
        )


def run_engine(cfg: TrainConfig, params: PretrainParams) -> dict:
    """Train in-process or through torchrun, on a share of the machine. A run stopped by a signal
    stops the stage (``lehr.errors.Stopped``: one line and the signal's exit status; its checkpoint
    is saved, and running the stage again resumes it). In a queued experiment's copy, a run whose
    folder another experiment is training waits for it and takes what it made."""
    check_stage_node(params.launch)
    summary = launch.run(
        cfg,
        params.launch,
        [step_forwarder.CALLBACK],
        step_forwarder.current_run_env(),
        wait_for_folder=in_experiment_copy(),
        on_share=lambda share: step_forwarder.mark_attempt(cfg.out_dir, share.tags()),
    )
    if summary["stopped"] == "signal":
        import signal

        from lehr.engine.run import signals
        from lehr.errors import Stopped

        # In this process the loop heard it; through torchrun only the workers did, and a signal
        # there is most often a scheduler's SIGTERM.
        name = summary.get("signal") or signals.received()
        where, again = summary["out_dir"], "run the stage again to resume"
        if in_experiment_copy():  # the copy goes, the run folder is the project's (a link to it)
            where = f"{project_root() / where} (the project's, which outlives this experiment's copy)"
            again = "run the experiment again with the same params to resume (docs/parallel.md)"
        raise Stopped(
            f"stopped by {name or 'a signal'} at step {summary['step']}; its checkpoint is saved in "
            f"{where}: {again}",
            signal.Signals[name] if name else signal.SIGTERM,
        )
    return summary
