"""Which models the evaluate stage scores and how: ``pre_anneal`` and the branches of it that
compare with it, on the held-out split and on every task; plain Python, no Kedro. The evaluate
stage's node hands it the catalog's datasets and the params."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from tokenizers import Tokenizer

from lehr import fixes
from lehr.engine.artifacts.state import State, is_checkpoint, state_file
from lehr.engine.batches import ShardSet
from lehr.engine.evals.evaluation import (
    HeldOut,
    evaluate,
    load_model,
    sample_text,
    unigram_bpb,
    windows_per_pass,
)
from lehr.engine.evals.tasks import Scorer, Task, evaluate_task, read_task
from lehr.engine.hardware import Hardware, resolve
from lehr.engine.processes import launch, shares
from lehr.files.atomic import sha256_file
from lehr.params.stages import AnnealParams, EvaluateParams, PretrainParams
from lehr.reports import comparison
from lehr.tracking import step_forwarder
from lehr.tracking.provenance import branched_from
from lehr.training.folder_names import branch_name

log = logging.getLogger(__name__)


def scored_weights(branch: Path) -> tuple[str, Path]:
    """What a branch ships: ``best`` if it stopped early (its final step is short of its planned
    end) and kept a best, else ``final``."""
    state = State.read(branch / "final")
    end = state.config["end_step"]  # every branch and soup has one
    if end is not None and state.step < end and is_checkpoint(branch / "best"):
        return "best", branch / "best"
    return "final", branch / "final"


def origins(pre_anneal: Path, branch_points: dict[str, Path]) -> dict[str, str]:
    """The stable run's checkpoints a branch may start from, as {sha256 of state.json: name}."""
    return {
        sha256_file(state_file(p)): name for name, p in {"pre_anneal": pre_anneal, **branch_points}.items()
    }


def chosen_branches(
    branches: dict[str, Path],
    pretrain: PretrainParams,
    anneal: AnnealParams,
    params: EvaluateParams,
    ours: dict[str, str],
) -> list[str]:
    """The current branch and those ``evaluate.branches`` names. Branches live side by side across
    stable phases, but only those from this stable run (its ``pre_anneal`` or a branch point:
    ``ours``) compare with it: ``all`` leaves the others out, saying so, and naming one is refused."""
    current = branch_name(pretrain, anneal)
    wanted = sorted(branches) if params.branches == ["all"] else [current, *params.branches]
    missing = [b for b in wanted if b not in branches]
    if missing:
        raise ValueError(
            f"unknown anneal branch(es) {', '.join(missing)}; the branches are: "
            f"{', '.join(sorted(branches)) or 'none'}. "
            f"Run `{fixes.run_stage('anneal', 'anneal.branch=NAME')}` to make one."
        )
    stale = [b for b in wanted if branched_from(branches[b] / "final") not in (*ours, None)]
    named = [b for b in stale if b == current or params.branches != ["all"]]
    if named:
        raise ValueError(
            f"anneal branch(es) {', '.join(named)} in {next(iter(branches.values())).parent} started "
            f"from a checkpoint of another stable run than this pre_anneal and its branch points (an "
            "earlier stable phase), so they do not compare with them. Re-make one from this pre_anneal "
            f"with `{fixes.run_stage('anneal', 'anneal.branch=NAME')}`, or leave it out of "
            "evaluate.branches."
        )
    if stale:
        log.info(
            "evaluate: left out anneal branch(es) of an earlier stable phase (another pre_anneal): %s",
            ", ".join(stale),
        )
    return [b for b in dict.fromkeys(wanted) if b not in stale]


def chosen_tasks(
    heldout_tasks: dict[str, Path], user_tasks: dict[str, Path], params: EvaluateParams
) -> list[Task]:
    """The tasks ``evaluate.tasks`` names (``all``: every built-in and user task), read and checked."""
    available = {**heldout_tasks, **user_tasks}
    clash = sorted(set(heldout_tasks) & set(user_tasks))
    if clash:
        raise ValueError(
            f"user task(s) {', '.join(clash)} in {next(iter(user_tasks.values())).parent} have the "
            f"name of a built-in task; rename the file(s)"
        )
    wanted = sorted(available) if params.tasks == ["all"] else params.tasks
    missing = [t for t in wanted if t not in available]
    if missing:
        raise ValueError(
            f"unknown task(s) {', '.join(missing)} in evaluate.tasks; the tasks are: "
            f"{', '.join(sorted(available)) or 'none'}"
        )
    return [read_task(available[t]) for t in wanted]


@contextlib.contextmanager
def on_a_share(pretrain: PretrainParams) -> Iterator[Hardware]:
    """The hardware evaluate scores on, within a share of the machine (``lehr.engine.processes.shares``):
    one process's, and its GPU where it has one."""
    with shares.claim(1, launch.on_gpu(pretrain.device), "evaluate") as share, shares.pinned(share, 1):
        step_forwarder.tag_share(share.tags())
        yield resolve(
            pretrain.device, pretrain.precision, None, share.first_gpu_index or 0, pretrain.attention
        )


def evaluate_models(
    shards: dict,
    pre_anneal: Path,
    branch_points: dict[str, Path],
    branches: dict[str, Path],
    heldout_tasks: dict[str, Path],
    user_tasks: dict[str, Path],
    pretrain: PretrainParams,
    anneal: AnnealParams,
    params: EvaluateParams,
) -> tuple[dict, str, dict]:
    """metrics.json, the samples, and the current branch's scored items (``lehr experiments`` pairs
    them across experiments), on a share of the machine (``lehr.engine.processes.shares``)."""
    ours = origins(pre_anneal, branch_points)
    names = chosen_branches(branches, pretrain, anneal, params, ours)
    current = branch_name(pretrain, anneal)
    if params.baseline and params.baseline not in names:
        raise ValueError(
            f"evaluate.baseline = {params.baseline!r} is not among the branches scored ({', '.join(names)}): "
            "name one of them, or add it to evaluate.branches"
        )
    tasks = chosen_tasks(heldout_tasks, user_tasks, params)
    # Keyed by the path in metrics.json, as a tuple: a branch name may hold dots (v1.2).
    weights = {b: scored_weights(branches[b]) for b in names}
    models: dict[tuple[str, ...], Path] = {
        ("pre_anneal",): pre_anneal,
        **{("branches", b): weights[b][1] for b in names},
    }
    with on_a_share(pretrain) as hw:  # the models' work, after every check; the share goes after it
        first = load_model(pre_anneal, hw.device)  # its config fixes the windows every model is scored on
        shard_set = ShardSet(shards["root"], first.cfg.vocab_size, first.cfg.seq_len)
        held = HeldOut.build(shard_set.heldout(), first.cfg.seq_len, params.eval_windows)
        tokenizer = Tokenizer.from_file(str(Path(shards["root"]) / "tokenizer.json"))
        train = [s for n, s in shard_set.sources.items() if n.startswith("train/")]
        metrics: dict = {"unigram": unigram_bpb(train, held, first.cfg.vocab_size)}
        samples, scored = [], {}
        for i, (name, path) in enumerate(models.items(), 1):
            log.info("evaluate: scoring %d/%d: %s", i, len(models), ".".join(name))
            model = first if path == pre_anneal else load_model(path, hw.device)
            node = metrics
            for part in name:
                node = node.setdefault(part, {})
            node.update(figures_of(model, held, tasks, tokenizer, hw, pretrain.micro_batch))
            if params.baseline or name[-1] == current:
                scored[name[-1]] = comparison.score(model, held, tasks, tokenizer, hw, pretrain.micro_batch)
            text = sample_text(model, tokenizer, params.sample_prompt, params.sample_tokens, hw.device)
            samples.append(f"=== {'.'.join(name)} ===\n{text}\n")
    for b in names:  # which weights were scored, grown from what, on how many tokens
        metrics["branches"][b] |= provenance_of(branches[b], weights[b], ours)
    metrics["anneal"] = {"branch": current, **metrics["branches"][current]}
    metrics["anneal_gain"] = anneal_gain(metrics["pre_anneal"], metrics["anneal"])
    items = {"branch": current, **scored[current].record()}
    if params.baseline:
        base = scored.pop(params.baseline)
        metrics["vs_baseline"] = {
            "baseline": params.baseline,
            **{name: comparison.difference(base, other) for name, other in scored.items()},
        }
    return metrics, "\n".join(samples), items


def figures_of(model, held: HeldOut, tasks: list[Task], tokenizer, hw: Hardware, micro_batch: int) -> dict:
    """A model's held-out figures per source, then its tasks' (``tasks``)."""
    with torch.no_grad():
        figures: dict[str, dict] = evaluate(model, held, hw, micro_batch=micro_batch)
    if tasks:
        scorer = Scorer(model, tokenizer, hw.device, windows_per_pass(model.cfg.seq_len, micro_batch))
        figures["tasks"] = {task.name: evaluate_task(scorer, task) for task in tasks}
    return figures


def provenance_of(branch: Path, weights: tuple[str, Path], origins_by_checkpoint: dict[str, str]) -> dict:
    origin = branched_from(branch / "final")
    return {
        "weights": weights[0],
        "origin": "unrecorded" if origin is None else origins_by_checkpoint.get(origin, "unrecorded"),
        "tokens": State.read(weights[1]).tokens,
    }


def anneal_gain(pre_anneal: dict, anneal: dict) -> dict:
    """What the anneal took off ``pre_anneal``'s held-out loss and bits per byte, per source."""
    return {
        key: {m: pre_anneal[key][m] - anneal[key][m] for m in ("loss", "bpb")}
        for key in pre_anneal
        if key != "tasks"
    }
