"""Rank 0's record of a run: one readable log line per step interval, the same as JSON lines in
``metrics.jsonl`` (what the run computed) and ``timing.jsonl`` (what the clock said), a progress
bar when interactive, and callbacks (MLflow, tests), which get both."""

from __future__ import annotations

import importlib
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from tqdm.auto import tqdm

from lehr.files.atomic import write_text_atomic

log = logging.getLogger("lehr.train")
Callback = Callable[[list[dict]], None]  # takes records, oldest first


def load_callbacks(specs: list[str]) -> list[Callback]:
    """``module:factory`` strings -> callables; how the glue hooks in without the engine knowing it."""
    out = []
    for spec in specs:
        module, _, name = spec.partition(":")
        out.append(getattr(importlib.import_module(module), name)())
    return out


def flatten(record: dict, prefix: str = "") -> dict:
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


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.is_file() else []


def timing(run_dir: Path) -> tuple[float | None, int | None]:
    """(wall seconds, tokens per second) of a whole run from its ``timing.jsonl``: the steps and
    evals every attempt kept, added up (a resumed run's, not only its last process's)."""
    records = _read(run_dir / TIMING)
    timed = [r for r in records if r.get("seconds") is not None]
    trained = [r for r in timed if r["kind"] == "train" and r.get("tok_per_s")]
    train_seconds = sum(r["seconds"] for r in trained)
    tokens = sum(r["tok_per_s"] * r["seconds"] for r in trained)
    wall = round(sum(r["seconds"] for r in timed), 1) if timed else None
    return wall, round(tokens / train_seconds) if train_seconds else None


class RunLog:
    def __init__(self, out_dir: Path, enabled: bool, start: int, end: int | None, callbacks: list[Callback]):
        self.path, self.timing_path = out_dir / METRICS, out_dir / TIMING
        self.enabled, self.callbacks = enabled, callbacks
        self.bar = None
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

    def _truncate_after(self, step: int) -> list[dict]:
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

    def record(self, rec: dict) -> None:
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

    def step(self, rec: dict) -> None:
        if not self.enabled:
            return
        self.record(rec)
        # MFU needs the device's peak FLOPs and mem a GPU's allocator: a CPU run shows neither.
        line = (
            f"step {rec['step']:>6} | loss {rec['loss']:.4f} | lr {rec['lr']:.2e} | gnorm "
            f"{rec['grad_norm']:.3f} | {rec['tok_per_s']:,.0f} tok/s"
            + (f" | mfu {rec['mfu']:.1%}" if rec.get("mfu") is not None else "")
            + (f" | mem {rec['mem']}" if rec.get("mem") else "")
        )
        if self.bar is not None:
            self.bar.update(rec["step"] - self.bar.n)
            self.bar.set_postfix_str(f"loss {rec['loss']:.3f}")
        log.info(line)

    def info(self, message: str, *args) -> None:
        if self.enabled:
            log.info(message, *args)

    def warning(self, message: str, *args) -> None:
        if self.enabled:
            log.warning(message, *args)

    def close(self) -> None:
        for cb in self.callbacks:  # a callback that sends elsewhere (MLflow) flushes here
            getattr(cb, "close", lambda: None)()
        if self.bar is not None:
            self.bar.close()
