"""The arguments several commands share, and the catalog's paths that ``--env`` selects."""

from __future__ import annotations

import argparse
from pathlib import Path


def checkpoint_argument(p: argparse.ArgumentParser, exports_too: bool = True) -> None:
    p.add_argument(
        "checkpoint",
        help="a checkpoint, or a folder made by `lehr export` (plain or --hf)" if exports_too else None,
    )


def tokenizer_argument(p: argparse.ArgumentParser, extra: str = "") -> None:
    p.add_argument(
        "--tokenizer", help=f"default: the tokenizer of the shards the checkpoint trained on{extra}"
    )


def env_argument(p: argparse.ArgumentParser, default: str = "the one in force") -> None:
    p.add_argument("--env", help=f"the profile (Kedro environment); default: {default}")


def batch_size_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--batch-size",
        type=int,
        default=16,
        help="sequences of the model's context scored at once (a batch: at most this many x seq_len tokens)",
    )


def catalog(args: argparse.Namespace) -> dict[str, Path]:
    """The catalog's paths under the profile ``--env`` names, or the one in force."""
    from lehr.paths import catalog_paths

    return catalog_paths(Path.cwd(), getattr(args, "env", None))
