"""The experiments DVC keeps as git commits (``refs/exps/<baseline>/<name>``), read back with git:
which exist on a commit, what a file held in one, which branch each trained. Kept apart from
``lehr.project.experiments`` (the ``lehr exp`` and ``lehr experiments`` commands) because the anneal
stage reads it too, to refuse by hand a branch name an experiment holds."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


def experiment_branches(project: Path) -> dict[str, str]:
    """The branch each experiment of the baseline commit trained (its metrics.json says which), by name."""
    from lehr.paths import catalog_files

    out: dict[str, str] = {}
    metrics_file = catalog_files(project)["eval_metrics"]
    try:
        exps = experiments_of(project, git(project, "rev-parse", "HEAD").strip())
    except (subprocess.CalledProcessError, OSError):  # no git, or no commit yet: no experiments
        return out
    for name, sha in exps:
        metrics = show(project, sha, metrics_file)
        branch = json.loads(metrics).get("anneal", {}).get("branch") if metrics else None
        if branch:
            out[branch] = name
    return out


def refuse_experiment_branch(branch: str, project: Path) -> None:
    """A branch trained by hand may not take the name of one an experiment trained (its branch left
    the workspace when the workspace was put back, and `dvc exp apply` would bring it back)."""
    from lehr.paths import catalog_files

    exp = experiment_branches(project).get(branch)
    if exp:
        home = catalog_files(project)["anneal_branches"]
        raise ValueError(
            f"anneal branch {branch!r} is experiment {exp}'s ({home}/{branch} in its commit; "
            f"`dvc exp apply {exp}` brings it back): a branch trained by `kedro run` may not take its name. "
            "Choose another name (--params anneal.branch=NAME)."
        )


def git(project: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=project, capture_output=True, text=True, check=True).stdout


def show(project: Path, rev: str, path: str) -> str | None:
    out = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=project, capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def experiment_ref(baseline: str, name: str = "") -> str:
    """The git ref DVC keeps experiment ``name`` of ``baseline`` under (without a name: their prefix)."""
    return f"refs/exps/{baseline[:2]}/{baseline[2:]}/{name}"


def experiments_of(project: Path, baseline: str) -> list[tuple[str, str]]:
    """(name, commit) of every experiment DVC saved on ``baseline``, oldest first."""
    prefix = experiment_ref(baseline)
    refs = git(project, "for-each-ref", "--sort=committerdate", "--format=%(refname) %(objectname)", prefix)
    return [(ref[len(prefix) :], sha) for ref, sha in (line.split() for line in refs.splitlines())]
