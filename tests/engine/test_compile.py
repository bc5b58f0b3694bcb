"""A compiled run (``compile: true``, the default run's setting) is as reproducible as an eager one:
two processes that each compile from an empty cache train the same bits (a fresh clone's
``dvc repro`` must give the committed lock), and a compiled run stopped and resumed in new
processes, from a warm cache, ends where the uninterrupted one did. Each run is a process of its
own, as a stage is, so that no compiled code is shared but through the cache folder named; each
process's first step, which compiles, is timed apart from the steps."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.test_resume import assert_same_final, train_curve

pytestmark = pytest.mark.integration  # compiling costs ~20 s a cold process; make test stays eager

TRAIN = (
    "import json, sys; from lehr.engine.config import TrainConfig; from lehr.engine.run.loop import "
    "train; train(TrainConfig(**json.load(open(sys.argv[1]))))"
)


def _train(config, cache: Path, **overrides) -> None:
    cfg = config(compile=True, **overrides)
    job = Path(cfg.out_dir).with_suffix(".json")
    job.write_text(json.dumps(cfg.to_dict()))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    subprocess.run([sys.executable, "-c", TRAIN, str(job)], env=env, check=True)


def test_compiled_runs_repeat_each_other_and_resume_exactly(tiny_config, tmp_path):
    # bf16 and Muon as the default run trains, with value embeddings: every lookup the model has
    model = dataclasses.replace(tiny_config().model, value_embeds=True)
    run = dict(model=model, precision="bf16", optimizer="muon", planned_steps=30)
    run.update(anneal_start=20, anneal_steps=10)
    _train(tiny_config, tmp_path / "cache-a", out_dir=str(tmp_path / "straight"), **run)
    _train(tiny_config, tmp_path / "cache-b", out_dir=str(tmp_path / "stopped"), end_step=13, **run)
    _train(tiny_config, tmp_path / "cache-b", out_dir=str(tmp_path / "stopped"), **run)  # warm cache
    assert_same_final(tmp_path / "straight", tmp_path / "stopped")
    assert train_curve(tmp_path / "straight") == train_curve(tmp_path / "stopped")
    # Each process's first step compiled, timed apart from the steps' tok/s.
    assert _compiled_at(tmp_path / "straight") == [1] and _compiled_at(tmp_path / "stopped") == [1, 14]


def _compiled_at(run: Path) -> list[int]:
    records = [json.loads(line) for line in (run / "timing.jsonl").read_text().splitlines()]
    return [r["step"] for r in records if r["kind"] == "compile"]
