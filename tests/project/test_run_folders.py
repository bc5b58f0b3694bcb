"""`python -m lehr runs` / `prune`: rolling folders are listed with their state, and pruning removes
only finished ones that nothing in the workspace came from (unfinished ones only when asked)."""

from __future__ import annotations

import json
from pathlib import Path

from lehr.__main__ import main


def checkpoint(path: Path, out_dir: Path) -> None:
    path.mkdir(parents=True)
    (path / "state.json").write_text(json.dumps({"config": {"out_dir": str(out_dir)}}))
    (path / "model.safetensors").write_bytes(b"\0" * 1000)


def run_folder(models: Path, sub: str, name: str, steps: list[int], end: str | None) -> Path:
    run = models / sub / name
    for step in steps:
        checkpoint(run / "checkpoints" / f"step_{step:08d}", run)
    if end:
        checkpoint(run / end, run)
    return run


def layout(tmp_path: Path, monkeypatch) -> dict[str, Path]:
    """Run folders in a project whose catalog puts the models under ``06_models`` (the commands
    read every path from the catalog of the project they run in)."""
    models = tmp_path / "06_models"
    (tmp_path / "conf" / "base").mkdir(parents=True)
    (tmp_path / "conf" / "local").mkdir()
    (tmp_path / "conf" / "base" / "catalog.yml").write_text(
        "".join(
            f"{name}:\n  type: lehr.catalog.RunDirDataset\n  path: 06_models/{folder}\n"
            for name, folder in [
                ("stable_run", "stable_run"),
                ("pre_anneal", "pre_anneal"),
                ("anneal_runs", "anneal_runs"),
            ]
        )
        + "anneal_branches:\n  type: lehr.catalog.AnnealBranchesDataset\n  path: 06_models/anneal\n"
        "  by_hand: 06_models/branches\n"
    )
    monkeypatch.chdir(tmp_path)
    runs = {
        "current": run_folder(models, "stable_run", "auto-current", [300, 400], "pre_anneal"),
        "old": run_folder(models, "stable_run", "auto-old", [200], "pre_anneal"),
        "killed": run_folder(models, "stable_run", "auto-killed", [100], None),
        "branch": run_folder(models, "anneal_runs", "linear-b-1", [500], "final"),
        "old_branch": run_folder(models, "anneal_runs", "linear-b-0", [500], "final"),
    }
    checkpoint(models / "pre_anneal", runs["current"])
    checkpoint(models / "anneal" / "linear-b" / "final", runs["branch"])
    return runs


def test_runs_lists_state_use_and_size(tmp_path, capsys, monkeypatch):
    layout(tmp_path, monkeypatch)
    assert main(["runs"]) == 0
    rows = {line.split()[1]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["auto-current"][2:5] == ["400", "finished", "yes"]
    assert rows["auto-killed"][2:5] == ["100", "stopped", "no"]
    assert rows["linear-b-0"][0] == "anneal" and rows["linear-b-0"][4] == "no"


def test_prune_says_first_then_removes_only_finished_folders_not_in_use(tmp_path, capsys, monkeypatch):
    runs = layout(tmp_path, monkeypatch)
    assert main(["prune"]) == 0
    assert "would remove" in capsys.readouterr().out and all(p.is_dir() for p in runs.values())
    assert main(["prune", "--yes"]) == 0
    assert sorted(name for name, p in runs.items() if not p.exists()) == ["old", "old_branch"]
    assert main(["prune", "--unfinished", "--yes"]) == 0
    assert sorted(name for name, p in runs.items() if p.exists()) == ["branch", "current"]
    assert not list((tmp_path / "06_models").rglob(".*.pruning"))


def test_prune_never_touches_a_folder_a_live_run_holds(tmp_path, capsys, monkeypatch):
    import subprocess
    import sys

    runs = layout(tmp_path, monkeypatch)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from lehr.files import locks\n"
            "with locks.hold(sys.argv[1], 'training run'):\n    print('held', flush=True); time.sleep(120)",
            str(runs["killed"]),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["runs"]) == 0
        assert "running      no" in capsys.readouterr().out
        assert main(["prune", "--unfinished", "--yes"]) == 0
        out = capsys.readouterr().out
        assert f"keeping {runs['killed']}: a run is writing it (pid {holder.pid}" in out
        assert runs["killed"].is_dir() and not runs["old"].exists()
    finally:
        holder.kill()
        holder.wait()
    # The kernel released the lock with the process: the folder is an ordinary stopped run again.
    assert main(["prune", "--unfinished", "--yes"]) == 0
    assert not runs["killed"].exists()
