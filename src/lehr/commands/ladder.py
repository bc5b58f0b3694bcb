"""The ladder's command: ``lehr ladder predict``, the held-out loss its fitted law predicts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def ladder_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["predict"])
    p.add_argument("--params", type=float, help="parameters, counted as n_params in stage metrics")
    p.add_argument("--tokens", type=float, help="training tokens, the decay included")
    p.add_argument(
        "--checkpoint",
        help="a trained model instead (e.g. data/06_models/anneal/<branch>/final): its size and tokens, "
        "its own figure beside the prediction, and how its shape and anneal differ from the ladder's",
    )
    p.add_argument("--fit", help="the ladder's fit (make ladder); default: the catalog's ladder_fit")


def ladder(args: argparse.Namespace) -> int:
    from lehr.paths import catalog_paths
    from lehr.reports import ladder_prediction

    path = Path(args.fit) if args.fit else catalog_paths(Path.cwd())["ladder_fit"]
    if not path.is_file():
        raise FileNotFoundError(f"no ladder fit at {path}: run `make ladder` first (docs/ladder.md)")
    if (args.checkpoint is None) == (args.params is None or args.tokens is None) or (
        args.checkpoint and (args.params or args.tokens)
    ):
        raise ValueError("give --params N and --tokens D, or --checkpoint PATH (a trained model), not both")
    fitted = json.loads(path.read_text())
    run = ladder_prediction.trained(Path(args.checkpoint)) if args.checkpoint else None
    n, d = (run["n_params"], run["tokens"]) if run else (args.params, args.tokens)
    for line in ladder_prediction.prediction(fitted, n, d, run, args.checkpoint):
        print(line)
    recorded = fitted.get("family")
    family = recorded if recorded is not None else _family_in_conf()
    for line in ladder_prediction.family_notes(family, recorded is not None, run):
        print(line)
    return 0


def _family_in_conf() -> dict | None:
    """The ladder's family as this project's params describe it: a fit made before fits recorded
    their own was made from these unless they changed since (ladder/dvc.lock says)."""
    from lehr.config_parts import from_mapping
    from lehr.params.check import load_parameters
    from lehr.params.ladder import LadderParams
    from lehr.paths import profile_in_force

    conf = Path.cwd() / "conf"
    if not conf.is_dir():
        return None
    ladder = load_parameters(conf, profile_in_force(Path.cwd())).get("ladder")
    return from_mapping(LadderParams, ladder, "ladder").family() if ladder else None


LADDER = ("predict held-out loss and bits per byte from the ladder's fit", ladder_arguments, ladder)
