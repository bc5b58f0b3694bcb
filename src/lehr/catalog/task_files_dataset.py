from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset

from lehr.files.atomic import staged_dir


class TaskFilesDataset(AbstractDataset[dict, dict]):
    """A folder of task files, ``<task>.jsonl`` (the format of ``lehr.engine.evals.tasks``).

    Saved whole: written beside the old folder and swapped in, so a kill leaves the old set.
    Loaded as {task name: path}; a folder that does not exist holds no tasks.
    """

    def __init__(self, path: str):
        self._path = Path(path)

    def load(self) -> dict[str, Path]:
        if not self._path.is_dir():
            return {}
        return {p.stem: p for p in sorted(self._path.glob("*.jsonl"))}

    def save(self, data: dict[str, list[dict]]) -> None:
        with staged_dir(self._path) as tmp:
            for name, examples in data.items():
                (tmp / f"{name}.jsonl").write_text(
                    "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in examples)
                )

    def _exists(self) -> bool:
        return self._path.is_dir()

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}
