from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset, DatasetError

from lehr import fixes
from lehr.engine.artifacts.state import State, is_checkpoint, state_file
from lehr.files import locks
from lehr.files.atomic import copy_tree, recover, staged_dir


class CheckpointDataset(AbstractDataset[Path, Path]):
    """A named checkpoint folder such as ``pre_anneal``.

    Saving takes the path of a checkpoint the engine wrote and copies it in atomically; loading
    gives the path after checking the checkpoint is there and complete.
    """

    def __init__(self, path: str, produced_by: str = "an earlier stage", runs: str | None = None):
        self._path = Path(path)
        self._produced_by = produced_by
        self._runs = Path(runs) if runs else None  # the rolling run folders of the stage that makes it

    def load(self) -> Path:
        if not is_checkpoint(self._path):
            live = self._live_run()
            if live:
                raise DatasetError(
                    f"checkpoint {self._path} does not exist yet: {self._produced_by} is training it now "
                    f"({live}). Wait for that run to finish, then run again."
                )
            raise DatasetError(
                f"checkpoint {self._path} does not exist: run {self._produced_by} first "
                f"(`{fixes.rebuild(self._produced_by)}`)"
            )
        try:
            State.read(self._path)
        except ValueError:
            raise DatasetError(
                f"{state_file(self._path)} is corrupt: restore it "
                f"(`{fixes.restore(_from_here(self._path))}`) or re-run {self._produced_by} "
                f"(`{fixes.force_rebuild(self._produced_by)}`)"
            ) from None
        return self._path

    def _live_run(self) -> str | None:
        folders = sorted(self._runs.iterdir()) if self._runs and self._runs.is_dir() else []
        return next((who for f in folders if f.is_dir() and (who := locks.holder(f))), None)

    def save(self, data: Path) -> None:
        with locks.hold(self._path, f"saving {self._path.name}"):
            recover(self._path.parent, self._path.name)
            if self._path.exists() and not is_checkpoint(self._path):
                raise DatasetError(
                    f"{self._path} exists and is not a checkpoint lehr made (no state.json): lehr never "
                    f"writes into a folder it did not make. Move it away, then run {self._produced_by} again."
                )
            # The same bytes as before (a finished run run again) leave it as it was, file times too.
            with staged_dir(self._path, keep_if_same=True) as staging:
                copy_tree(Path(data), staging, shown_as=self._path)

    def _exists(self) -> bool:
        return is_checkpoint(self._path)

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}


def _from_here(path: Path) -> str:
    """``path`` as a person types it where the command ran: relative inside the project (the
    catalog holds it absolute)."""
    inside = os.path.relpath(path)
    return str(path) if inside.startswith("..") else inside
