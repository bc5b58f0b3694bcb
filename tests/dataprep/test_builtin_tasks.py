"""Task files made from the held-out split: documents cut at the end-of-text token, LAMBADA-style
last-word clozes, 4-way next-sentence choices with distractors from other documents of the same
source, deterministic for a seed; and evaluate's choice of tasks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lehr.dataprep.builtin_tasks import documents, last_word, make_tasks, next_sentence
from lehr.params.stages import EvaluateParams
from lehr.pipelines.evaluate.scoring import chosen_tasks

DOC_A = (
    "The river rose through the night and the town waited. Boats were tied to every door. "
    "By morning the water reached the old mill. Nobody slept in the valley that night.\n\n"
    "When the sun came up the people counted their losses and began to rebuild the bridge."
)
DOC_B = (
    "Bread needs flour, water, salt and time. The dough rests while the yeast works slowly. "
    "A hot oven gives the crust its colour. Good bakers wait for the loaf to cool."
)
DOC_C = (
    "The council met on Tuesday to discuss the harbour. Fishermen asked for a longer season. "
    "The mayor promised an answer within a month. Everyone went home with questions."
)


def test_documents_are_cut_at_the_end_of_text_token_across_chunks():
    eot = 0
    chunks = [np.array([5, 6, eot, 7]), np.array([8, eot]), np.array([9])]
    docs = list(documents(iter(chunks), eot, lambda ids: ",".join(map(str, ids))))
    assert docs == [(0, "5,6"), (1, "7,8"), (2, "9")]


def test_a_cloze_asks_for_the_last_word_of_a_paragraph():
    got = last_word([(0, DOC_A)], limit=10)
    assert got[0]["target"] == " night" and got[0]["context"].endswith("Nobody slept in the valley that")
    assert got[1]["target"] == " bridge" and "Nobody slept" in got[1]["context"]  # the text before it too


def test_next_sentence_choices_hold_the_true_sentence_and_others_from_other_documents():
    docs = [(0, DOC_A), (1, DOC_B), (2, DOC_C)]
    examples = next_sentence(docs, limit=10, seed=0, source="s")
    assert examples
    for ex in examples:
        assert len(ex["choices"]) == 4 and len(set(ex["choices"])) == 4 and 0 <= ex["label"] < 4
        right = ex["choices"][ex["label"]].strip()
        home = next(text for _, text in docs if ex["context"].split(". ")[0] in text)
        assert right in home  # the true next sentence comes from the same document...
        assert all(
            c.strip() not in home for i, c in enumerate(ex["choices"]) if i != ex["label"]
        )  # ...the others not
    assert next_sentence(docs, 10, 0, "s") == examples  # deterministic
    assert [e["label"] for e in next_sentence(docs, 10, 1, "s")] != [e["label"] for e in examples] or len(
        examples
    ) < 3


def test_tasks_are_made_per_source_up_to_the_limit():
    tasks = make_tasks(
        {"news": [(0, DOC_A), (1, DOC_B), (2, DOC_C)], "tiny": [(0, "too short")]}, limit=1, seed=0
    )
    assert set(tasks) == {"heldout_last_word", "heldout_next_sentence"}
    assert len(tasks["heldout_last_word"]) == 1 and len(tasks["heldout_next_sentence"]) == 1


def _params(tasks):
    return EvaluateParams(
        branches=[], eval_windows=4, sample_prompt="The", sample_tokens=0, baseline="", tasks=tasks
    )


def test_evaluate_refuses_an_unknown_task_listing_the_ones_there_are(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"context": "a", "target": " b"}\n')
    assert [t.name for t in chosen_tasks({}, {"mine": path}, _params(["all"]))] == ["mine"]
    with pytest.raises(ValueError, match="unknown task.s. nope in evaluate.tasks; the tasks are: mine"):
        chosen_tasks({}, {"mine": path}, _params("nope"))
    with pytest.raises(ValueError, match="have the name of a built-in task"):
        chosen_tasks({"mine": Path("x")}, {"mine": path}, _params(["all"]))
