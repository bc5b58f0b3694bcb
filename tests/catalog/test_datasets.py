"""The folder datasets: a save clears what killed saves left (a dead writer's, never a live one's)."""

from __future__ import annotations

import os

from lehr.catalog.branches_dataset import AnnealBranchesDataset
from lehr.catalog.checkpoint_dataset import CheckpointDataset


def test_saving_pre_anneal_clears_a_killed_saves_leftovers(tmp_path, dead_pid):
    models, new = tmp_path / "06_models", tmp_path / "run" / "final"
    new.mkdir(parents=True)
    (new / "state.json").write_text('{"progress": {"step": 20}}')
    parked = models / f".old-pre_anneal-{dead_pid}"  # killed between the two renames of a save
    parked.mkdir(parents=True)
    (parked / "state.json").write_text('{"progress": {"step": 10}}')
    (models / f".tmp-pre_anneal-{dead_pid}").mkdir()  # killed while copying
    (models / f".tmp-other-{dead_pid}").mkdir()  # another artifact's leftovers: not this save's business
    dataset = CheckpointDataset(str(models / "pre_anneal"))
    dataset.save(new)
    assert sorted(p.name for p in models.iterdir() if not p.name.endswith(".lehr.lock")) == [
        f".tmp-other-{dead_pid}",
        "pre_anneal",
    ]
    assert (dataset.load() / "state.json").read_text() == '{"progress": {"step": 20}}'


def test_saving_a_branch_clears_dead_writers_leftovers_and_leaves_other_branches(tmp_path, dead_pid):
    """Every dead writer's leftovers go, whichever branch they were of (none may be versioned);
    a live writer's stay."""
    run, branches = tmp_path / "run", tmp_path / "anneal"
    (run / "final").mkdir(parents=True)
    (run / "final" / "state.json").write_text("{}")
    dataset = AnnealBranchesDataset(str(branches))
    dataset.save({"branch": "b", "run_dir": str(run)})
    (branches / f".tmp-a-{dead_pid}").mkdir()
    (branches / f".tmp-b-{dead_pid}").mkdir()
    (branches / f".tmp-c-{os.getppid()}").mkdir()  # a live process's
    dataset.save({"branch": "a", "run_dir": str(run), "curve": '{"step": 1}\n'})
    assert sorted(p.name for p in branches.iterdir() if not p.name.endswith(".lehr.lock")) == [
        f".tmp-c-{os.getppid()}",
        "a",
        "b",
    ]
    assert dataset.load() == {"a": branches / "a", "b": branches / "b"}
    assert (branches / "a" / "metrics.jsonl").read_text() == '{"step": 1}\n'
