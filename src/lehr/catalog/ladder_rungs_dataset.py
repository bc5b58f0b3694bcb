from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset

from lehr.files.atomic import write_text_atomic


class LadderRungsDataset(AbstractDataset[dict, dict[int, dict]]):
    """The ladder's rungs side by side: ``<path>/rung-<depth>.json``, one per size.

    Saving ``{depth: record}`` replaces those rungs' files whole and leaves every other rung as
    it is (each rung is its own DVC stage); loading gives every rung there as ``{depth: record}``.
    """

    def __init__(self, path: str):
        self._path = Path(path)

    def load(self) -> dict[int, dict]:
        files = sorted(self._path.glob("rung-*.json")) if self._path.is_dir() else []
        rungs = {}
        for f in files:
            record = json.loads(f.read_text())
            rungs[record["depth"]] = record
        return rungs

    def save(self, data: dict[int, dict]) -> None:
        self._path.mkdir(parents=True, exist_ok=True)
        for depth, record in data.items():
            write_text_atomic(
                self._path / f"rung-{depth}.json", json.dumps(record, indent=1, sort_keys=True) + "\n"
            )

    def _exists(self) -> bool:
        return self._path.is_dir()

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}
