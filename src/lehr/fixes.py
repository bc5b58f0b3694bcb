"""The commands lehr's messages tell a person to run, in one place.

A message that suggests a command builds it here, so that each command is spelled one way, and
tests/reliability/test_fixes.py can run each one on the case that prints it, on the smoke
sandbox, and check that it repairs what the message names.
"""

from __future__ import annotations

from pathlib import Path


def rebuild(stage: str) -> str:
    """``stage`` and what it needs: DVC brings back an output from its cache, or runs the stage."""
    return f"dvc repro {stage}"


def force_rebuild(stage: str) -> str:
    """``stage`` run again though DVC finds it up to date: an output of it is corrupt on disk."""
    return f"dvc repro --force {stage}"


def restore(path: str | Path) -> str:
    """A DVC-tracked output back from the cache, as its stage last made it. ``-f``: plain
    `dvc checkout` asks before it replaces a changed file and, with no terminal to ask at, fails."""
    return f"dvc checkout -f {path}"


def run_stage(stage: str, params: str = "") -> str:
    """One Kedro pipeline by hand, outside DVC (a branch, a slice of tokenize, a rung)."""
    return f"kedro run --pipelines {stage}" + (f" --params {params}" if params else "")


def setup() -> str:
    """The virtualenv with every pinned dependency (the bundled corpus's packages among them)."""
    return "make setup"


def join_node(stage: str) -> str:
    """Nodes 1 .. nnodes-1 of a run across machines (node 0 runs the stage itself)."""
    return f"python -m lehr join {stage}"
