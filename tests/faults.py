"""Faults injected into lehr from the tests (``tests/injected/sitecustomize.py`` holds the patches):
``env`` for a process the test starts, the functions below for a run in the test process."""

from __future__ import annotations

import os
from pathlib import Path

from tests.injected.sitecustomize import HELD_CHECKPOINT, NONFINITE, SLOW_CHECKPOINT, poison_steps

INJECTED = Path(__file__).parent / "injected"


def env(
    nonfinite_steps: str = "", slow_checkpoint: float = 0, held_checkpoint: Path | None = None
) -> dict[str, str]:
    """Variables for a child process (merge into its environment): the patches load at its start.
    ``held_checkpoint``: a file whose creation lets the process's checkpoint writes go on."""
    out = {"PYTHONPATH": os.pathsep.join(filter(None, [str(INJECTED), os.environ.get("PYTHONPATH")]))}
    if nonfinite_steps:
        out[NONFINITE] = nonfinite_steps
    if slow_checkpoint:
        out[SLOW_CHECKPOINT] = str(slow_checkpoint)
    if held_checkpoint is not None:
        out[HELD_CHECKPOINT] = str(held_checkpoint)
    return out


def nonfinite_at(monkeypatch, steps) -> None:
    """In this process: the loss of each of ``steps`` turns NaN."""
    from lehr.engine.run import loop

    poison_steps(loop, set(steps), monkeypatch.setattr)


def full_disk_allowed(scratch: Path) -> bool:
    """Whether this machine lets a test mount a tmpfs in a private user and mount namespace (a real
    full disk, no root needed): some containers refuse user namespaces or the mount itself."""
    import subprocess

    scratch.mkdir(parents=True, exist_ok=True)
    probe = ["unshare", "--user", "--map-root-user", "--mount", "mount", "-t", "tmpfs", "-o", "size=4k"]
    return subprocess.run([*probe, "tmpfs", str(scratch)], capture_output=True).returncode == 0
