"""What the stages report beside their models: the training stages' metrics (DVC metrics,
MLflow) and curves (DVC plots) from the engine's run summary and ``metrics.jsonl``, and the
evaluate stage's figures."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: the PNG is for people without a display or internet
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd


def stage_metrics(summary: dict, **own) -> dict:
    """A training stage's metrics: the figures only that stage has (``own``), then those of every
    run, then the last held-out eval per source."""
    heldout = summary["heldout"] or {}
    return {
        **own,
        "step": summary["step"],
        "tokens": summary["tokens"],
        "skipped_steps": summary["skips_total"],
        "skipped_spikes": summary["spikes_total"],
        "wall_seconds": summary["wall_seconds"],
        "tok_per_s": summary["tok_per_s"],
        "tiers": summary["tiers"],
        **{source: m for source, m in heldout.items() if isinstance(m, dict)},
    }


def read_curve(run_dir: Path) -> pd.DataFrame:
    """The run's metrics.jsonl as a table (DVC plots and the evaluate stage read it)."""
    frame = pd.read_json(run_dir / "metrics.jsonl", lines=True)
    return frame.drop(columns=[c for c in ("sample", "mem") if c in frame.columns])


def plot_tasks(metrics: dict) -> plt.Figure:
    """Task accuracy per model (pre_anneal and each branch scored), with standard errors and chance."""
    models = {"pre_anneal": metrics["pre_anneal"], **metrics.get("branches", {})}
    tasks = sorted(metrics["pre_anneal"].get("tasks", {}))
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.5 * max(1, len(tasks)) * len(models) / 2))
    if not tasks:
        ax.text(0.5, 0.5, "no tasks (evaluate.tasks)", ha="center", va="center")
        ax.axis("off")
        return fig
    height = 0.8 / len(models)
    for m, (name, result) in enumerate(models.items()):
        accs = [result["tasks"][t]["acc"] for t in tasks]
        errs = [result["tasks"][t]["acc_stderr"] for t in tasks]
        ax.barh([i + m * height for i in range(len(tasks))], accs, height, xerr=errs, label=name)
    for i, t in enumerate(tasks):
        chance = metrics["pre_anneal"]["tasks"][t]["chance"]
        ax.plot([chance, chance], [i - height / 2, i + 0.8 - height / 2], "k:", linewidth=1)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(tasks))], tasks)
    ax.set_xlabel("accuracy (bars: standard error; dotted: chance)")
    ax.set_xlim(0, 1)
    ax.legend(fontsize="small")
    ax.set_title("lehr: task accuracy per model")
    fig.tight_layout()
    return fig


def plot_curves(stable_curve: pd.DataFrame, anneal_curve: pd.DataFrame) -> tuple[pd.DataFrame, plt.Figure]:
    """Train loss, held-out loss, task accuracy (when the runs scored tasks) and LR across stable +
    anneal, as a table (DVC plots) and a PNG."""
    curves = pd.concat(
        [stable_curve.assign(phase="stable"), anneal_curve.assign(phase="anneal")], ignore_index=True
    )
    keep = [
        c
        for c in (
            "step",
            "phase",
            "kind",
            "loss",
            "lr",
            "grad_norm",
            "tok_per_s",
            "heldout.loss",
            "heldout.bpb",
        )
        if c in curves.columns
    ]
    task_accs = sorted(c for c in curves.columns if c.startswith("tasks.") and c.endswith(".acc"))
    curves = curves[keep + task_accs].sort_values(["step", "kind"]).reset_index(drop=True)
    panels = 3 if task_accs else 2
    fig, axes = plt.subplots(
        panels,
        1,
        figsize=(9, 7 + 2 * (panels - 2)),
        sharex=True,
        height_ratios=[3, 2, 1][:panels] if task_accs else [3, 1],
    )
    ax_loss, ax_lr = axes[0], axes[-1]
    if task_accs:
        for col in task_accs:
            ev = curves[curves.kind == "eval"].dropna(subset=[col])
            axes[1].plot(
                ev.step, ev[col], "o-", markersize=3, label=col.removeprefix("tasks.").removesuffix(".acc")
            )
        axes[1].set_ylabel("task accuracy")
        axes[1].legend(fontsize="small")
    for phase in ("stable", "anneal"):
        part = curves[curves.phase == phase]
        train, ev = part[part.kind == "train"], part[part.kind == "eval"]
        ax_loss.plot(train.step, train.loss, "-", alpha=0.6, label=f"train loss ({phase})")
        ax_loss.plot(ev.step, ev["heldout.loss"], "o-", label=f"held-out loss ({phase})")
        ax_lr.plot(train.step, train.lr, "-", label=phase)
    if len(stable_curve):  # the stable phase ends where the anneal starts
        for ax in axes:
            ax.axvline(stable_curve.step.max(), color="grey", linestyle=":", linewidth=1)
    ax_loss.set_ylabel("loss (nats/token)")
    ax_loss.legend()
    ax_loss.set_title("lehr: stable phase and anneal")
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("optimizer step")
    fig.tight_layout()
    return curves, fig


def plot_ladder(fitted: dict) -> plt.Figure:
    """Held-out loss against training FLOPs per size, with the fitted law's curve for each and the
    compute-optimal frontier; beside it, the isoFLOP parabolas (loss against size at one budget)."""
    fig, (ax, iso) = plt.subplots(1, 2, figsize=(12, 4.5))
    points, curves = fitted["points"], fitted.get("curves", {})
    sizes = sorted({p["n_params"] for p in points})
    for size, color in zip(sizes, plt.cm.viridis(np.linspace(0, 0.85, len(sizes)))):
        rung = [p for p in points if p["n_params"] == size]
        ax.scatter(
            [p["flops"] for p in rung], [p["loss"] for p in rung], color=color, label=f"{size / 1e6:.2f}M"
        )
        if str(size) in curves:
            ax.plot(curves[str(size)]["flops"], curves[str(size)]["loss"], color=color, lw=1)
    if "compute-optimal" in curves:
        frontier = curves["compute-optimal"]
        ax.plot(frontier["flops"], frontier["loss"], "k--", lw=1, label="compute-optimal")
    ax.set(xscale="log", xlabel="training FLOPs (the engine's count)", ylabel="held-out loss (nats/token)")
    ax.set_title(f"L(N, D) = E + A/N^a + B/D^b: {fitted['status']}", fontsize="medium")
    ax.legend(fontsize="small", title="parameters")
    for view in fitted.get("isoflop", []):
        at = view["sizes"]
        n, loss = [s["n_params"] for s in at], [s["loss"] for s in at]
        line = iso.plot(n, loss, "o", label=f"{view['flops']:.1e} FLOPs")
        x = np.linspace(np.log(n[0]), np.log(n[-1]), 40)
        iso.plot(np.exp(x), np.polyval(view["parabola"], x), color=line[0].get_color(), lw=1)
    iso.set(
        xscale="log", xlabel="parameters", ylabel="held-out loss at the budget", title="isoFLOP (approach 2)"
    )
    if fitted.get("isoflop"):
        iso.legend(fontsize="small")
    else:
        iso.text(0.5, 0.5, "no budget with 3 sizes spanning it", ha="center", transform=iso.transAxes)
    fig.tight_layout()
    return fig
