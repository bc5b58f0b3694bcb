"""The reports' Kedro datasets (JSON, CSV, text, matplotlib) write whole files or nothing: each
save writes a sibling ``.tmp-<name>-<pid>`` and renames it over the file, so a full disk or a kill
mid-save leaves the previous report as it was. Kedro's own write over the old file in place, and
these outputs are ``cache: false``, so DVC could not bring a cut one back.

A report that a DVC stage owns (``owner: <stage>`` in the catalog) is written there only when DVC
runs that stage. A run by hand (``kedro run --pipelines anneal --params anneal.branch=x``) writes
its reports into ``by_hand/`` beside them instead, so it never changes a DVC output: ``git status``
stays clean and the next ``dvc repro`` does not retrain the stage that owns them. A later node of
the same run reads what the run saved (a whole pipeline by hand plots its own curves); another
run reads the DVC stage's."""

from __future__ import annotations

import logging
import os
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from lehr.files.atomic import fsync_dir, sibling
from lehr.paths import run_by_dvc

BY_HAND = "by_hand"
log = logging.getLogger(__name__)
_told: set[Path] = set()  # the by-hand folders this process has named once


if TYPE_CHECKING:  # the datasets it is mixed into: what its super() calls reach
    from kedro.io.core import AbstractVersionedDataset as _FileDataset
else:
    _FileDataset = object


class AtomicSave(_FileDataset):
    """Mixed into a Kedro file dataset (unversioned, local) in front of it."""

    def __init__(self, *args, owner: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._owner = owner  # the DVC stage whose output this file is, if any
        self._saved: Path | None = None  # where this run saved it: a later node of the run reads that

    def _final_path(self) -> Path:
        path = Path(str(super()._get_save_path()))
        if self._owner is None or run_by_dvc(self._owner):
            return path
        return path.parent / BY_HAND / path.name

    def _get_save_path(self) -> PurePosixPath:
        return PurePosixPath(sibling(self._final_path(), "tmp"))

    def _get_load_path(self) -> PurePosixPath:
        return PurePosixPath(self._saved) if self._saved else super()._get_load_path()

    def save(self, data) -> None:
        final = self._final_path()
        tmp = sibling(final, "tmp")
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.parent.name == BY_HAND and final.parent not in _told:
            _told.add(final.parent)
            log.info(
                "not run by DVC: this run's reports go to %s/, leaving %s/ to the DVC stages' runs",
                os.path.relpath(final.parent),
                os.path.relpath(final.parent.parent),
            )
        try:
            super().save(data)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, final)
            self._saved = final
        except Exception as e:  # the write's own error names no file (fsspec): name the report
            cause = e if isinstance(e, OSError) else e.__cause__  # Kedro wraps it in a DatasetError
            if isinstance(cause, OSError) and cause.errno:
                raise OSError(cause.errno, cause.strerror, os.path.relpath(final)) from e
            raise
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(final.parent)

    def _describe(self) -> dict:
        return {**super()._describe(), "filepath": str(self._final_path())}
