from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset

from lehr.files import locks
from lehr.files.atomic import recover, replace_dir, sibling

# What a branch keeps of its run: the final and best weights (with their state) and its curve.
KEPT = ("final", "best", "metrics.jsonl")


class AnnealBranchesDataset(AbstractDataset[dict, dict[str, Path]]):
    """Anneal branches side by side: ``<path>/<branch>/{final,best,metrics.jsonl}``.

    Saving ``{"branch": name, "run_dir": path}`` replaces that one branch atomically and leaves
    every other branch untouched; loading lists the complete branches as ``{name: folder}``.
    """

    def __init__(self, path: str):
        self._path = Path(path)

    def load(self) -> dict[str, Path]:
        if not self._path.is_dir():
            return {}
        return {
            p.name: p
            for p in sorted(self._path.iterdir())
            if p.is_dir() and not p.name.startswith(".") and (p / "final" / "state.json").is_file()
        }

    def save(self, data: dict) -> None:
        run_dir, target = Path(data["run_dir"]), self._path / data["branch"]
        with locks.hold(target, "saving an anneal branch"):
            recover(self._path, target.name)
            staging = sibling(target, "tmp")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            for name in KEPT:
                src = run_dir / name
                if src.is_dir():
                    shutil.copytree(src, staging / name)
                elif src.is_file():
                    shutil.copy2(src, staging / name)
            replace_dir(staging, target)

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}
