"""The rolling run folders (the catalog's ``stable_run`` and ``anneal_runs``): what each holds, and
which can go.

They are not DVC outputs (DVC neither deletes, caches nor restores them): an interrupted stage
resumes from them, and every distinct configuration leaves one behind. A finished
folder that neither the workspace's ``pre_anneal`` nor any of its anneal branches came from only
saves re-training that configuration if it is run again; pruning trades that for disk.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from lehr.engine.artifacts.state import State, is_checkpoint
from lehr.files import locks


@dataclass(frozen=True)
class Layout:
    """Where the runs and what came from them live (the catalog's paths)."""

    stable_run: Path  # one folder per stable-phase configuration
    pre_anneal: Path
    anneal_runs: Path  # one folder per anneal branch and branch point
    anneal_branches: tuple[Path, ...]  # the folders of <branch>/final, ... (DVC's and by hand)

    def kinds(self) -> tuple:
        return (
            ("stable", self.stable_run, "pre_anneal"),
            ("anneal", self.anneal_runs, "final"),
        )  # kind, root, end


@dataclass(frozen=True)
class RunFolder:
    path: Path
    kind: str  # stable | anneal
    step: int | None  # step of the newest rolling checkpoint; None before the first
    finished: bool  # the run reached its end (its pre_anneal / final is saved)
    in_use: bool  # the workspace's pre_anneal or one of its anneal branches came from it
    size: int  # bytes on disk
    live: str | None = None  # the process that holds the folder's lock now (a run writing it), or None


def _origin(checkpoint: Path) -> Path | None:
    return Path(State.read(checkpoint).out_dir).resolve() if is_checkpoint(checkpoint) else None


def scan(layout: Layout) -> list[RunFolder]:
    branches = [p for home in layout.anneal_branches for p in home.glob("*")]
    used = {_origin(layout.pre_anneal)} | {_origin(p / "final") for p in branches}
    found = []
    for kind, root, end in layout.kinds():
        for path in sorted(root.iterdir()) if root.is_dir() else []:
            if not path.is_dir() or path.name.startswith("."):
                continue
            steps = sorted(int(p.name.split("_")[1]) for p in path.glob("checkpoints/step_*") if p.is_dir())
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            found.append(
                RunFolder(
                    path,
                    kind,
                    steps[-1] if steps else None,
                    is_checkpoint(path / end),
                    path.resolve() in used,
                    size,
                    locks.holder(path),
                )
            )
    return found


def prunable(folders: list[RunFolder], unfinished: bool = False) -> list[RunFolder]:
    """Never one in use or live; finished ones, and with ``unfinished`` also those that stopped part way."""
    return [f for f in folders if not f.in_use and not f.live and (f.finished or unfinished)]


def remove(folder: RunFolder) -> None:
    """Delete the folder while holding its lock, so no run can start in it meanwhile; a run that
    holds it (started since the scan) makes this raise FolderBusyError and nothing is touched."""
    with locks.hold(folder.path, "prune"):
        # Renamed first, so that an interrupted removal leaves no half folder a stage would resume from.
        doomed = folder.path.with_name(f".{folder.path.name}.pruning")
        folder.path.rename(doomed)
        shutil.rmtree(doomed)
