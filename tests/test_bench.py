"""The benchmarks run end to end on tiny settings, so they cannot rot unnoticed (they did once:
`bench/train_loop.py` broke when engine callbacks began to take lists of records). These check
that each runs and reports; the figures themselves are measured by `make bench`, not here.

They test the benchmarks, not lehr: `make bench-check` runs them and `make test` leaves them out
(marker ``bench``); CI runs both."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.bench]


def bench(*args: str) -> str:
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


def test_train_loop_benchmark_runs_on_a_tiny_model():
    out = bench(
        "bench/train_loop.py",
        "--preset",
        "tiny",
        "--vocab",
        "512",
        "--batch",
        "8",
        "--micro",
        "4",
        "--steps",
        "2",
        "--warmup",
        "2",
        "--rounds",
        "1",
        "--device",
        "cpu",
        "--matmul-size",
        "256",  # bf16 is emulated on CPUs without bf16 instructions: 1024 took ~9 s here
    )
    assert "ratio lehr/bare" in out and "checkpoint    save" in out
    # A CPU has no known peak: its matmul ceiling is measured beside the loop's FLOP/s, in the run's
    # precision (bf16 where the CPU has bf16 instructions, fp32 where it has not).
    precision = re.search(r"precision (\w+)", out).group(1)
    ceiling = "bf16" if precision == "bf16" else "fp32"
    pattern = rf"achieved [\d.,]+ G .* = [\d.]+% of this device's {ceiling} matmul .* bf16 [\d.,]+ G, fp32"
    assert re.search(pattern, out), out


def test_train_loop_benchmark_compares_muon_work_over_two_processes():
    out = bench(
        "bench/train_loop.py",
        *("--preset", "tiny", "--vocab", "512", "--batch", "8", "--micro", "4"),
        *("--steps", "2", "--warmup", "2", "--rounds", "1", "--device", "cpu", "--processes", "2"),
    )
    assert "muon_work shared" in out and "muon_work redundant" in out
    assert out.strip().splitlines()[-1].startswith("shared / redundant: ")


def test_recipe_speed_benchmark_runs_both_recipes():
    out = bench("bench/recipe_speed.py", "--vocab", "512", "--steps", "1", "--warmup", "1", "--rounds", "1")
    assert "before" in out and "default" in out and "ratio default/before" in out


def test_recipe_speed_benchmark_times_the_ledgers_ingredients_beside_the_default():
    out = bench(
        "bench/recipe_speed.py",
        *("--vocab", "512", "--steps", "1", "--warmup", "1", "--rounds", "1"),
        *("--ingredients", "relu2", "tail-average", "batch-warmup"),
    )
    assert "ratio relu2/default" in out
    # ReLU² at SwiGLU's size: the model the ledger trains, d_ff 1032.
    assert re.search(r"relu2 .* 3 x 256 wide", out), out
    assert "tail-average     not timed: it changes the anneal alone" in out
    assert (
        "batch-warmup     not timed: it changes the anneal alone (whose stable phase is the default's) or "
        in out
    )


def test_newton_schulz_benchmark_runs_on_a_tiny_model():
    out = bench(
        "bench/newton_schulz.py", "--preset", "tiny", "--vocab", "512", "--reps", "2", "--device", "cpu"
    )
    assert "14 hidden matrices" in out and "speed-up" in out
    shared = bench(
        "bench/newton_schulz.py",
        "--processes",
        "2",
        "--shared-presets",
        "tiny",
        "--vocab",
        "512",
        "--reps",
        "2",
    )
    assert "FSDP shared (in turn)" in shared and "FSDP shared (by cost) / redundant" in shared
    assert shared.strip().splitlines()[-1].startswith("shared / redundant: ")


def test_scale_benchmark_runs_the_real_stages_on_two_small_corpora():
    out = bench("bench/scale.py", "--sizes-mb", "2", "4")
    rows = [line.split()[2] for line in out.splitlines() if line.strip().split()[1:2] == ["MB"]]
    assert rows == ["tokenize", "shard", "tokenize", "shard"], out
    assert "tokenize peak 4 MB / 2 MB" in out and "ratio" in out


def test_scale_benchmark_measures_one_text_file_of_one_line_at_two_sizes():
    out = bench("bench/scale.py", "--one-file-mb", "1", "3")
    rows = [line for line in out.splitlines() if line.startswith("one .txt line of")]
    assert len(rows) == 2 and all("tokenize" in r and "peak PSS" in r for r in rows), out
    assert "tokenize peak, one line of 3 MB / 1 MB" in out


def test_lr_transfer_benchmark_sweeps_rungs_on_the_smoke_shards(smoke_shards):
    out = bench(
        "bench/lr_transfer.py",
        *("--shards", str(smoke_shards), "--depths", "1,2", "--multipliers", "1,2"),
        *("--tokens", "8192", "--optimizers", "muon"),
    )
    assert "muon: best multiplier per depth" in out and "held-out" in out


def test_ladder_extrapolation_benchmark_trains_a_rung_past_the_committed_fit(smoke_shards, tmp_path):
    out = bench(
        "bench/ladder_extrapolation.py",
        *("--shards", str(smoke_shards), "--depth", "5", "--budget", "4096", "--runs", str(tmp_path)),
    )
    # A rung of depth 5 is past the fit's depths 1 to 4: the fit's own interval, and where it lies.
    assert re.search(r"extrapolation rung: depth 5 \([\d,]+ parameters, [\d.]+x the largest", out), out
    assert re.search(r"fit predicts \d\.\d{4} \[\d\.\d{4}, \d\.\d{4}\]: [+-]\d+\.\d\d%, (in|out)side", out)
    assert (tmp_path / "rung-5.json").is_file()


def bench_in_a_copy(smoke_repo, tmp_path, script: str, *args: str) -> tuple[Path, str]:
    """The smoke repo copied and committed (its pipeline up to date), and ``script``'s output there."""
    import shutil

    from tests.e2e import env, sh

    repo = tmp_path / "repo"
    shutil.copytree(smoke_repo, repo, symlinks=True)
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "baseline", "--allow-empty")
    cmd = [sys.executable, str(ROOT / script), "--project", str(repo), *args]
    out = subprocess.run(cmd, cwd=repo, env=env(), capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return repo, out.stdout


def test_parallel_queue_benchmark_runs_two_experiments_each_way_on_the_smoke_repo(smoke_repo, tmp_path):
    from tests.e2e import sh

    repo, out = bench_in_a_copy(
        smoke_repo, tmp_path, "bench/parallel_queue.py", "--values", "linear", "cosine"
    )
    assert re.search(r"ratio \(-j 2 / -j 1\):\s+\d\.\d{3}", out), out
    assert "the anneal's figures identical" in out
    assert sh(repo, "dvc", "exp", "list", "--name-only").stdout.strip() == ""  # the bench's own, removed
    assert not list((repo / "data/06_models/anneal_runs").glob("par-*"))  # and their rolling folders


def test_speedrun_benchmark_times_two_commits_side_by_side_on_the_smoke_repo(smoke_repo, tmp_path):
    from tests.e2e import sh

    # The candidate logs more often: the same training, so the same bits per byte.
    candidate = "conf/smoke/parameters_pretrain_stable.yml:pretrain.log_every=2"
    # A budget of 0.8: the smoke profile keeps a branch point at step 20, past 60% of its steps.
    args = ("--baseline", "HEAD", "--candidate", "HEAD", "-S", candidate, "--at-budget", "--budget", "0.8")
    repo, out = bench_in_a_copy(smoke_repo, tmp_path, "bench/speedrun.py", *args)
    assert "the default arm's own" in out  # the smoke profile has no committed figure
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.startswith(("default", "candidate"))
    }
    assert set(rows) >= {"default", "candidate*", "default-at-budget*"}, out
    assert rows["default"][5] == rows["candidate*"][5]  # the same training, the same bits per byte
    assert re.search(r"ratio \(candidate / default\): \d\.\d{3}: reaches the target", out), out
    assert re.search(r"ratio \(default-at-budget / default\): \d\.\d{3}: ", out), out
    assert not (repo / "build/speedrun/default").exists()  # its worktrees removed, its logs kept
    assert len(list((repo / "build/speedrun/logs").glob("*.log"))) == 3
    assert sh(repo, "git", "worktree", "list").stdout.count("\n") == 1


def test_gpu_line_runs_its_steps_on_a_cpu(smoke_shards, tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    cloze = {"context": "the people of the", "target": " nation"}
    choice = {"context": "We met.", "choices": [" It rained.", " We spoke."], "label": 1}
    (tasks / "cloze.jsonl").write_text(json.dumps(cloze) + "\n")
    (tasks / "choice.jsonl").write_text(json.dumps(choice) + "\n")
    out = bench(
        "bench/gpu_line.py",
        *("--presets", "tiny", "--device", "cpu", "--tokens", "8192", "--eval-every", "8"),
        *("--eval-windows", "2", "--shards", str(smoke_shards), "--tasks", str(tasks)),
    )
    pattern = (
        r"tiny: 16 steps, 8,192 tokens in [\d.]+ s on \w+ \(\w+, FSDP2, Muon\): [\d,]+ tok/s, "
        r"[\d.]+% of this device's bf16 matmul; 2 evals [\d.]+% of the time, compiling [\d.]+%"
    )
    assert re.search(pattern, out), out
