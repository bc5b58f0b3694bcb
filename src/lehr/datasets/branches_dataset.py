from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset, DatasetError

from lehr.files import locks
from lehr.files.atomic import is_leftover, recover, staged_dir
from lehr.files.names import RULE, is_folder_name

log = logging.getLogger(__name__)

# What a branch keeps of its run: the final and best weights (with their state); and its curve,
# which the saver hands over as text (``curve``), so that the branch holds only what it versions.
KEPT = ("final", "best")


def kind_of(branch: Path) -> str | None:
    """``soup`` or ``anneal`` for a folder lehr made (its ``final/state.json`` is lehr's mark on
    it), None for anything else."""
    try:
        state = json.loads((branch / "final" / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return "soup" if "soup_of" in state else "anneal"


def scan(root: Path) -> tuple[dict[str, Path], list[str]]:
    """The complete branches under ``root`` as ``{name: folder}``, and one line for each folder
    there that is not one, saying why it is left out."""
    branches, left_out = {}, []
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        if not p.is_dir() or is_leftover(p.name):
            continue
        if not is_folder_name(p.name):
            left_out.append(f"{p}: not a branch name lehr accepts ({RULE})")
        elif kind_of(p) is None:
            left_out.append(f"{p}: no final/state.json (an unfinished, deleted or foreign folder)")
        else:
            branches[p.name] = p
    return branches, left_out


class AnnealBranchesDataset(AbstractDataset[dict, dict[str, Path]]):
    """Anneal branches side by side: ``<path>/<branch>/{final,best,metrics.jsonl}``.

    Saving ``{"branch": name, "run_dir": path, "kind": anneal|soup, "curve": text}`` replaces that one branch
    atomically and leaves every other branch untouched: it writes only into a folder lehr made as
    the same kind; loading lists the complete branches as ``{name: folder}``, and logs every
    folder it leaves out.
    """

    def __init__(self, path: str):
        self._path = Path(path)

    def load(self) -> dict[str, Path]:
        branches, left_out = scan(self._path)
        for line in left_out:
            log.warning("left out of the anneal branches: %s", line)
        return branches

    def save(self, data: dict) -> None:
        name, kind = data["branch"], data.get("kind", "anneal")
        if not is_folder_name(name):  # the params check this first; a name never leaves the folder
            raise DatasetError(f"branch name {name!r} {RULE}")
        run_dir, target = Path(data["run_dir"]), self._path / name
        with locks.hold(target, "saving an anneal branch"):
            recover(self._path, target.name)
            self._check_claimed(target, kind)
            # Nothing new (a finished run run again): the branch stays byte for byte, and mtime, as it was.
            with staged_dir(target, keep_if_same=True) as staging:
                for item in KEPT:
                    if (run_dir / item).is_dir():
                        shutil.copytree(run_dir / item, staging / item)
                if data.get("curve"):
                    (staging / "metrics.jsonl").write_text(data["curve"])

    @staticmethod
    def _check_claimed(target: Path, kind: str) -> None:
        if not target.exists():
            return
        theirs = kind_of(target)
        if theirs is None:
            raise DatasetError(
                f"{target} exists and lehr did not make it (no final/state.json): lehr never writes into "
                f"a folder it did not make. Move it away, or choose another name."
            )
        if theirs != kind:
            raise DatasetError(
                f"{target} is a trained {theirs} branch: a {kind} may not take its name. Choose another "
                f"name{' (soup.name)' if kind == 'soup' else ' (anneal.branch)'}."
            )

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}
