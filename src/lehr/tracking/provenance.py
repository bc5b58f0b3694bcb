"""Where a result came from. The data hashes and the profile are stored in every checkpoint's
state; the git commit is tagged on every MLflow run only. A checkpoint is a DVC output, and what
DVC hashes must not change with the commit a process ran at (a fresh clone of a later commit
reproduces the lock): the code's identity (``lehr.engine.artifacts.code_identity``), which every
checkpoint records, is what says which code made it."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from lehr.engine.artifacts.state import STATE, State, state_file
from lehr.paths import portable


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def git_info() -> dict:
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "git_commit": _git("rev-parse", "HEAD") or "unknown",
        "git_dirty": bool(status) if status is not None else None,
    }


def collect(stage: str, manifest: dict, checkpoints: dict[str, Path] | None = None) -> dict:
    """Hashes of the inputs this stage reads, computed from the files themselves (``dvc.lock`` may
    still describe the inputs of another profile's run): the shard manifest (which holds every
    shard's sha256), the tokenizer, and each checkpoint read (its ``state.json`` holds the sha256
    of its other files)."""
    manifest_file = Path(manifest["root"]) / "manifest.json"
    inputs = {portable(manifest_file): hashlib.sha256(manifest_file.read_bytes()).hexdigest()}
    for path in (checkpoints or {}).values():
        inputs[portable(state_file(path))] = hashlib.sha256(state_file(path).read_bytes()).hexdigest()
    return {
        "stage": stage,
        "profile": os.environ.get("LEHR_PROFILE"),  # the Kedro env (set by the ConfigInForce hook)
        "manifest_sha256": inputs[portable(manifest_file)],
        "tokenizer_sha256": manifest["tokenizer"]["sha256"],
        "inputs": inputs,
    }


def branched_from(checkpoint: Path) -> str | None:
    """The sha256 of the state.json of the checkpoint an anneal checkpoint (``final`` or ``best``
    of a branch, or a soup of branches) started from (``pre_anneal`` or a branch point), as its
    provenance recorded it; None for a checkpoint without provenance."""
    return next(iter(_origin(checkpoint).values()), None)


def origin_name(checkpoint: Path) -> str | None:
    """The folder name of what an anneal checkpoint started from: pre_anneal or tokens-<N>."""
    return next((Path(p).parent.name for p in _origin(checkpoint)), None)


def _origin(checkpoint: Path) -> dict[str, str]:
    inputs = State.read(checkpoint).provenance.get("inputs", {})
    return {p: h for p, h in inputs.items() if Path(p).name == STATE}
