"""lm-evaluation-harness on a lehr checkpoint (`python -m lehr lm-eval`), checked against lm-eval's
own Hugging Face model on the checkpoint's `--hf` export: the same requests, the same
log-likelihoods within 1e-4, the same greedy generations. Tasks are lm-eval YAML over local JSONL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from lehr.__main__ import main
from lehr.engine.evals.evaluation import load_model
from lehr.engine.evals.tasks import Scorer, evaluate_task, read_task
from lehr.engine.run.loop import train
from tests import ROOT

FIXTURES = ROOT / "tests/fixtures"
pytestmark = pytest.mark.slow

# One task of each request type lm-eval has. target_delimiter "" keeps lehr's task format as it is:
# the continuation carries its own leading space.
TASKS = {
    "lehr_choice": (
        "tasks/everyday_choice.jsonl",
        "output_type: multiple_choice\ndoc_to_text: context\ndoc_to_choice: choices\ndoc_to_target: label\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n",
    ),
    "lehr_cloze": (
        "tasks/last_word_cloze.jsonl",
        "output_type: loglikelihood\ndoc_to_text: context\ndoc_to_target: target\n"
        "metric_list:\n  - metric: acc\n  - metric: perplexity\n",
    ),
    "lehr_rolling": (  # texts longer than the tiny model's 64 tokens: several windows each
        "lm_eval/texts.jsonl",
        'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: text\n'
        "metric_list:\n  - metric: bits_per_byte\n",
    ),
    "lehr_generate": (
        "tasks/last_word_cloze.jsonl",
        "output_type: generate_until\ndoc_to_text: context\ndoc_to_target: target\n"
        'generation_kwargs:\n  until: ["\\n", "."]\n  max_gen_toks: 8\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n",
    ),
}


def write_tasks(folder: Path) -> Path:
    folder.mkdir()
    for name, (data, body) in TASKS.items():
        (folder / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {FIXTURES / data}\n"
            f'test_split: test\ntarget_delimiter: ""\n{body}'
        )
    return folder


def responses(lines: list[dict]) -> dict:
    """(task, doc) -> its responses as numbers and text (lm-eval's own files write them as strings)."""

    def value(x):
        if isinstance(x, list):
            return (float(x[0]), str(x[1]) == "True")
        try:
            return float(x)
        except ValueError:
            return x

    return {(r["task"], r["doc_id"]): [value(resp[0]) for resp in r["resps"]] for r in lines}


@pytest.fixture
def offline(tmp_path):
    return dict(os.environ, HF_HOME=str(tmp_path / "hf-home"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")


def test_lm_eval_on_a_checkpoint_matches_lm_evals_hf_model_on_its_export(tiny_config, tmp_path, offline):
    train(tiny_config(planned_steps=20))
    final, hf = tmp_path / "run" / "final", tmp_path / "hf"
    assert main(["export", str(final), str(hf), "--hf"]) == 0
    tasks = write_tasks(tmp_path / "yaml")
    names = ",".join(TASKS)
    ours = subprocess.run(
        [sys.executable, "-m", "lehr", "lm-eval", str(final), "--tasks", names, "--include-path", str(tasks)]
        + ["--batch-size", "3", "--log-samples", str(tmp_path / "ours.jsonl")]
        + ["--output", str(tmp_path / "ours.json")],
        env=offline,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert "lehr_choice" in ours.stdout and "acc_norm" in ours.stdout  # the results table
    ref = subprocess.run(
        [sys.executable, "-m", "lm_eval", "run", "--model", "hf", "--device", "cpu", "--log_samples"]
        + ["--model_args", f"pretrained={hf},dtype=float32", "--tasks", names]
        + ["--include_path", str(tasks), "--output_path", str(tmp_path / "ref")],
        env=offline,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ref.returncode == 0, ref.stderr[-3000:]

    got = responses([json.loads(line) for line in (tmp_path / "ours.jsonl").read_text().splitlines()])
    want = responses(
        [
            {**json.loads(line), "task": f.name.removeprefix("samples_").rsplit("_", 1)[0]}
            for f in (tmp_path / "ref").rglob("samples_*.jsonl")
            for line in f.read_text().splitlines()
        ]
    )
    assert got.keys() == want.keys() and {t for t, _ in got} == set(TASKS)
    for key, resps in want.items():
        for mine, theirs in zip(got[key], resps, strict=True):
            if isinstance(theirs, str):  # a greedy generation: the same text
                assert mine == theirs, key
            elif isinstance(theirs, tuple):  # (log-likelihood, is greedy)
                assert mine[0] == pytest.approx(theirs[0], abs=1e-4) and mine[1] == theirs[1], key
            else:  # a rolling log-likelihood, summed over windows
                assert mine == pytest.approx(theirs, abs=1e-4), key

    # lehr's own task evals score the same examples to the same accuracies.
    results = json.loads((tmp_path / "ours.json").read_text())["results"]
    scorer = Scorer(
        load_model(final, torch.device("cpu")),
        Tokenizer.from_file(str(Path(tiny_config().shards) / "tokenizer.json")),
        torch.device("cpu"),
    )
    own = evaluate_task(scorer, read_task(FIXTURES / "tasks/everyday_choice.jsonl"))
    assert own["acc"] == results["lehr_choice"]["acc,none"]
    assert own["acc_norm"] == results["lehr_choice"]["acc_norm,none"]  # ASCII: bytes == characters
    cloze = evaluate_task(scorer, read_task(FIXTURES / "tasks/last_word_cloze.jsonl"))
    assert cloze["acc"] == results["lehr_cloze"]["acc,none"]


def test_lm_eval_refuses_an_unknown_task_or_a_folder_that_is_no_model(tiny_config, tmp_path, capsys):
    train(tiny_config(planned_steps=2))
    final = str(tmp_path / "run" / "final")
    assert main(["lm-eval", final, "--tasks", "no_such_task", "--output", str(tmp_path / "r.json")]) == 2
    assert "unknown lm-eval task(s) no_such_task" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()
    assert main(["lm-eval", str(tmp_path), "--tasks", "lehr_choice"]) == 2
    assert "is neither a checkpoint (state.json) nor an export" in capsys.readouterr().err
