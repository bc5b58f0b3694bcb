"""Commands for trying a change: ``check`` its params, run it as a DVC experiment (``exp``), compare
the experiments (``experiments``), or try it in a throwaway copy of the project (``sandbox``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lehr.commands.arguments import env_argument


def check(args: argparse.Namespace) -> int:
    """Validate every stage's params under a profile, as the stages would, without running one.

    `dvc exp run -S key=bad` removes a stage's outputs before its command can refuse the value;
    checking first (`make check-params`, `lehr exp`) keeps them."""
    from lehr.params import tracked
    from lehr.params.check import problems_of
    from lehr.paths import profile_in_force

    env = args.env or profile_in_force(Path.cwd())
    for note in tracked.unread_overrides(Path.cwd(), env):
        print(f"note: {note}")
    from lehr.params.key_lines import located

    problems = problems_of(Path.cwd(), env)
    for p in problems:
        print(f"lehr: {located(p, None, Path('conf'), env)}", file=sys.stderr)
    if not problems:
        print(f"parameters of profile {env}: every stage's params are valid, against the data there is")
    return 2 if problems else 0


CHECK = ("validate every stage's params under a profile without running anything", env_argument, check)


def exp_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dvc_args",
        nargs=argparse.REMAINDER,
        help="`dvc exp run`'s own arguments, e.g. -n linear "
        "-S conf/base/parameters_anneal.yml:anneal.shape=linear",
    )


def exp(args: argparse.Namespace) -> int:
    from lehr.paths import profile_in_force
    from lehr.project.experiments import run

    return run(Path.cwd(), profile_in_force(Path.cwd()), args.dvc_args)


EXP = (
    "`dvc exp run` with every -S value checked first, each experiment relative to the same baseline",
    exp_arguments,
    exp,
)


def experiments_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--baseline", default="HEAD", help="the commit the experiments branched from")


def experiments(args: argparse.Namespace) -> int:
    from lehr.project.experiments import table

    print(table(Path.cwd(), args.baseline))
    return 0


EXPERIMENTS = (
    "every experiment of the baseline commit: changed params, figures, difference with its 95% interval",
    experiments_arguments,
    experiments,
)


def sandbox_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dest", help="a folder that does not exist yet, or an earlier sandbox (replaced)")
    p.add_argument("--profile", default="smoke", help="the profile it runs: a folder of conf/")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier sandbox even if it holds commits or experiments",
    )
    p.add_argument(
        "--ladder",
        action="store_true",
        help="bring the ladder's stages (ladder/dvc.yaml) along: `dvc repro ladder/dvc.yaml` runs them there",
    )


def sandbox(args: argparse.Namespace) -> int:
    from lehr.project.sandbox import create

    dest = create(Path.cwd(), Path(args.dest), args.profile, force=args.force, ladder=args.ladder)
    print(f"sandbox on the {args.profile} profile in {dest}: `cd {dest} && dvc repro` runs it")
    return 0


SANDBOX = (
    "a throwaway copy of this project on a profile, as its own git + DVC repo",
    sandbox_arguments,
    sandbox,
)
