"""A throwaway copy of this project, as its own git + DVC repo, on a profile of its own.

``make smoke`` runs the whole pipeline in one (``build/smoke``), so trying lehr on the tiny
profile never changes this project's tracked files, its ``dvc.lock`` or the default run's
outputs in its workspace. The end-to-end tests build theirs the same way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from lehr.paths import branch_homes, catalog_paths

MARKER = ".lehr-sandbox"
COPIED = (
    "pyproject.toml",
    "requirements.lock",
    "dvc.yaml",
    ".dvcignore",
    ".gitignore",
    ".telemetry",
    "conf",
    "src",
    "data/06_models/branches/.gitkeep",  # the home of branches trained by hand: evaluate depends on it
    "notebooks",
    "data/01_raw/tasks",
)
# The ladder's stages, only when asked for (`--ladder`): without a lock of their own (the sandbox
# has run none of them), DVC counts their outputs as missing, and `dvc pull`, `dvc checkout` and
# `dvc exp apply` exit non-zero although everything the main pipeline needs arrived.
LADDER = "ladder/dvc.yaml"


def create(
    project: Path,
    dest: Path,
    profile: str,
    corpus: Path | None = None,
    force: bool = False,
    ladder: bool = False,
) -> Path:
    """Copy the project's code and configuration (not its data, runs or local overrides) to
    ``dest``, choose ``profile`` there, and commit it as the sandbox's first commit. With
    ``corpus``, that folder stands in for the bundled corpus (the ``corpus`` stage then leaves it);
    with ``ladder``, the ladder's stages come along. An earlier sandbox is replaced only if it holds
    nothing of a person's (or with ``force``)."""
    if dest.exists():
        if not (dest / MARKER).is_file():
            raise FileExistsError(
                f"{dest} exists and is not a lehr sandbox: lehr leaves it as it is; choose another folder"
            )
        work = [] if force else own_work(dest)
        if work:
            raise FileExistsError(
                f"{dest} holds {' and '.join(work)}: lehr leaves it as it is. Replace it anyway with "
                f"`python -m lehr sandbox {dest} --force` (`make smoke FORCE=1`), or choose another folder"
            )
        shutil.rmtree(dest)  # an earlier sandbox, which lehr made, with nothing of anyone's in it
    if not (project / "conf" / profile).is_dir() and profile != "local":
        raise ValueError(f"no profile {profile!r}: the profiles are the folders of {project / 'conf'}")
    dest.mkdir(parents=True)
    for name in (*COPIED, LADDER) if ladder else COPIED:
        src = project / name
        if src.is_dir():
            shutil.copytree(
                src,
                dest / name,
                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "local", ".ipynb_checkpoints"),
            )
        elif src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    tracked = _tracked(project, project / "conf" / "local")
    shutil.copytree(
        project / "conf" / "local",
        dest / "conf" / "local",
        ignore=lambda d, names: [n for n in names if (Path(d) / n).is_file() and Path(d) / n not in tracked],
    )
    (dest / "conf" / "profile.yaml").write_text(f"profile: {profile}\n")
    # Nothing of where or when: two sandboxes of one checkout are one commit, so the commit their
    # checkpoints record, and so their dvc.lock, are the same.
    (dest / MARKER).write_text("a lehr sandbox; `make smoke` replaces it\n")
    if corpus is not None:
        shutil.copytree(corpus, catalog_paths(dest, profile)["corpus"])
    _first_commit(project, dest, profile)
    return dest


def _first_commit(project: Path, dest: Path, profile: str) -> None:
    # A throwaway repo commits under its own name (a fresh machine may have no git identity, and the
    # caller's must not leak in) at the time of the project's own commit: the same code makes the
    # same commit, and so the same records.
    when = _commit_time(project)
    identity = {
        f"GIT_{who}_{what}": value
        for who in ("AUTHOR", "COMMITTER")
        for what, value in (("NAME", "lehr sandbox"), ("EMAIL", "sandbox@lehr.invalid"), ("DATE", when))
    }
    for cmd in (
        ["git", "init", "-q"],
        [sys.executable, "-m", "dvc", "init", "-q"],
        ["git", "add", "-A"],
        ["git", "commit", "-qm", f"lehr sandbox on the {profile} profile"],
    ):
        subprocess.run(cmd, cwd=dest, check=True, env={**os.environ, **identity})


def own_work(sandbox: Path) -> list[str]:
    """What a person made in a sandbox: commits after lehr's first, DVC experiments, branches
    trained by hand (never in git), and changes to the files git tracks."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=sandbox, capture_output=True, text=True).stdout.strip()

    commits = int(git("rev-list", "--count", "--branches", "--tags") or 0) - 1
    exps = len(git("for-each-ref", "--format=%(refname)", "refs/exps").splitlines())
    queued = git("stash", "list", "refs/exps/celery/stash")  # DVC's queue
    by_hand = [p.name for p in branch_homes(sandbox)[1].glob("[!.]*")]
    edited = git("status", "--porcelain", "--untracked-files=no")
    return [
        *([f"{commits} commit(s) of your own"] if commits > 0 else []),
        *([f"{exps} experiment ref(s)"] if exps else []),
        *(["queued experiments"] if queued else []),
        *([f"branches you trained ({', '.join(sorted(by_hand))})"] if by_hand else []),
        *(["uncommitted changes"] if edited else []),
    ]


def _commit_time(project: Path) -> str:
    out = subprocess.run(["git", "log", "-1", "--format=%cI"], cwd=project, capture_output=True, text=True)
    return out.stdout.strip() or "2000-01-01T00:00:00+00:00"


def _tracked(project: Path, folder: Path) -> set[Path]:
    """The files git tracks in ``folder``: only those go along (a user's own overrides stay home)."""
    out = subprocess.run(["git", "ls-files", "-z", str(folder)], cwd=project, capture_output=True, check=True)
    return {project / name for name in out.stdout.decode().split("\0") if name}
