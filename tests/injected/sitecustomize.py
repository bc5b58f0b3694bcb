"""Faults the tests inject into lehr's processes, from outside lehr's code.

Python imports ``sitecustomize`` at start-up from its path, so every process started with this
folder on PYTHONPATH (``tests.faults.env``: a stage under DVC, a torchrun worker) runs this file.
With a fault's variable set, it patches the engine module the fault lives in as that module is
imported; without one it does nothing, and nothing is imported early. In the test process itself
``tests.faults`` applies the same patches with pytest's monkeypatch.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
import time

NONFINITE = "LEHR_FAULT_NONFINITE_STEPS"  # steps (comma-separated) whose loss turns NaN
SLOW_CHECKPOINT = "LEHR_FAULT_SLOW_CHECKPOINT"  # seconds a checkpoint write pauses midway
HELD_CHECKPOINT = "LEHR_FAULT_HELD_CHECKPOINT"  # a file: every checkpoint write waits midway until it exists


def poison_steps(loop, steps: set[int], setattr=setattr) -> None:
    """The loss of each step in ``steps`` turns NaN, in every micro-batch and on every rank, as a
    poisoned batch would make it: the forward's output is multiplied by NaN, before the backward."""
    original = loop.Run.train_step

    def train_step(run):
        if run.prog.step not in steps:
            return original(run)
        forward = run.forward

        def poisoned(x, y):
            logits, loss = forward(x, y)
            return logits, loss * float("nan")

        run.forward = poisoned
        try:
            return original(run)
        finally:
            run.forward = forward

    setattr(loop.Run, "train_step", train_step)


def held_checkpoints(module, release: str, setattr=setattr) -> None:
    """A single-file checkpoint write waits midway until the file ``release`` exists: the run stays
    live, holding its folder, for exactly as long as a test needs, however slow the machine."""
    save_model = module.save_model

    def held_save_model(model, path):
        save_model(model, path)
        while not os.path.exists(release):
            time.sleep(0.05)

    setattr(module, "save_model", held_save_model)


def slow_checkpoints(module, seconds: float, setattr=setattr) -> None:
    """A checkpoint write pauses ``seconds`` midway: in a single-file write once the weights are
    down (``checkpoint``), in an async sharded save before its shards are awaited
    (``sharded_checkpoint``). A kill test aims there."""
    if hasattr(module, "ShardedSaves"):
        wait = module.ShardedSaves.wait

        def slow_wait(saves):
            if saves.in_flight is not None:
                time.sleep(seconds)
            return wait(saves)

        setattr(module.ShardedSaves, "wait", slow_wait)
    else:
        save_model = module.save_model

        def slow_save_model(model, path):
            save_model(model, path)
            time.sleep(seconds)

        setattr(module, "save_model", slow_save_model)


def _patches() -> dict:
    out = {}
    if steps := os.environ.get(NONFINITE):
        wanted = {int(s) for s in steps.split(",") if s.strip()}
        out["lehr.engine.run.loop"] = lambda m: poison_steps(m, wanted)
    if seconds := os.environ.get(SLOW_CHECKPOINT):
        for name in ("lehr.engine.artifacts.checkpoint", "lehr.engine.artifacts.sharded_checkpoint"):
            out[name] = lambda m: slow_checkpoints(m, float(seconds))
    if release := os.environ.get(HELD_CHECKPOINT):
        out["lehr.engine.artifacts.checkpoint"] = lambda m: held_checkpoints(m, release)
    return out


class _Patching(importlib.abc.Loader):
    """A module's own loader, then the patch, right after the module's code has run."""

    def __init__(self, loader, patch):
        self.loader, self.patch = loader, patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)

    def __getattr__(self, name):  # get_source, get_filename, ...: the module's own loader's
        return getattr(self.loader, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: a module to patch is found by the finders after it, then patched."""

    def __init__(self, patches: dict):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        if name not in self.patches:
            return None
        for finder in sys.meta_path:
            if (
                finder is not self
                and hasattr(finder, "find_spec")
                and (spec := finder.find_spec(name, path, target)) is not None
            ):
                spec.loader = _Patching(spec.loader, self.patches[name])
                return spec
        return None


if _wanted := _patches():
    sys.meta_path.insert(0, _PatchOnImport(_wanted))
