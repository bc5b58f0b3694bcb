from __future__ import annotations

from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset, DatasetError


class RunDirDataset(AbstractDataset[None, Path]):
    """A folder the training engine writes itself (rolling checkpoints, metrics.jsonl).

    Loading gives its path; the engine, not Kedro, writes inside it, because under torchrun it
    runs in other processes. Listing it in the catalog keeps every path in one place.
    """

    def __init__(self, path: str):
        self._path = Path(path)

    def load(self) -> Path:
        return self._path

    def save(self, data: None) -> None:
        raise DatasetError(f"{self._path} is written by the training engine, not through the catalog")

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}
