"""Differences with confidence: a paired bootstrap over the same windows and examples, and
``python -m lehr compare`` refusing models that were not scored on the same items."""

from __future__ import annotations

import numpy as np
import pytest

from lehr.__main__ import main
from lehr.engine.run.loop import train
from lehr.reports.comparison import check_comparable, paired


def test_a_shift_shared_by_every_item_is_significant_and_noise_is_not():
    rng = np.random.default_rng(0)
    a = rng.normal(5.0, 1.0, 200)  # items vary a lot; the models differ by one constant
    shifted = paired(a, a - 0.05)
    assert shifted["diff"] == pytest.approx(-0.05) and shifted["significant"]
    assert shifted["lo"] == pytest.approx(-0.05) and shifted["hi"] == pytest.approx(-0.05)
    noise = paired(a, a + rng.normal(0.0, 0.1, 200))
    assert noise["lo"] < 0 < noise["hi"] and not noise["significant"]
    # Weighted: the difference per byte, over items of unequal size.
    weighted = paired(np.array([1.0, 2.0]), np.array([2.0, 4.0]), np.array([1.0, 3.0]))
    assert weighted["diff"] == pytest.approx(3.0 / 4.0)


def test_models_of_other_windows_or_tokenizers_are_refused():
    state = {"tokenizer_sha256": "t", "manifest_sha256": "m", "config": {"model": {"seq_len": 64}}}
    check_comparable(state, state, ("a", "b"))
    with pytest.raises(ValueError, match="different tokenizer"):
        check_comparable(state, {**state, "tokenizer_sha256": "u"}, ("a", "b"))
    with pytest.raises(ValueError, match="different shards"):
        check_comparable(state, {**state, "manifest_sha256": "n"}, ("a", "b"))
    with pytest.raises(ValueError, match="64-token windows and b 128-token ones"):
        check_comparable(state, {**state, "config": {"model": {"seq_len": 128}}}, ("a", "b"))


def test_compare_prints_each_difference_with_its_interval(tiny_config, tmp_path, capsys):
    short = train(
        tiny_config(out_dir=str(tmp_path / "short"), planned_steps=4, anneal_start=2, anneal_steps=2)
    )
    long = train(
        tiny_config(out_dir=str(tmp_path / "long"), planned_steps=40, anneal_start=20, anneal_steps=20)
    )
    assert main(["compare", short["final"], long["final"], "--windows", "8"]) == 0
    out = capsys.readouterr().out
    # 40 steps against 4 of one tiny model: better on every source, clearly.
    assert f"{long['final']} - {short['final']}" in out
    assert all(f"{long['final']} better" in line for line in out.splitlines() if ".bpb" in line)
