"""soup: ``kedro run --pipeline soup --params "soup.branches=a+b"`` adds branch ``soup-a-b``,
which evaluate then scores like any other branch."""

from __future__ import annotations

import tempfile
from pathlib import Path

from lehr.engine.soup import average
from lehr.params import SoupParams


def make_soup(branches: dict[str, Path], params: SoupParams) -> dict:
    if len(params.branches) < 2:
        raise ValueError(
            "parameter soup.branches must name at least two anneal branches, e.g. "
            "--params soup.branches=a+b (Kedro splits --params on commas)"
        )
    missing = [b for b in params.branches if b not in branches]
    if missing:
        raise ValueError(
            f"unknown anneal branch(es) {', '.join(missing)}; the branches are: "
            f"{', '.join(branches) or 'none'}"
        )
    name = params.name or "soup-" + "-".join(params.branches)
    run_dir = Path(tempfile.mkdtemp(prefix="lehr-soup-"))
    average([branches[b] / "final" for b in params.branches], run_dir / "final")
    return {"branch": name, "run_dir": str(run_dir)}
