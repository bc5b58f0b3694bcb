from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset

from lehr.datasets.checkpoint_dataset import swap_in

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
        return {p.name: p for p in sorted(self._path.iterdir())
                if p.is_dir() and not p.name.startswith(".") and (p / "final" / "state.json").is_file()}

    def save(self, data: dict) -> None:
        run_dir, staging = Path(data["run_dir"]), self._path / f".staging-{data['branch']}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for name in KEPT:
            src = run_dir / name
            if src.is_dir():
                shutil.copytree(src, staging / name)
            elif src.is_file():
                shutil.copy2(src, staging / name)
        swap_in(staging, self._path / data["branch"])

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}
