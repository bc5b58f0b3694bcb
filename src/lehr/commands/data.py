"""Commands on the data: ``lehr corpus`` lays out the bundled corpus."""

from __future__ import annotations

import argparse
from pathlib import Path


def corpus_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out", required=True, help="a folder that does not exist yet (dvc.yaml's corpus stage names it)"
    )


def corpus(args: argparse.Namespace) -> int:
    from lehr.dataprep.bundled_corpus import build

    out = Path(args.out)
    if out.exists():
        # Whatever is there may be a user's own corpus: lehr never replaces or deletes it.
        print(
            f"{out} exists: left as it is (the bundled corpus is laid out only where no corpus is; "
            f"to lay it out again, move {out} away first)"
        )
        return 0
    for stream, n in build(out).items():
        print(f"{stream:20s} {n:6d} documents")
    print(f"bundled corpus written to {args.out}")
    return 0


CORPUS = ("lay out the bundled corpus in the raw layer", corpus_arguments, corpus)
