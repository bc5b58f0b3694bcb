"""soup: ``kedro run --pipelines soup --params "soup.branches=a+b"`` adds branch ``soup-a-b``,
which evaluate then scores like any other branch."""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path

from lehr.catalog.branches_dataset import kind_of
from lehr.engine.artifacts.soup import average
from lehr.files.names import RULE, is_folder_name
from lehr.params.stages import SoupParams
from lehr.tracking.provenance import branched_from

log = logging.getLogger(__name__)


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
    origins = {b: branched_from(branches[b] / "final") for b in params.branches}
    if len(set(origins.values())) > 1:
        by_origin: dict = {}
        for b, origin in origins.items():
            by_origin.setdefault(origin, []).append(b)
        raise ValueError(
            "refusing to average branches of different pre_anneal checkpoints (they are different "
            "models, not anneals of one): "
            + "; ".join(
                f"{', '.join(bs)} from pre_anneal {(o or 'unknown')[:12]}" for o, bs in by_origin.items()
            )
            + ". Soup only branches of one stable phase (`python -m lehr branches` shows them)."
        )
    name = params.name or "soup-" + "-".join(params.branches)
    if not is_folder_name(name):
        raise ValueError(f"the soup's name {name!r} {RULE}: set soup.name")
    if name in branches and kind_of(branches[name]) != "soup":
        raise ValueError(
            f"soup.name = {name!r} is a trained anneal branch ({branches[name]}): a soup may not replace "
            "it. Choose another soup.name."
        )
    # The averaged weights wait here for the branches dataset to copy them in; it removes the
    # folder once it has (and the TemporaryDirectory does at the latest when the process ends).
    scratch = tempfile.TemporaryDirectory(prefix="lehr-soup-")
    log.info("soup: averaging the final weights of %s into branch %s", ", ".join(params.branches), name)
    average([branches[b] / "final" for b in params.branches], Path(scratch.name) / "final")
    record = {"soup": dataclasses.asdict(params)}
    return {"branch": name, "run_dir": scratch.name, "scratch": scratch, "kind": "soup", "params": record}
