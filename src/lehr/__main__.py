"""``python -m lehr``: small commands around the pipeline (Kedro runs the stages themselves).

    python -m lehr corpus [--out data/01_raw/corpus]   lay out the bundled corpus
"""

from __future__ import annotations

import argparse
import sys

from lehr.corpus import CorpusError


def _corpus(args: argparse.Namespace) -> int:
    from lehr.bundled_corpus import build

    counts = build(args.out)
    for stream, n in counts.items():
        print(f"{stream:20s} {n:6d} documents")
    print(f"bundled corpus written to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lehr")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("corpus", help="lay out the bundled corpus in the raw layer")
    p.add_argument("--out", default="data/01_raw/corpus")
    p.set_defaults(func=_corpus)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (CorpusError, ValueError, FileNotFoundError) as e:
        print(f"lehr: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
