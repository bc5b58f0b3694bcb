"""Helpers for end-to-end tests: a throwaway copy of the project as its own git + DVC repo."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from lehr.project import sandbox
from tests import ROOT


def env() -> dict[str, str]:
    bin_dir = str(Path(os.sys.executable).parent)
    # mlflow.set_tracking_uri() in this process exports MLFLOW_TRACKING_URI; each throwaway repo
    # keeps its own store, so neither that nor a run id may leak into the commands run there.
    inherited = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID")}
    return {
        **inherited,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "KEDRO_DISABLE_TELEMETRY": "1",
        "DVC_NO_ANALYTICS": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "PYTHONWARNINGS": "ignore",
        # MLflow costs ~6 s per stage run; the tests of tracking turn it back on (test_pipeline_e2e.MLFLOW).
        "LEHR_MLFLOW": os.environ.get("LEHR_MLFLOW", "0"),
    }


def sh(
    repo: Path, *cmd: str, check: bool = True, extra_env: dict | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        cmd, cwd=repo, env={**env(), **(extra_env or {})}, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
        )
    return proc


def make_repo(dest: Path, corpus: Path, profile: str = "smoke") -> Path:
    """A sandbox of this checkout (what `make smoke` builds), with ``corpus`` as its bundled corpus."""
    return sandbox.create(ROOT, dest, profile, corpus)


def copy_of(smoke_repo: Path, dest: Path) -> Path:
    """The session's smoke repo with its baseline committed: experiments are relative to a commit."""
    shutil.copytree(smoke_repo, dest, symlinks=True)
    sh(dest, "git", "add", "-A")
    sh(dest, "git", "commit", "-qm", "baseline", "--allow-empty")
    return dest


def team(smoke_repo: Path, root: Path, ladder: bool = False) -> tuple[Path, Path]:
    """Clone A (the smoke run, pushed to a bare git remote and a local DVC remote) and clone B (a
    fresh ``git clone`` of the remote, with nothing of DVC's yet). With ``ladder``, A's commit holds
    the ladder's stages too (``lehr sandbox --ladder``)."""
    a = copy_of(smoke_repo, root / "a")
    if ladder:
        (a / "ladder").mkdir()
        shutil.copy2(ROOT / "ladder/dvc.yaml", a / "ladder/dvc.yaml")
    sh(root, "git", "init", "-q", "--bare", "remote.git")
    sh(a, "git", "remote", "add", "origin", str(root / "remote.git"))
    sh(a, "dvc", "remote", "add", "-d", "store", str(root / "dvc-store"))
    sh(a, "git", "add", "-A")
    sh(a, "git", "commit", "-qm", "the team's DVC remote")
    sh(a, "git", "push", "-q", "origin", "HEAD:main")
    sh(a, "dvc", "push")
    sh(root, "git", "clone", "-q", "--branch", "main", str(root / "remote.git"), "b")
    return a, root / "b"


def dir_hash(path: Path) -> str:
    """The folder's files and bytes; lehr's lock files (beside the folders they guard, ignored by
    DVC too) are not artifacts and stay out."""
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file() and not p.name.endswith(".lehr.lock")):
        h.update(str(f.relative_to(path)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


# What DVC versions as data and models: every one must hash the same from the same commit.
ARTIFACTS = (
    "data/01_raw/bundled",
    "data/02_intermediate/tokenizer.json",
    "data/03_primary/tokens",
    "data/04_feature/shards",
    "data/04_feature/tasks",
    "data/06_models/pre_anneal",
    "data/06_models/anneal",
)


def lock_hash(lock: Path, out: str) -> str:
    """The hash ``dvc.lock`` records for the output ``out``."""
    import yaml

    for stage in yaml.safe_load(lock.read_text())["stages"].values():
        for entry in stage.get("outs", []):
            if entry["path"] == out:
                return entry["md5"]
    raise KeyError(f"{out} is not an output in {lock}")


def stages_run(output: str) -> list[str]:
    return [line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")]


def runs_of(repo: Path):
    """The MLflow runs of a repo's own store, and a client of it."""
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{repo / 'mlflow.db'}")
    return mlflow.search_runs(experiment_names=["lehr"]), mlflow.MlflowClient()


def cores_of(ranges: str) -> list[int]:
    """ "0-2,5" (a share's cores, as MLflow's tag has them) -> [0, 1, 2, 5]."""
    out = []
    for part in filter(None, ranges.split(",")):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out
