"""What the words name exists: every dotted ``lehr.…`` name and every ``src/lehr/…`` path in the
code, the configuration and the docs, so a move or a rename cannot leave a comment pointing at
code that is gone."""

from __future__ import annotations

import importlib
import re

import pytest

from tests import ROOT

DOTTED = re.compile(r"(?<![.@\w])lehr(?:\.[A-Za-z_][A-Za-z0-9_]*)+")  # not in .lehr.lock, @lehr.invalid
# Dotted names that are not code: the training log's logger and lehr's MLflow tags.
NOT_CODE = {
    "lehr.train",
    "lehr.stage",
    "lehr.group",
    "lehr.kedro_env",
    "lehr.error",
    "lehr.run_dir",
    "lehr.earlier_attempts",
    "lehr.run_folder",
    "lehr.process",
    "lehr.host",
    "lehr.cores",
    "lehr.gpus",
}
PATH = re.compile(r"\bsrc/lehr/[A-Za-z0-9_/]+(?:\.py)?")
# A file named from inside the package, as comments do: ``engine/run/loop.py``.
ROOMS = "|".join(
    ("engine", "dataprep", "catalog", "params", "training", "hooks", "commands", "errors", "reports")
    + ("project", "files", "pipelines", "tracking")
)
PACKAGE_PATH = re.compile(rf"(?<![\w/.])(?:{ROOMS})/[A-Za-z0-9_/]+\.py\b")
FILES = [
    *sorted((ROOT / "src").rglob("*.py")),
    *sorted((ROOT / "tests").rglob("*.py")),
    *sorted((ROOT / "bench").glob("*.py")),
    *sorted((ROOT / "conf").rglob("*.y*ml")),
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "README.md",
    ROOT / "dvc.yaml",
    ROOT / "Makefile",
]


def _exists(dotted: str) -> bool:
    """A module, or a name inside one (``lehr.hooks.mlflow_tracking.MlflowTracking``)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_module_and_path_exists(path):
    text = path.read_text(encoding="utf-8")
    missing = sorted(
        {m for m in DOTTED.findall(text) if m not in NOT_CODE and not _exists(m)}
        | {p for p in PATH.findall(text) if not (ROOT / p).exists()}
        | {p for p in PACKAGE_PATH.findall(text) if not (ROOT / "src/lehr" / p).exists()}
    )
    assert not missing, f"{path.relative_to(ROOT)} names what does not exist: {missing}"
