"""Task scoring: log-likelihoods as computed by hand, the same alone or in a padded batch, the
metrics (acc, acc_norm by UTF-8 bytes, greedy cloze) with their standard errors and chance levels,
task files checked line by line, and `lehr eval` / `lehr generate` on a real checkpoint."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from lehr.__main__ import main
from lehr.engine.artifacts.checkpoint import seed_all
from lehr.engine.evals.tasks import Example, Scored, Scorer, Task, TaskError, evaluate_task, read_task
from lehr.engine.model import Transformer, preset
from lehr.engine.run.loop import train

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks"


@pytest.fixture
def scorer(smoke_shards):
    seed_all(0)
    model = Transformer(preset("tiny", 512)).eval()
    return Scorer(model, Tokenizer.from_file(str(smoke_shards / "tokenizer.json")), torch.device("cpu"), 3)


def test_a_continuations_loglik_is_the_sum_of_its_tokens_log_probabilities(scorer):
    ctx, cont = scorer.encode_pair("The President said that ", "the budget")
    assert ctx and cont and scorer.tokenizer.decode(cont).startswith(" the")  # the space went with it
    ids = torch.tensor([ctx + cont])
    logits, _ = scorer.model(ids[:, :-1])
    logprobs = F.log_softmax(logits.float(), dim=-1)[0]
    by_hand = sum(logprobs[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont))
    greedy = all(logprobs[len(ctx) - 1 + i].argmax().item() == t for i, t in enumerate(cont))
    (got,) = scorer.score([("The President said that ", "the budget")])
    assert got.loglik == pytest.approx(by_hand, abs=1e-5) and got.greedy == greedy and not got.truncated


def test_an_example_scores_the_same_alone_and_in_a_padded_batch(scorer):
    pairs = [
        ("A", " b"),
        ("The long context of the State of the Union", " is long"),
        ("", "Hello"),
        ("x y", " z"),
    ]
    batched = scorer.score(pairs)  # one batch, padded to its longest
    for pair, together in zip(pairs, batched, strict=True):
        (alone,) = scorer.score([pair])
        assert alone.loglik == pytest.approx(together.loglik, abs=1e-5) and alone.greedy == together.greedy


def test_the_choices_of_one_context_share_a_row_and_score_as_they_do_alone(scorer):
    context = "The State of the Union is"
    choices = [" strong", " a long speech about the budget", " x", " strong and growing"]
    too_long = " ".join(["word"] * 2 * scorer.seq_len)  # cut to fit: it keeps a row of its own
    pairs = [(context, c) for c in choices] + [(context, too_long), ("Another context", " y")]
    encoded = [scorer.encode_pair(c, x) for c, x in pairs]
    rows = scorer._rows(encoded)
    assert sorted(len(row.scored) for row in rows) == [1, 1, 4]  # the four choices after one context
    together = scorer.score(pairs)
    for pair, got in zip(pairs, together, strict=True):
        (alone,) = scorer.score_tokens([scorer.encode_pair(*pair)])  # a single pair is never packed
        assert got.loglik == pytest.approx(alone.loglik, rel=1e-6, abs=1e-5)
        assert (got.greedy, got.truncated) == (alone.greedy, alone.truncated)
    assert together[4].truncated and not any(s.truncated for s in together[:4])


def test_a_row_of_shared_context_is_no_longer_than_the_model_sees(scorer):
    ctx = scorer.encode_pair("The State of the Union is", " x")[0]
    choices = [[5 + i] * 10 for i in range(3 * scorer.seq_len // 10)]  # many more than one row holds
    encoded = [(ctx, c) for c in choices] + [(ctx, [])]  # and one with nothing to score
    rows = scorer._rows(encoded)
    assert len(rows) > 2 and all(len(row.ids) <= scorer.seq_len for row in rows)
    together = scorer.score_tokens(encoded)
    for pair, got in zip(encoded[:-1], together, strict=False):  # the last, checked below
        (alone,) = scorer.score_tokens([pair])
        assert got.loglik == pytest.approx(alone.loglik, rel=1e-6, abs=1e-5) and got.greedy == alone.greedy
    assert together[-1] == Scored(0.0, True, False)  # an empty continuation: certain, as before


def test_a_context_longer_than_the_model_sees_is_cut_from_the_left_and_counted(scorer):
    long = " ".join(["word"] * (4 * scorer.seq_len))
    (got,) = scorer.score([(long, " end")])
    assert got.truncated and math.isfinite(got.loglik)


class FixedScorer:
    """Hands back chosen log-likelihoods, to check the metrics alone."""

    def __init__(self, logliks: list[float], greedy: list[bool] | None = None):
        self.scores = [
            Scored(ll, g, False) for ll, g in zip(logliks, greedy or [False] * len(logliks), strict=True)
        ]
        self.model = type("M", (), {"cfg": type("C", (), {"vocab_size": 10})})()

    def score(self, pairs):
        assert len(pairs) == len(self.scores)
        return self.scores

    def encode_pair(self, context, continuation):
        return [0], [1] * len(continuation.split())


def test_acc_compares_summed_logliks_and_acc_norm_divides_by_utf8_bytes():
    task = Task("t", "choice", (Example("c", ("a", "bbbb"), label=1), Example("c", ("é", "xx"), label=0)))
    # Example 1: -2 vs -4 -> acc picks "a" (wrong); per byte -2 vs -1 -> acc_norm picks "bbbb" (right).
    # Example 2: "é" is 2 bytes: -3 vs -2.5 -> acc picks "xx" (wrong); per byte -1.5 vs -1.25 (wrong).
    got = evaluate_task(FixedScorer([-2, -4, -3, -2.5]), task)
    assert got["acc"] == 0.0 and got["acc_norm"] == 0.5 and got["chance"] == 0.5
    assert got["acc_norm_stderr"] == pytest.approx(math.sqrt(0.5 / 2))  # sample std / sqrt(n)
    assert got["examples"] == 2 and got["truncated"] == 0


def test_cloze_acc_is_the_greedy_match_and_chance_is_one_in_the_vocabulary_per_token():
    task = Task("t", "cloze", (Example("c", target=" one"), Example("c", target=" two words")))
    got = evaluate_task(FixedScorer([-1.0, -5.0], [True, False]), task)
    assert got["acc"] == 0.5 and got["loglik"] == -3.0
    assert got["chance"] == pytest.approx((1 / 10 + 1 / 100) / 2)


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", ":1: not a JSON object"),
        (
            '{"context": "c", "choices": ["a", "b"], "label": 2}',
            ':1: "label" = 2 must index "choices" (0..1)',
        ),
        ('{"context": "c", "choices": [], "label": 0}', ':1: "choices" must be a non-empty list'),
        ('{"choices": ["a"], "label": 0}', ':1: needs a string "context"'),
        ('{"context": "c", "answer": "a"}', ":1: an example is"),
        (
            '{"context": "c", "target": "a"}\n{"context": "c", "choices": ["a"], "label": 0}',
            ":2: a choice example in a task of cloze examples",
        ),
        ("\n", "holds no examples"),
    ],
)
def test_a_bad_task_file_is_refused_naming_the_line(tmp_path, line, message):
    path = tmp_path / "task.jsonl"
    path.write_text(line)
    with pytest.raises(TaskError, match=None) as e:
        read_task(path)
    assert message in str(e.value) and str(path) in str(e.value)


def test_the_fixture_tasks_read_as_their_kinds():
    assert read_task(FIXTURES / "everyday_choice.jsonl").kind == "choice"
    assert read_task(FIXTURES / "last_word_cloze.jsonl").kind == "cloze"


def test_eval_and_generate_run_on_a_trained_checkpoint(tiny_config, tmp_path, capsys):
    train(tiny_config(planned_steps=5))
    final = str(tmp_path / "run" / "final")
    for task in ("everyday_choice", "last_word_cloze"):
        assert main(["eval", final, "--task", str(FIXTURES / f"{task}.jsonl")]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["task"] == task and 0 <= result["acc"] <= 1 and result["examples"] > 0
        assert "acc_stderr" in result and 0 < result["chance"] < 1
    assert main(["generate", final, "--prompt", "The", "--max-tokens", "8", "--seed", "1"]) == 0
    first = capsys.readouterr().out
    assert first.startswith("The") and len(first) > len("The\n")
    main(["generate", final, "--prompt", "The", "--max-tokens", "8", "--seed", "1"])
    assert capsys.readouterr().out == first  # the seed fixes the sample
    assert main(["eval", str(tmp_path), "--task", str(FIXTURES / "everyday_choice.jsonl")]) == 2
    assert "is neither a checkpoint (state.json) nor an export" in capsys.readouterr().err


def test_eval_and_generate_give_the_same_on_a_checkpoint_and_its_exports(tiny_config, tmp_path, capsys):
    train(tiny_config(planned_steps=5))
    final = str(tmp_path / "run" / "final")
    main(["export", final, str(tmp_path / "plain")])
    main(["export", final, str(tmp_path / "hf"), "--hf"])
    capsys.readouterr()
    results, samples = {}, {}
    for name, folder in (("ckpt", final), ("plain", tmp_path / "plain"), ("hf", tmp_path / "hf")):
        for task in ("last_word_cloze", "everyday_choice"):  # the choices share a row with their context
            assert main(["eval", str(folder), "--task", str(FIXTURES / f"{task}.jsonl")]) == 0
            results[name, task] = json.loads(capsys.readouterr().out)
        assert main(["generate", str(folder), "--max-tokens", "6", "--temperature", "0.01"]) == 0
        samples[name] = capsys.readouterr().out
    figures = {n: {k: v for k, v in r.items() if k not in ("task", "kind")} for n, r in results.items()}
    for name in ("plain", "hf"):
        for task in ("last_word_cloze", "everyday_choice"):
            assert figures[name, task] == pytest.approx(figures["ckpt", task], abs=1e-4)
        assert samples[name] == samples["ckpt"]  # near-greedy: the same text from the same logits


def test_task_evals_in_the_loop_are_logged_and_leave_training_exactly_as_it_was(tiny_config, tmp_path):
    from tests.engine.test_resume import assert_same_final

    files = {name: str(FIXTURES / f"{name}.jsonl") for name in ("everyday_choice", "last_word_cloze")}
    run_ = dict(planned_steps=20, eval_every=10)
    train(tiny_config(out_dir=str(tmp_path / "plain"), task_examples=0, **run_))
    metric = "tasks.last_word_cloze.loglik"  # what the best checkpoint goes by, higher is better
    train(
        tiny_config(
            out_dir=str(tmp_path / "tasks"), task_files=files, task_examples=3, decide_by=metric, **run_
        )
    )
    evals = [json.loads(line) for line in (tmp_path / "tasks" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [10, 20]
    assert all(
        r["tasks.everyday_choice.examples"] == 3 and "tasks.last_word_cloze.acc_stderr" in r for r in evals
    )
    best = json.loads((tmp_path / "tasks" / "best" / "state.json").read_text())["progress"]["step"]
    assert best == max(evals, key=lambda r: r[metric])["step"]
    assert_same_final(
        tmp_path / "plain", tmp_path / "tasks"
    )  # scoring draws no randomness, changes no weight
