"""The reports' Kedro datasets (JSON, CSV, text, matplotlib) write whole files or nothing: each
save writes a sibling ``.tmp-<name>-<pid>`` and renames it over the file, so a full disk or a kill
mid-save leaves the previous report as it was. Kedro's own write over the old file in place, and
these outputs are ``cache: false``, so DVC could not bring a cut one back."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from lehr.files.atomic import fsync_dir, sibling


class AtomicSave:
    """Mixed into a Kedro file dataset (unversioned, local) in front of it."""

    def _final_path(self) -> Path:
        return Path(str(super()._get_save_path()))

    def _get_save_path(self) -> PurePosixPath:
        return PurePosixPath(sibling(self._final_path(), "tmp"))

    def save(self, data) -> None:
        final = self._final_path()
        tmp = sibling(final, "tmp")
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            super().save(data)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except Exception as e:  # the write's own error names no file (fsspec): name the report
            cause = e if isinstance(e, OSError) else e.__cause__  # Kedro wraps it in a DatasetError
            if isinstance(cause, OSError) and cause.errno:
                raise OSError(cause.errno, cause.strerror, os.path.relpath(final)) from e
            raise
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(final.parent)
