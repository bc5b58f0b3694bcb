from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset, DatasetError

from lehr import fixes
from lehr.engine.artifacts.state import State
from lehr.files import locks
from lehr.files.atomic import copy_tree, recover, staged_dir

INDEX = "index.json"  # lehr's mark on the folder: {name: {step, tokens}}


class BranchPointsDataset(AbstractDataset[dict, dict[str, Path]]):
    """The stable run's branch points: ``<path>/<name>/`` checkpoints, one per token count in
    ``pretrain.branch_points``, and ``index.json`` naming them.

    Saving ``{name: checkpoint folder}`` replaces the whole folder at once, so it always holds the
    points of one stable run (with none, only an empty index); loading gives ``{name: folder}``.
    """

    def __init__(self, path: str):
        self._path = Path(path)

    def load(self) -> dict[str, Path]:
        index = self._path / INDEX
        if not index.is_file():
            raise DatasetError(f"{self._path} holds no branch points: run pretrain_stable first")
        try:
            names = json.loads(index.read_text())
        except json.JSONDecodeError:
            raise DatasetError(
                f"{index} is corrupt: re-run pretrain_stable (`{fixes.force_rebuild('pretrain_stable')}`)"
            ) from None
        return {name: self._path / name for name in names}

    def save(self, data: dict[str, Path]) -> None:
        with locks.hold(self._path, f"saving {self._path.name}"):
            recover(self._path.parent, self._path.name)
            if self._path.exists() and any(self._path.iterdir()) and not (self._path / INDEX).is_file():
                raise DatasetError(
                    f"{self._path} exists and is not lehr's branch points folder (no {INDEX}): lehr never "
                    "writes into a folder it did not make. Move it away, then run pretrain_stable again."
                )
            index = {}
            with staged_dir(self._path, keep_if_same=True) as staging:
                for name, folder in sorted(data.items()):
                    copy_tree(Path(folder), staging / name, shown_as=self._path / name)
                    state = State.read(folder)
                    index[name] = {"step": state.step, "tokens": state.tokens}
                (staging / INDEX).write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")

    def _exists(self) -> bool:
        return (self._path / INDEX).is_file()

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}
