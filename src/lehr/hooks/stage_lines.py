"""Each stage's first and last line: what it is about to do, and what it made, its headline figure
and where to look. A Kedro hook, so ``kedro run`` and ``dvc repro`` (which runs ``kedro run``)
end every stage on what a person wants to know, not on a log of the last step."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from kedro.framework.hooks import hook_impl

from lehr.paths import portable

log = logging.getLogger("lehr")


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _bpb(metrics: dict, *keys: str) -> str | None:
    for key in keys:
        metrics = metrics.get(key, {}) if isinstance(metrics, dict) else {}
    value = metrics.get("heldout", {}).get("bpb") if isinstance(metrics, dict) else None
    return f"{value:.4f}" if isinstance(value, (int, float)) else None


def headline(stage: str, paths: dict[str, Path]) -> str | None:
    """The one figure a stage is run for, read back from what it wrote."""
    if stage == "shard":
        manifest = _json(paths.get("shards", Path()) / "manifest.json")
        streams = manifest.get("streams", {})
        tokens = sum(s.get("n_tokens", 0) for name, s in streams.items() if name.startswith("train/"))
        return f"{tokens:,} training tokens in {len(streams)} streams" if streams else None
    if stage == "tokenize":
        vocab = _json(paths.get("tokenizer", Path())).get("model", {}).get("vocab")
        return f"a {len(vocab):,}-token vocabulary" if vocab else None
    if stage in ("pretrain_stable", "anneal"):
        which = "stable" if stage == "pretrain_stable" else "anneal"
        metrics = _json(paths.get(f"{which}_metrics", Path()))
        bpb = _bpb({"m": metrics}, "m")
        if bpb:
            branch = f"branch {where(metrics['branch'], paths)}: " if "branch" in metrics else ""
            return f"{branch}held-out {bpb} bits per byte after {metrics.get('tokens', 0):,} tokens"
    if stage == "evaluate":
        metrics = _json(paths.get("eval_metrics", Path()))
        figures = [f"{m} {_bpb(metrics, m)}" for m in ("anneal", "pre_anneal", "unigram") if _bpb(metrics, m)]
        if figures:
            return (
                "held-out bits per byte: "
                + ", ".join(figures)
                + f" ({len(metrics.get('branches', {}))} branch(es) scored)"
            )
    return None


def where(branch: str, paths: dict[str, Path]) -> str:
    """The folder of a branch, in the home this run saved it to."""
    from lehr.paths import branch_homes, run_by_dvc

    dvc_home, hand_home = branch_homes(Path.cwd())
    return portable((dvc_home if run_by_dvc("anneal") else hand_home) / branch)


class StageLines:
    """Kedro hook: a start line and an end line for every pipeline run."""

    def __init__(self):
        self._started = 0.0

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        self._started = time.monotonic()
        names = ", ".join(run_params.get("pipeline_names") or ["__default__"])
        log.info("%s: starting (profile %s)", names, run_params.get("env") or "in conf/profile.yaml")

    @hook_impl
    def after_pipeline_run(self, run_params: dict, run_result, pipeline, catalog) -> None:
        from lehr.paths import catalog_paths, dataset_path

        # Where this run wrote each output: a report of a run by hand is not where DVC's is.
        written_to = {n: dataset_path(catalog, n) for n in pipeline.all_outputs()}
        paths = {
            **catalog_paths(Path.cwd(), run_params.get("env")),
            **{n: p for n, p in written_to.items() if p},
        }
        # A branch's folder is in one of two homes (docs/tracking.md): the headline names it.
        outputs = [n for n in pipeline.all_outputs() if n in paths and n != "anneal_branch"]
        written = sorted({portable(paths[n]) for n in outputs})
        names = run_params.get("pipeline_names") or ["__default__"]
        figures = [h for h in (headline(n, paths) for n in names) if h]
        took = time.monotonic() - self._started
        log.info(
            "%s: done in %.0f s%s; wrote %s",
            ", ".join(names),
            took,
            "".join(f"; {f}" for f in figures),
            ", ".join(written) or "nothing",
        )
