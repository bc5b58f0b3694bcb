"""What the ladder's fitted law predicts for a model of N parameters trained on D tokens, and how
far to trust it (its interval, a trained model's own figure, where it extrapolates): the lines
``lehr ladder predict`` prints."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from lehr.reports.scaling_fit import predict


def trained(folder: Path) -> dict:
    """What the ladder's law needs of a trained checkpoint: its size, tokens, model, anneal and figure."""
    # Imported here: torch, which a prediction from counts alone does without.
    from lehr.engine.artifacts.state import State
    from lehr.engine.memory import parameter_count
    from lehr.engine.model import ModelConfig

    state = State.read(folder)
    evals = state.progress.get("evals") or [{}]
    start, steps = state.config.get("anneal_start"), state.config.get("anneal_steps", 0)
    return {
        "n_params": parameter_count(ModelConfig(**state.config["model"])),
        "tokens": state.tokens,
        "model": state.config["model"],
        "decay": (start, steps) if start is not None else None,
        "batch_warmup_steps": state.config.get("batch_warmup_steps", 0),
        "bpb": evals[-1].get("heldout", {}).get("bpb"),
    }


def _count(x: float) -> str:
    return f"{x:,.0f}" if x < 1e15 else f"{x:.3g}"


def prediction(fitted: dict, n: float, d: float, run: dict | None, checkpoint: str | None) -> Iterator[str]:
    """The predicted loss and bits per byte with their intervals; the trained ``run`` (``trained``
    of ``checkpoint``) against it, if given; and each count beyond the ladder's largest rung."""
    r = predict(fitted, n, d)
    loss = f"{r['loss']:.4f} nats/token"
    bpb = f"{r['bpb']:.4f} bits/byte"
    if "loss_interval" in r:
        loss += " [{:.4f}, {:.4f}]".format(*r["loss_interval"])
        bpb += " [{:.4f}, {:.4f}]".format(*r["bpb_interval"])
    yield f"{_count(n)} parameters, {_count(d)} tokens: held-out loss {loss}, {bpb} (95% interval)"
    if run and run["bpb"] is not None:
        inside = "bpb_interval" in r and r["bpb_interval"][0] <= run["bpb"] <= r["bpb_interval"][1]
        yield (
            f"{checkpoint} itself: {run['bpb']:.4f} bits/byte at its last eval; the prediction is "
            f"{r['bpb'] / run['bpb'] - 1:+.1%} off, {'inside' if inside else 'outside'} its interval"
        )
    for what, largest in r["beyond"].items():
        size = (
            f"model is {_count(largest)} parameters"
            if what == "n_params"
            else f"budget is {_count(largest)} tokens"
        )
        yield (
            f"note: an extrapolation: the ladder's largest {size}; the interval covers the fit's "
            "uncertainty, not whether the law holds that far"
        )


def family_notes(family: dict | None, recorded: bool, run: dict | None) -> Iterator[str]:
    """Which family of rungs the law is of (``recorded`` by the fit, or else read from the project's
    conf), and how the trained ``run`` lies outside it, or, for counts alone, what the family is."""
    if family is None:
        yield "note: this fit records no family of rungs (made before 2026-12-03), and no conf here does"
        return
    if not recorded:
        yield (
            "note: this fit records no family of rungs (made before 2026-12-03): it is read from this "
            "project's conf"
        )
    if run:
        from lehr.training.ladder_rungs import family_gaps  # torch and the engine: only for a checkpoint

        for gap in family_gaps(family, run["model"], run["decay"], run["batch_warmup_steps"]):
            yield f"note: an extrapolation across shapes: {gap}"
    else:
        yield _family(family)


def _family(family: dict) -> str:
    from lehr.params.ladder import ShapeRule

    shape = ShapeRule(**family["shape"])
    overrides = ", ".join(f"{k} {v}" for k, v in sorted(family.get("overrides", {}).items()))
    return (
        f"note: the law is of the ladder's family: depths {family['depths']}, width "
        f"{shape.width_rule()}, heads of {shape.head_dim}, {shape.seq_len}-token context, the rest "
        f"{shape.preset}'s{f' with {overrides}' if overrides else ''}, each cooled down "
        f"{family['decay_ratio']} of its steps; for a model of another shape or anneal it is an "
        "extrapolation (--checkpoint names how a trained one differs)"
    )
