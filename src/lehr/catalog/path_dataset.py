from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset, DatasetError

from lehr.paths import in_experiment_copy, project_root

log = logging.getLogger(__name__)


class RunDirDataset(AbstractDataset[None, Path]):
    """A folder the training engine writes itself (rolling checkpoints, metrics.jsonl).

    Loading gives its path; the engine, not Kedro, writes inside it, because under torchrun it
    runs in other processes. Listing it in the catalog keeps every path in one place.

    ``across_experiments``: the folder is the project's, also inside a queued experiment's
    temporary copy, where it is a link to the project's own. So a stopped experiment's checkpoints
    outlive the copy DVC deletes (its re-run resumes them), and two experiments that need the same
    run (the same folder name: the same configuration) train it once: the second waits for the
    first and takes what it left. Recorded paths stay the relative ones, the same in every copy.
    """

    def __init__(self, path: str, across_experiments: bool = False):
        self._path = Path(path)
        self._across = across_experiments

    def load(self) -> Path:
        if self._across and in_experiment_copy():
            self._link_to_project()
        return self._path

    def _link_to_project(self) -> None:
        # Kedro hands the catalog's paths over absolute, under the project it runs (the copy).
        copy = Path.cwd().resolve()
        where = Path(os.path.realpath(self._path.parent)) / self._path.name  # the link itself unresolved
        if not where.is_relative_to(copy):
            return  # a folder outside the copy is the same folder for every copy
        target = project_root() / where.relative_to(copy)
        if self._path.is_symlink() and self._path.resolve() == target.resolve():
            return
        if self._path.exists() or self._path.is_symlink():
            log.warning(
                "%s exists in this experiment's copy (not a link to %s): its runs stay in the copy, "
                "which DVC deletes after the experiment",
                self._path,
                target,
            )
            return
        target.mkdir(parents=True, exist_ok=True)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._path.symlink_to(target, target_is_directory=True)

    def save(self, data: None) -> None:
        raise DatasetError(f"{self._path} is written by the training engine, not through the catalog")

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}
