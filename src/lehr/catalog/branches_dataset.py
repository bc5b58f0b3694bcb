from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset, DatasetError

from lehr.engine.artifacts.state import State
from lehr.files import locks
from lehr.files.atomic import copy_tree, is_leftover, recover, staged_dir
from lehr.files.names import RULE, is_folder_name
from lehr.paths import run_by_dvc

log = logging.getLogger(__name__)

# What a branch keeps of its run: the final and best weights (with their state); and its curve,
# which the saver hands over as text (``curve``), so that the branch holds only what it versions.
KEPT = ("final", "best")
# The branch's own record: which command made it and the params that shaped it (no clock, no
# path, no commit: DVC hashes it as part of the branch).
RECORD = "branch.json"
BY_DVC, BY_HAND = "dvc", "hand"


def kind_of(branch: Path) -> str | None:
    """``soup`` or ``anneal`` for a folder lehr made (its ``final/state.json`` is lehr's mark on
    it), None for anything else."""
    try:
        state = State.read(branch / "final")
    except (OSError, ValueError):
        return None
    return "soup" if "soup_of" in state.record else "anneal"


def record_of(branch: Path) -> dict:
    """A branch's ``branch.json``; {} for a branch made before branches kept one."""
    try:
        return json.loads((branch / RECORD).read_text())
    except (OSError, ValueError):
        return {}


def made_by(branch: Path) -> str:
    """``dvc`` for a branch the DVC anneal stage made (``dvc repro``, ``dvc exp run``), else ``kedro run``."""
    return record_of(branch).get("made_by", BY_HAND)


def scan(root: Path) -> tuple[dict[str, Path], list[str]]:
    """The complete branches under ``root`` as ``{name: folder}``, and one line for each folder
    there that is not one, saying why it is left out."""
    branches, left_out = {}, []
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        if not p.is_dir() or is_leftover(p.name):
            continue
        if p.is_symlink():
            left_out.append(f"{p}: a symbolic link (to {os.readlink(p)}); branches are folders lehr made")
        elif not is_folder_name(p.name):
            left_out.append(f"{p}: not a branch name lehr accepts ({RULE})")
        elif kind_of(p) is None:
            left_out.append(f"{p}: no final/state.json (an unfinished, deleted or foreign folder)")
        else:
            branches[p.name] = p
    return branches, left_out


def scan_homes(dvc_home: Path, hand_home: Path | None) -> tuple[dict[str, Path], list[str]]:
    """Every branch of both homes; a name in both is the DVC stage's (the other is named as hidden)."""
    branches, left_out = scan(dvc_home)
    if hand_home is None or hand_home == dvc_home:
        return branches, left_out
    by_hand, also_left_out = scan(hand_home)
    for name, folder in by_hand.items():
        if name in branches:
            also_left_out.append(f"{folder}: hidden by the DVC anneal stage's branch {branches[name]}")
        else:
            branches[name] = folder
    return dict(sorted(branches.items())), left_out + also_left_out


class AnnealBranchesDataset(AbstractDataset[dict, dict[str, Path]]):
    """Anneal branches side by side: ``<home>/<branch>/{final,best,metrics.jsonl,branch.json}``,
    in two homes (docs/tracking.md): ``path``, the DVC anneal stage's output, holds the branches
    that stage made (``dvc repro``, ``dvc exp run``), and ``by_hand`` every other (``kedro run``,
    soups), which no DVC command checks out, so no experiment can remove it.

    Saving ``{"branch", "run_dir", "kind": anneal|soup, "curve": text, "params": {...}}`` replaces
    that one branch in its home atomically, with its record, and leaves every other branch
    untouched; a branch by hand never takes the name of the DVC stage's. Loading lists the
    complete branches of both homes as ``{name: folder}`` and logs every folder it leaves out.
    """

    def __init__(self, path: str, by_hand: str | None = None, dvc_stage: str = "anneal"):
        self._path = Path(path)
        self._by_hand = Path(by_hand) if by_hand else None
        self._dvc_stage = dvc_stage

    def load(self) -> dict[str, Path]:
        branches, left_out = scan_homes(self._path, self._by_hand)
        for line in left_out:
            log.warning("left out of the anneal branches: %s", line)
        return branches

    def _home(self) -> tuple[Path, str]:
        if self._by_hand is None or run_by_dvc(self._dvc_stage):
            return self._path, BY_DVC
        return self._by_hand, BY_HAND

    def save(self, data: dict) -> None:
        try:
            self._write(data)
        finally:
            if data.get("scratch") is not None:  # a soup's averaged weights: copied, or refused
                data["scratch"].cleanup()

    def _write(self, data: dict) -> None:
        name, kind = data["branch"], data.get("kind", "anneal")
        if not is_folder_name(name):  # the params check this first; a name never leaves the folder
            raise DatasetError(f"branch name {name!r} {RULE}")
        home, by = self._home()
        if by == BY_HAND:
            refuse_dvc_name(name, self._path)
        run_dir, target = Path(data["run_dir"]), home / name
        with locks.hold(target, "saving an anneal branch"):
            recover(home)  # every dead writer's leftovers, not only this name's: none is ever versioned
            self._check_claimed(target, kind)
            # Nothing new (a finished run run again): the branch stays byte for byte, and mtime, as it was.
            with staged_dir(target, keep_if_same=True) as staging:
                for item in KEPT:
                    if (run_dir / item).is_dir():
                        copy_tree(run_dir / item, staging / item, shown_as=target / item)
                if data.get("curve"):
                    (staging / "metrics.jsonl").write_text(data["curve"])
                record = {"branch": name, "kind": kind, "made_by": by, "params": data.get("params", {})}
                (staging / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")

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
        return {"path": str(self._path), "by_hand": str(self._by_hand)}


def check_free(name: str, branches: dict[str, Path], dvc_stage: str = "anneal") -> None:
    """Before a branch trains: refused if made by hand under a name the DVC stage's branch holds."""
    if name in branches and made_by(branches[name]) == BY_DVC and not run_by_dvc(dvc_stage):
        refuse_dvc_name(name, branches[name].parent)


def refuse_dvc_name(name: str, dvc_home: Path) -> None:
    """A branch made by hand may not take the name of one the DVC anneal stage made: the two would
    be one name for two models in ``metrics.json`` and ``dvc exp show``."""
    theirs = dvc_home / name
    if kind_of(theirs) is not None:
        raise ValueError(
            f"anneal branch {name!r} is the DVC anneal stage's ({os.path.relpath(theirs)}, made by "
            "`dvc repro` or `dvc exp run` with these params): a branch trained by `kedro run` may not "
            "take its name. Choose another name (--params anneal.branch=NAME), or run `dvc repro anneal` "
            "to bring DVC's up to date."
        )
