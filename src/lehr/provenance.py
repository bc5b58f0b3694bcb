"""Where a result came from: git commit, data hashes, versions. Stored in every checkpoint's
state and tagged on every MLflow run."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import yaml


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def git_info() -> dict:
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": _git("rev-parse", "HEAD") or "unknown",
            "git_dirty": bool(status) if status is not None else None}


def dvc_lock_hashes(stage: str, lock_path: str | Path = "dvc.lock") -> dict[str, str]:
    """``dvc.lock``'s recorded hash of each dep of ``stage`` (empty before the first repro)."""
    path = Path(lock_path)
    if not path.is_file():
        return {}
    stage_lock = (yaml.safe_load(path.read_text()) or {}).get("stages", {}).get(stage, {})
    return {d["path"]: d.get("md5", "") for d in stage_lock.get("deps", []) if "path" in d}


def collect(stage: str, manifest: dict) -> dict:
    manifest_file = Path(manifest["root"]) / "manifest.json"
    return {
        **git_info(),
        "stage": stage,
        "manifest_sha256": hashlib.sha256(manifest_file.read_bytes()).hexdigest(),
        "tokenizer_sha256": manifest["tokenizer"]["sha256"],
        "dvc_lock": dvc_lock_hashes(stage),
    }
