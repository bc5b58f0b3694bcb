"""Is one model better than another? Their difference on the same held-out windows and task
examples, with a paired bootstrap 95% interval: both models are scored on each item, the
per-item differences are resampled with replacement, and a difference whose interval leaves out
zero is marked significant. Pairing removes what the items share (a hard window is hard for
both), so it resolves differences an unpaired standard error would call noise.

Kedro-free: ``python -m lehr compare`` and the evaluate stage (``evaluate.baseline``) call it.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer

from lehr.engine.artifacts.checkpoint import verify
from lehr.engine.batches import ShardSet, manifest_sha256
from lehr.engine.evals.evaluation import HeldOut, load_model, window_nats, windows_per_pass
from lehr.engine.evals.tasks import Scorer, Task, read_task, task_outcomes
from lehr.engine.hardware import Hardware, resolve
from lehr.engine.model import LanguageModel

RESAMPLES = 2000
LN2 = math.log(2)


def paired(a: npt.ArrayLike, b: npt.ArrayLike, weights: npt.ArrayLike | None = None, seed: int = 0) -> dict:
    """``b - a`` as a weighted mean over paired items (each item's weight: its bytes, or 1), with
    the 2.5% and 97.5% points of that statistic over resampled items. ``a`` and ``b`` may hold one
    row per seed (seeds x items, the same items in each): a resample then draws items, and each
    drawn item counts in every seed, so the interval is of the mean over the seeds (and says
    nothing of how another seed would move it: ``lehr.reports.ledger``'s noise floor does)."""
    a, b = np.atleast_2d(np.asarray(a, dtype=np.float64)), np.atleast_2d(np.asarray(b, dtype=np.float64))
    w = np.broadcast_to(1.0 if weights is None else np.asarray(weights, dtype=np.float64), a.shape)
    # An item drawn counts in every seed: its seeds' differences and weights resample as one.
    diff, w = (b - a).sum(axis=0), w.sum(axis=0)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(diff), size=(RESAMPLES, len(diff)))
    stats = diff[picks].sum(1) / w[picks].sum(1)
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return {
        "diff": float(diff.sum() / w.sum()),
        "lo": float(lo),
        "hi": float(hi),
        "significant": bool(lo > 0 or hi < 0),
        "n": len(diff),
    }


@dataclass(frozen=True)
class Scored:
    """What a comparison needs of one model: each window's nats per source, each task's outcomes,
    and which items they are (``items``: a digest of the windows and task examples; two records
    pair only if it is the same) with the bytes each window of a source stands for."""

    nats: dict[str, np.ndarray]
    tasks: dict[str, dict[str, list[float]]]
    window_bytes: dict[str, float]
    items: str

    def record(self) -> dict:
        """As JSON (evaluate keeps the current branch's in ``data/08_reporting/scored_items.json``)."""
        return {
            "items": self.items,
            "window_bytes": self.window_bytes,
            "nats": {k: [round(float(x), 6) for x in v] for k, v in self.nats.items()},
            "tasks": self.tasks,
        }

    @classmethod
    def from_record(cls, r: dict) -> Scored:
        return cls(
            {k: np.asarray(v) for k, v in r["nats"].items()}, r["tasks"], r["window_bytes"], r["items"]
        )


def items_digest(held: HeldOut, tasks: list[Task]) -> str:
    h = hashlib.sha256()
    for name in sorted(held.windows):
        h.update(name.encode() + np.ascontiguousarray(held.windows[name]).tobytes())
    h.update(json.dumps([(t.name, repr(t.examples)) for t in tasks]).encode())
    return h.hexdigest()


def score(
    model: LanguageModel, held: HeldOut, tasks: list[Task], tokenizer, hw: Hardware, micro_batch: int
) -> Scored:
    scorer = Scorer(model, tokenizer, hw.device, windows_per_pass(model.cfg.seq_len, micro_batch))
    return Scored(
        window_nats(model, held, hw, micro_batch),
        {t.name: task_outcomes(scorer, t)[0] for t in tasks},
        {n: float(w[:, 1:].shape[1] * held.bytes_per_token[n]) for n, w in held.windows.items()},
        items_digest(held, tasks),
    )


def heldout_bits(scored: Scored, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Every held-out window's bits, the sources ``names`` one after another, and the bytes each
    window stands for: their weighted mean is the held-out bits per byte."""
    bits = np.concatenate([scored.nats[n] / LN2 for n in names])
    window_bytes = np.concatenate([np.full(len(scored.nats[n]), scored.window_bytes[n]) for n in names])
    return bits, window_bytes


def difference(base: Scored, other: Scored) -> dict:
    """``other - base``: bits per byte per source and over all (lower is better), and each
    task's accuracy (higher is better), each with its interval."""
    if base.items != other.items:
        raise ValueError(
            "the two were scored on different held-out windows or task examples (other shards, context "
            "length or eval_windows): a paired comparison of them means nothing"
        )
    out: dict = {}
    for name, a in base.nats.items():
        window_bytes = np.full(len(a), base.window_bytes[name])
        out[name] = {"bpb": paired(a / LN2, other.nats[name] / LN2, window_bytes)}
    (a, window_bytes), (b, _) = (heldout_bits(s, list(base.nats)) for s in (base, other))
    out["heldout"] = {"bpb": paired(a, b, window_bytes)}
    for task, outcomes in base.tasks.items():
        out.setdefault("tasks", {})[task] = {
            metric: paired(values, other.tasks[task][metric])
            for metric, values in outcomes.items()
            if metric in ("acc", "acc_norm")
        }
    return out


def check_comparable(a: dict, b: dict, names: tuple[str, str]) -> None:
    """Two checkpoints' states: refused unless they read text through one tokenizer and see the
    same windows (one context length), so that every paired item is the same item."""
    for key, what in (("tokenizer_sha256", "tokenizer"), ("manifest_sha256", "shards")):
        if a.get(key) != b.get(key):
            raise ValueError(
                f"{names[0]} and {names[1]} were trained on different {what} ({key} {a.get(key)} vs "
                f"{b.get(key)}): their held-out windows and task tokens are not the same items, so a "
                "paired comparison of them means nothing. Compare checkpoints of one tokenize and shard run."
            )
    la, lb = a["config"]["model"]["seq_len"], b["config"]["model"]["seq_len"]
    if la != lb:
        raise ValueError(
            f"{names[0]} sees {la}-token windows and {names[1]} {lb}-token ones: they would be scored on "
            "different windows. Compare models of one context length."
        )


def checkpoints_difference(a: str, b: str, task_files: list[Path], windows: int, batch_size: int) -> dict:
    """``b - a`` of two checkpoints (``difference``), on ``windows`` held-out windows per source of
    the shards both trained on and on the tasks of ``task_files``: refused unless both see the same
    items, and the shards are still the ones they trained on."""
    paths = (Path(a), Path(b))
    states = [verify(p) for p in paths]
    check_comparable(states[0], states[1], (str(paths[0]), str(paths[1])))
    shards = Path(states[0]["config"]["shards"])
    if manifest_sha256(shards) != states[0]["manifest_sha256"]:
        raise ValueError(
            f"the shards in {shards} are not those {a} and {b} trained on (their manifest "
            "changed since): the held-out windows would not be theirs. Re-make the shards they trained on."
        )
    hw = resolve("auto", "fp32", None)
    models = [load_model(p, hw.device) for p in paths]
    cfg = models[0].cfg
    held = HeldOut.build(ShardSet(shards, cfg.vocab_size, cfg.seq_len).heldout(), cfg.seq_len, windows)
    tokenizer = Tokenizer.from_file(str(shards / "tokenizer.json"))
    tasks = [read_task(t) for t in task_files]
    base, other = (score(m, held, tasks, tokenizer, hw, batch_size) for m in models)
    return difference(base, other)


def table(diff: dict, base: str, other: str) -> str:
    """One line per figure: the difference, its interval, and what it says."""

    def line(key: str, d: dict, lower_is_better: bool) -> str:
        better = (d["diff"] < 0) == lower_is_better
        verdict = f"{other if better else base} better" if d["significant"] else "no significant difference"
        return f"{key:40s} {d['diff']:+.4f}   [{d['lo']:+.4f}, {d['hi']:+.4f}]   {verdict} (n={d['n']})"

    rows = [f"{other} - {base}: difference, paired bootstrap 95% interval ({RESAMPLES} resamples)"]
    rows += [
        line(f"{source}.bpb", figures["bpb"], True) for source, figures in diff.items() if source != "tasks"
    ]
    for task, figures in diff.get("tasks", {}).items():
        rows += [line(f"tasks.{task}.{metric}", d, False) for metric, d in figures.items()]
    return "\n".join(rows)
