"""The figures people read: task accuracy per model and the training curves (the evaluate stage),
and the ladder's fitted law (the ladder's fit stage)."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")  # files only: the PNG is for people without a display or internet
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

# A branch named by lehr (lehr.training.folder_names.branch_name): [origin-]kind-length-digest.
DERIVED = re.compile(
    r"^(?:(?P<origin>tokens-\d+)-)?(?P<kind>linear|cosine|1-sqrt)-(?P<length>r[\d.]+|\d+)-[0-9a-f]{6}$"
)


def model_label(name: str, current: str | None = None) -> str:
    """A model as a person reads it: a branch lehr named by a digest of its params
    (``1-sqrt-280-3f2a1c``) by what it is (``1-sqrt decay, 280 steps``); a chosen name as it is."""
    m = DERIVED.match(name)
    if m:
        length = m["length"]
        ratio = length.startswith("r")
        length = f"{float(length[1:]):.0%} of the steps before" if ratio else f"{length} steps"
        name = f"{m['kind']} decay, {length}" + (f" from {m['origin']}" if m["origin"] else "")
    return f"{name} (current)" if current and name == model_label(current) else name


def plot_tasks(metrics: dict) -> plt.Figure:
    """Task accuracy per model (pre_anneal and each branch scored) on every example of each task,
    with standard errors, chance marked, and results below chance called so."""
    models = {"pre_anneal": metrics["pre_anneal"], **metrics.get("branches", {})}
    current = metrics.get("anneal", {}).get("branch")
    tasks = sorted(metrics["pre_anneal"].get("tasks", {}))
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.5 * max(1, len(tasks)) * len(models) / 2))
    if not tasks:
        ax.text(0.5, 0.5, "no tasks (evaluate.tasks)", ha="center", va="center")
        ax.axis("off")
        return fig
    height = 0.8 / len(models)
    below = 0
    for m, (name, result) in enumerate(models.items()):
        accs = [result["tasks"][t]["acc"] for t in tasks]
        errs = [result["tasks"][t]["acc_stderr"] for t in tasks]
        ys = [i + m * height for i in range(len(tasks))]
        ax.barh(ys, accs, height, xerr=errs, label=model_label(name, current))
        for y, acc, err, t in zip(ys, accs, errs, tasks, strict=True):
            # Below chance by more than its standard error and a point of accuracy (a chance of
            # 1e-6 is no bar to fall under).
            if acc + err < result["tasks"][t]["chance"] - 0.01:
                below += 1
                ax.text(acc + 0.01, y, "below chance", va="center", fontsize="x-small")
    for i, t in enumerate(tasks):
        chance = metrics["pre_anneal"]["tasks"][t]["chance"]
        ax.plot([chance, chance], [i - height / 2, i + 0.8 - height / 2], "k:", linewidth=1)
    examples = [metrics["pre_anneal"]["tasks"][t].get("examples", "?") for t in tasks]
    ax.set_yticks(
        [i + 0.4 - height / 2 for i in range(len(tasks))],
        [f"{t}\n({n} examples)" for t, n in zip(tasks, examples, strict=True)],
    )
    ax.set_xlabel(
        "accuracy on every example (bars: standard error; dotted: chance)"
        + (f"; {below} result(s) below chance" if below else "")
    )
    ax.set_xlim(0, 1)
    ax.legend(fontsize="small")
    ax.set_title("lehr: task accuracy per model (the evaluate stage, every example)", fontsize="medium")
    fig.tight_layout()
    return fig


def plot_curves(
    stable_curve: pd.DataFrame, anneal_curve: pd.DataFrame, task_examples: int | None = None
) -> tuple[pd.DataFrame, plt.Figure]:
    """Train loss, held-out loss, task accuracy (when the runs scored tasks: on a sample of each,
    its first ``task_examples``) and LR across stable + anneal, as a table (DVC plots) and a PNG."""
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
        _plot_task_accuracy(axes[1], curves, task_accs, task_examples)
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
    ax_loss.set_title("lehr: train and held-out loss across the stable phase and the current anneal branch")
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("optimizer step")
    fig.tight_layout()
    return curves, fig


def _plot_task_accuracy(ax: plt.Axes, curves: pd.DataFrame, task_accs: list[str], task_examples: int | None):
    for col in task_accs:
        ev = curves[curves.kind == "eval"].dropna(subset=[col])
        ax.plot(ev.step, ev[col], "o-", markersize=3, label=col.removeprefix("tasks.").removesuffix(".acc"))
    sample = f"first {task_examples} examples" if task_examples else "a sample"
    ax.set_ylabel(f"task accuracy\n({sample})")
    ax.set_title(
        f"task accuracy during training, on {sample} of each task (pretrain.task_examples); "
        "task_accuracy.png scores every example",
        fontsize="small",
    )
    ax.legend(fontsize="small")


def plot_ladder(fitted: dict) -> plt.Figure:
    """Held-out loss against training FLOPs per size, with the fitted law's curve for each and the
    compute-optimal frontier; beside it, the isoFLOP parabolas (loss against size at one budget)."""
    fig, (ax, iso) = plt.subplots(1, 2, figsize=(12, 4.5))
    points, curves = fitted["points"], fitted.get("curves", {})
    sizes = sorted({p["n_params"] for p in points})
    for size, color in zip(sizes, plt.cm.viridis(np.linspace(0, 0.85, len(sizes))), strict=True):
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
    ax.set_title(law_text(fitted), fontsize="small")
    ax.legend(fontsize="small", title="parameters")
    inside = [v for v in fitted.get("isoflop", []) if v.get("n_opt_within_sizes")]
    for view in inside:
        at = view["sizes"]
        n, loss = [s["n_params"] for s in at], [s["loss"] for s in at]
        line = iso.plot(n, loss, "o", label=f"{view['flops']:.1e} FLOPs")
        x = np.linspace(np.log(n[0]), np.log(n[-1]), 40)
        iso.plot(np.exp(x), np.polyval(view["parabola"], x), color=line[0].get_color(), lw=1)
    iso.set(
        xscale="log", xlabel="parameters", ylabel="held-out loss at the budget", title="isoFLOP (approach 2)"
    )
    if inside:
        iso.legend(fontsize="small")
    else:
        iso.axis("off")
        iso.text(0.5, 0.5, isoflop_absent(fitted), ha="center", va="center", transform=iso.transAxes)
    fig.tight_layout()
    return fig


def law_text(fitted: dict) -> str:
    """The fitted law with its constants and their bootstrap 95% intervals, or why there is none."""
    law, ci = fitted.get("law"), fitted.get("intervals") or {}
    if not law:
        return f"L(N, D) = E + A/N^alpha + B/D^beta: {fitted['status']}"

    def term(k: str) -> str:
        lo, hi = ci.get(k, (None, None))
        return f"{k} {law[k]:.3g}" + (f" [{lo:.3g}, {hi:.3g}]" if lo is not None else "")

    return (
        "held-out loss L(N, D) = E + A/N^alpha + B/D^beta, fitted (95% intervals):\n"
        + ", ".join(term(k) for k in ("E", "alpha", "beta"))
        + "\n"
        + ", ".join(term(k) for k in ("A", "B"))
    )


def isoflop_absent(fitted: dict) -> str:
    views = fitted.get("isoflop", [])
    if not views:
        return "isoFLOP view: no budget that 3 sizes span"
    return (
        "isoFLOP view left out: at "
        + ", ".join(f"{v['flops']:.1e}" for v in views)
        + " FLOPs\nthe best size lies outside the sizes measured\n(no optimum inside them): "
        "add sizes around it (docs/ladder.md)"
    )
