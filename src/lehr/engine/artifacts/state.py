"""A checkpoint's ``state.json``, read in this one place: every command, dataset and report that
needs a checkpoint's record goes through ``State.read`` (or ``checkpoint.verify`` for one whose
files must also match their sha256s), so a new field, or an old checkpoint without one, is
handled here once. Plain Python: commands that only list or name checkpoints import no torch."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lehr import fixes

STATE = "state.json"
STATE_SHA = "state.json.sha256"  # the state's own checksum: every other file's is inside the state


def is_checkpoint(folder: str | Path) -> bool:
    """Whether ``folder`` holds a committed checkpoint (its state is written last)."""
    return (Path(folder) / STATE).is_file()


def state_file(folder: str | Path) -> Path:
    return Path(folder) / STATE


@dataclass(frozen=True)
class State:
    """What a checkpoint records besides its tensors (``Run._state`` writes it)."""

    progress: dict[str, Any] = field(default_factory=dict)  # step, tokens, evals, best_loss, trained_by
    # the resolved TrainConfig (``model`` as its math dict)
    config: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)  # profile, stage, inputs' sha256 (no commit)
    math_hash: str = ""
    manifest_sha256: str = ""
    tokenizer_sha256: str = ""
    world_size: int = 1
    parallel: str = "ddp"
    device: str = "?"
    torch: str = "?"
    cuda: str | None = None
    # {} in a checkpoint older than the code-identity record
    code: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)  # {} in one older than the versions record
    files: dict[str, str] = field(default_factory=dict)  # name -> sha256 of every other file in it
    record: dict[str, Any] = field(default_factory=dict, repr=False)  # the whole file as written

    @classmethod
    def of(cls, record: dict[str, Any]) -> State:
        known = {k: record[k] for k in cls.__dataclass_fields__ if k in record and k != "record"}
        return cls(**known, record=record)

    @classmethod
    def read(cls, folder: str | Path) -> State:
        """The state of the checkpoint in ``folder``, unverified (``checkpoint.verify`` checks every
        file too); a folder without one, or with one that is no JSON, is named."""
        path = state_file(folder)
        try:
            return cls.of(json.loads(path.read_text()))
        except FileNotFoundError:
            raise FileNotFoundError(f"{folder} is not a checkpoint (no {STATE})") from None
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(
                f"{path} is unreadable ({e}): restore the checkpoint (`{fixes.restore(folder)}`)"
            ) from None

    @property
    def step(self) -> int:
        step: int = self.progress["step"]
        return step

    @property
    def tokens(self) -> int:
        tokens: int = self.progress["tokens"]
        return tokens

    @property
    def out_dir(self) -> str:
        """The run folder that trained it, as that run named it."""
        out_dir: str = self.config["out_dir"]
        return out_dir
