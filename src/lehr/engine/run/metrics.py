"""Rank 0's record of a run: one readable log line per step interval, the same as JSON lines in
``metrics.jsonl`` (what the run computed) and ``timing.jsonl`` (what the clock said), a progress
bar when interactive, callbacks (MLflow, tests), which get both, and the tokens drawn per tier.
Every rank keeps the clock (tokens/s, MFU), so that a rank's own log could say it too."""

from __future__ import annotations

import importlib
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from lehr.files.atomic import write_text_atomic

log = logging.getLogger("lehr.train")
Callback = Callable[[list[dict[str, Any]]], None]  # takes records, oldest first


def load_callbacks(specs: list[str]) -> list[Callback]:
    """``module:factory`` strings -> callables; how the glue hooks in without the engine knowing it."""
    out = []
    for spec in specs:
        module, _, name = spec.partition(":")
        out.append(getattr(importlib.import_module(module), name)())
    return out


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"heldout": {"loss": 4.1}}`` -> ``{"heldout.loss": 4.1}``: records are nested in the engine
    and flat at its edges (JSON lines, callbacks), where tables and trackers want one key per value."""
    out = {}
    for key, value in record.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# What a record holds of the clock and the machine goes to ``timing.jsonl``, which DVC ignores:
# ``metrics.jsonl`` (versioned in the run folders and the branches) then depends on the run's
# configuration, data and code alone, and a fresh run reproduces it byte for byte.
CLOCK_KEYS = ("seconds", "tok_per_s", "mfu", "mem")
METRICS, TIMING = "metrics.jsonl", "timing.jsonl"


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.is_file() else []


def timing(run_dir: Path) -> tuple[float | None, int | None]:
    """(wall seconds, tokens per second) of a whole run from its ``timing.jsonl``: the steps, evals
    and saves every attempt kept, added up (a resumed run's, not only its last process's)."""
    records = _read(run_dir / TIMING)
    timed = [r for r in records if r.get("seconds") is not None]
    trained = [r for r in timed if r["kind"] == "train" and r.get("tok_per_s")]
    train_seconds = sum(r["seconds"] for r in trained)
    tokens = sum(r["tok_per_s"] * r["seconds"] for r in trained)
    wall = round(sum(r["seconds"] for r in timed), 1) if timed else None
    return wall, round(tokens / train_seconds) if train_seconds else None


@dataclass(frozen=True)
class Throughput:
    """What the clock turns into rates: the model's FLOPs per token trained, and the peak FLOP/s
    of every process together (None where the hardware's peak is unknown: no MFU)."""

    flops_per_token: float
    peak_flops: float | None


class RunLog:
    def __init__(
        self,
        out_dir: Path,
        enabled: bool,
        start: int,
        end: int | None,
        callbacks: list[Callback],
        throughput: Throughput,
    ):
        self.path, self.timing_path = out_dir / METRICS, out_dir / TIMING
        self.enabled, self.callbacks, self.throughput = enabled, callbacks, throughput
        self.bar = None
        # The training time since the last log line: evals and rolling saves restart the clock,
        # so tokens/s and MFU are of training steps alone (OLMo-core's speed monitor does the same).
        self.since, self.tokens = time.perf_counter(), 0
        if enabled:
            # A resumed run hands its callbacks the history it kept (in one call, so a tracker can
            # send it in a few batches), and the tracker opened for this attempt holds the whole
            # curve, not only the steps trained since the restart.
            kept = self._truncate_after(start)
            if kept:
                for cb in self.callbacks:
                    cb(kept)
            if sys.stderr.isatty():
                self.bar = tqdm(total=end, initial=start, unit="step", dynamic_ncols=True)

    def _truncate_after(self, step: int) -> list[dict[str, Any]]:
        """Drop records past the resume point (those steps are trained again); returns the rest,
        each with its clock readings again."""
        kept = {}
        for path in (self.path, self.timing_path):
            records = _read(path)
            keep = [rec for rec in records if rec["step"] <= step]
            if len(keep) < len(records):  # a finished run's record is left as it is, not rewritten
                write_text_atomic(path, "".join(json.dumps(rec) + "\n" for rec in keep))
            kept[path] = keep
        clock = {(r["step"], r["kind"]): r for r in kept[self.timing_path]}
        return [{**rec, **clock.get((rec["step"], rec["kind"]), {})} for rec in kept[self.path]]

    def stepped(self, tokens: int) -> None:
        self.tokens += tokens

    def restart_clock(self) -> None:
        """After work that is not training (an eval, a rolling save): the next interval starts now."""
        self.since, self.tokens = time.perf_counter(), 0

    def train_step(
        self, step: int, loss: float, lr: float, grad_norm: float, tokens: int, mem: str | None
    ) -> None:
        """The log line of ``step`` and its record, with the rates of the steps since the last one."""
        seconds = time.perf_counter() - self.since
        rate = self.throughput
        # No tokens: this log step was the one that compiled, whose time is recorded apart.
        tok_per_s = self.tokens / seconds if self.tokens else None
        mfu = tok_per_s * rate.flops_per_token / rate.peak_flops if tok_per_s and rate.peak_flops else None
        # The loss of this step alone (not a window mean), so a resumed run logs the same curve.
        self.log_step(
            {
                "step": step,
                "kind": "train",
                "loss": loss,
                "lr": lr,
                "grad_norm": grad_norm,
                "tok_per_s": tok_per_s,
                "mfu": mfu,
                "tokens": tokens,
                "mem": mem,
                "seconds": seconds,  # of these steps' training: the run's wall time and tok/s add these up
            }
        )
        self.restart_clock()

    def epochs(self, tiers: dict[str, dict[str, float]], when: str, warn_above: float | None) -> None:
        """One line of tokens and epochs per tier (``TrainStream.tokens_per_tier``); a warning for a
        tier repeated over ``warn_above`` times."""
        self.info(
            "data, %s: %s",
            when,
            "; ".join(
                f"{tier} {v['tokens'] / 1e6:.2f}M tokens = {v['epochs']:.2f} epochs of "
                f"{v['tier_tokens'] / 1e6:.2f}M"
                for tier, v in tiers.items()
            ),
        )
        over = {
            tier: v["epochs"]
            for tier, v in tiers.items()
            if warn_above is not None and v["epochs"] > warn_above
        }
        if over:
            self.warning(
                "tier(s) %s would be repeated more than pretrain.max_epochs_warn = %g times (%s): "
                "repeated data gives less with each epoch; add data to the tier, lower its weight, "
                "or train fewer steps",
                ", ".join(over),
                warn_above,
                ", ".join(f"{tier} {e:.1f} epochs" for tier, e in over.items()),
            )

    def record(self, rec: dict[str, Any]) -> None:
        if not self.enabled:
            return
        rec = flatten(rec)
        clock = {k: rec[k] for k in CLOCK_KEYS if k in rec}
        with open(self.path, "a") as f:
            f.write(json.dumps({k: v for k, v in rec.items() if k not in CLOCK_KEYS}) + "\n")
        if clock:
            with open(self.timing_path, "a") as f:
                f.write(json.dumps({"step": rec["step"], "kind": rec["kind"], **clock}) + "\n")
        for cb in self.callbacks:
            cb([rec])

    def timed(self, step: int, kind: str, seconds: float) -> None:
        """Work that is neither a step nor an eval (a save): in the timing record only, so the run's
        wall time holds it and its curves do not."""
        if self.enabled:
            with open(self.timing_path, "a") as f:
                f.write(json.dumps({"step": step, "kind": kind, "seconds": seconds}) + "\n")

    def log_step(self, rec: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.record(rec)
        # MFU needs the device's peak FLOPs and mem a GPU's allocator: a CPU run shows neither.
        line = (
            f"step {rec['step']:>6} | loss {rec['loss']:.4f} | lr {rec['lr']:.2e} | gnorm "
            f"{rec['grad_norm']:.3f} | "
            + (f"{rec['tok_per_s']:,.0f} tok/s" if rec["tok_per_s"] is not None else "compiled")
            + (f" | mfu {rec['mfu']:.1%}" if rec.get("mfu") is not None else "")
            + (f" | mem {rec['mem']}" if rec.get("mem") else "")
        )
        if self.bar is not None:
            self.bar.update(rec["step"] - self.bar.n)
            self.bar.set_postfix_str(f"loss {rec['loss']:.3f}")
        log.info(line)

    def info(self, message: str, *args: object) -> None:
        if self.enabled:
            log.info(message, *args)

    def warning(self, message: str, *args: object) -> None:
        if self.enabled:
            log.warning(message, *args)

    def close(self) -> None:
        for cb in self.callbacks:  # a callback that sends elsewhere (MLflow) flushes here
            getattr(cb, "close", lambda: None)()
        if self.bar is not None:
            self.bar.close()
