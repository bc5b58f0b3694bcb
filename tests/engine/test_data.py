"""The shard stream: deterministic, resumable by position, disjoint across ranks, verified."""

import shutil

import numpy as np
import pytest
import torch

from lehr.engine.batches import DataError, ShardSet, TrainStream, eval_windows

MIX = {"gold": 1.0, "silver": 1.0}


def test_windows_depend_only_on_seed_and_step(smoke_shards):
    shards = ShardSet(smoke_shards, 512, 64)
    a, b = TrainStream(shards, 64, data_seed=7), TrainStream(shards, 64, data_seed=7)
    assert np.array_equal(a.global_batch(3, 8, MIX), b.global_batch(3, 8, MIX))
    assert not np.array_equal(a.global_batch(3, 8, MIX), a.global_batch(4, 8, MIX))
    assert not np.array_equal(a.global_batch(3, 8, MIX), TrainStream(shards, 64, 8).global_batch(3, 8, MIX))


def test_state_round_trip_resumes_the_same_batches(smoke_shards):
    shards = ShardSet(smoke_shards, 512, 64)
    straight = TrainStream(shards, 64, 1)
    seen = [straight.next_batches(8, MIX, 0, 1, 4, torch.device("cpu")) for _ in range(5)]
    first = TrainStream(shards, 64, 1)
    for _ in range(2):
        first.next_batches(8, MIX, 0, 1, 4, torch.device("cpu"))
    resumed = TrainStream(shards, 64, 999)
    resumed.load_state_dict(first.state_dict())
    for expected in seen[2:]:
        got = resumed.next_batches(8, MIX, 0, 1, 4, torch.device("cpu"))
        assert all(torch.equal(x, y) for (x, _), (y, _) in zip(got, expected, strict=True))


def test_ranks_draw_disjoint_slices_of_one_global_batch(smoke_shards):
    shards = ShardSet(smoke_shards, 512, 64)
    full = TrainStream(shards, 64, 1).global_batch(0, 8, MIX)
    parts = []
    for rank in range(2):
        stream = TrainStream(shards, 64, 1)
        parts.append(torch.cat([x for x, _ in stream.next_batches(8, MIX, rank, 2, 2, torch.device("cpu"))]))
    rows = {tuple(r) for p in parts for r in p.tolist()}
    assert len(rows) == 8 and rows == {tuple(r[:-1]) for r in full.tolist()}


def test_mix_weights_steer_the_tiers(smoke_shards):
    shards = ShardSet(smoke_shards, 512, 64)
    batch = TrainStream(shards, 64, 1).global_batch(0, 64, {"gold": 1.0, "silver": 0.0})
    silver_only = TrainStream(shards, 64, 1).global_batch(0, 64, {"silver": 1.0})
    assert len(batch) == 64 and not np.array_equal(batch, silver_only)
    with pytest.raises(DataError, match="names tier 'bronze'"):
        TrainStream(shards, 64, 1).global_batch(0, 4, {"bronze": 1.0})


def test_eval_windows_are_fixed(smoke_shards):
    shards = ShardSet(smoke_shards, 512, 64)
    src = shards.heldout()[0]
    assert np.array_equal(eval_windows(src, 64, 8), eval_windows(src, 64, 8))
    assert eval_windows(src, 64, 8).shape == (8, 65)


def test_vocab_mismatch_and_long_sequences_are_refused(smoke_shards):
    with pytest.raises(DataError, match="vocab mismatch.*512 tokens but the model has vocab_size 1000"):
        ShardSet(smoke_shards, 1000, 64)
    with pytest.raises(DataError, match="model.seq_len = 9000 is longer than every shard"):
        ShardSet(smoke_shards, 512, 9000)


def test_flipped_bytes_in_a_shard_are_caught(smoke_shards, tmp_path):
    copy = tmp_path / "shards"
    shutil.copytree(smoke_shards, copy)
    victim = sorted(copy.glob("train/gold/*.bin"))[0]
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"000000.bin does not match the sha256.*dvc checkout"):
        ShardSet(copy, 512, 64)


def test_corrupt_manifest_is_refused(smoke_shards, tmp_path):
    copy = tmp_path / "shards"
    shutil.copytree(smoke_shards, copy)
    (copy / "manifest.json").write_text('{"format": 1, "dtype"')
    with pytest.raises(DataError, match="manifest.json is corrupt.*dvc repro --force shard"):
        ShardSet(copy, 512, 64)


def test_tokens_per_tier_replays_the_tier_draws(smoke_shards):
    shards = ShardSet(smoke_shards, 512, 64)
    stream = TrainStream(shards, 64, 1)
    mix_at = lambda step: MIX if step < 10 else {"gold": 1.0}  # noqa: E731 - a stable then an anneal mix
    tiers = stream.tokens_per_tier(range(0, 20), lambda _: 8, mix_at)
    assert sum(t["tokens"] for t in tiers.values()) == 20 * 8 * 64
    only_gold = stream.tokens_per_tier(range(10, 20), lambda _: 8, mix_at)
    assert set(only_gold) == {"gold"} and only_gold["gold"]["tokens"] == 10 * 8 * 64
    for tier, t in tiers.items():
        assert t["tier_tokens"] == shards.sources[f"train/{tier}"].n_tokens
        assert t["epochs"] == pytest.approx(t["tokens"] / t["tier_tokens"])
    assert tiers["gold"]["tokens"] > tiers["silver"]["tokens"]  # gold alone from step 10 on


def test_a_tier_repeated_too_often_is_warned_about_at_start(tiny_config, caplog):
    import logging

    from lehr.engine.run.loop import train

    with caplog.at_level(logging.INFO, logger="lehr"):
        summary = train(tiny_config(planned_steps=10, max_epochs_warn=0.001))
    assert "data, planned to step 10: gold" in caplog.text
    assert "would be repeated more than pretrain.max_epochs_warn = 0.001 times" in caplog.text
    assert set(summary["tiers"]) == {"gold", "silver"}
    assert sum(t["tokens"] for t in summary["tiers"].values()) == summary["tokens"]
