"""Commands on the folders training leaves in the models layer: the anneal branches (``branches``)
and the rolling run folders (``runs``, ``prune``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lehr.commands.arguments import catalog, env_argument


def branches_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--root", help="one folder of branches; default: both homes in the catalog's anneal_branches"
    )
    env_argument(p)


def branches(args: argparse.Namespace) -> int:
    from lehr.catalog.branches_dataset import made_by, scan, scan_homes
    from lehr.engine.artifacts.state import State
    from lehr.paths import branch_homes
    from lehr.reports.checkpoint_info import last_eval

    homes: tuple[Path, ...]
    if args.root:
        homes, (found, left_out) = (Path(args.root),), scan(Path(args.root))
    else:
        homes = branch_homes(Path.cwd(), args.env)
        found, left_out = scan_homes(homes[0], homes[1])  # the listing evaluate and soup read
    for line in left_out:
        print(f"left out: {line}", file=sys.stderr)
    if not found:
        print(
            f"no anneal branches in {' or '.join(map(str, homes))}; make one with `kedro run --pipelines "
            "anneal --params anneal.branch=NAME`"
        )
        return 0
    from lehr.tracking.provenance import origin_name

    print(
        f"{'branch':28s} {'made by':>9s} {'origin':>16s} {'step':>6s} {'tokens':>11s} {'heldout.bpb':>12s} "
        f"{'best loss':>10s}"
    )
    for p in found.values():
        prog = State.read(p / "final").progress
        ev = last_eval(prog)
        print(
            f"{p.name:28s} {made_by(p):>9s} {origin_name(p / 'final') or '?':>16s} {prog['step']:6d} "
            f"{prog['tokens']:11,d} {ev.get('heldout', {}).get('bpb', float('nan')):12.4f} "
            f"{prog.get('best_loss') or float('nan'):10.4f}"
        )
    from lehr.paths import portable

    print(f"folders: {', '.join(map(portable, homes))} (docs/tracking.md: which command writes where)")
    return 0


BRANCHES = ("list the anneal branches", branches_arguments, branches)


def _layout(args: argparse.Namespace):
    from lehr.paths import branch_homes
    from lehr.project.run_folders import Layout

    paths = catalog(args)
    homes = branch_homes(Path.cwd(), getattr(args, "env", None))
    return Layout(paths["stable_run"], paths["pre_anneal"], paths["anneal_runs"], homes)


def runs(args: argparse.Namespace) -> int:
    from lehr.project.run_folders import scan

    layout = _layout(args)
    folders = scan(layout)
    if not folders:
        print(f"no rolling run folders in {layout.stable_run} or {layout.anneal_runs}")
        return 0
    print(f"{'kind':7s} {'folder':36s} {'step':>6s} {'state':12s} {'in use':6s} {'MB':>9s}")
    for f in folders:
        state = "running" if f.live else "finished" if f.finished else "stopped"
        print(
            f"{f.kind:7s} {f.path.name:36s} {f.step if f.step is not None else '-':>6} "
            f"{state:12s} {'yes' if f.in_use else 'no':6s} {f.size / 1e6:9.1f}"
            + (f"  ({f.live})" if f.live else "")
        )
    return 0


RUNS = ("list the rolling run folders (resume points of each configuration)", env_argument, runs)


def prune_arguments(p: argparse.ArgumentParser) -> None:
    env_argument(p)
    p.add_argument(
        "--unfinished", action="store_true", help="also runs that stopped part way (their progress is lost)"
    )
    p.add_argument("--yes", action="store_true", help="remove them; without it, only say what would go")


def prune(args: argparse.Namespace) -> int:
    from lehr.project.run_folders import prunable, remove, scan

    folders = scan(_layout(args))
    for f in folders:
        if f.live:
            print(f"keeping {f.path}: a run is writing it ({f.live})")
    doomed = prunable(folders, unfinished=args.unfinished)
    if not doomed:
        print(
            "nothing to prune: every rolling folder is in use" + ("" if args.unfinished else " or unfinished")
        )
        return 0
    for f in doomed:
        print(
            f"{'removing' if args.yes else 'would remove'} {f.path} ({f.size / 1e6:.1f} MB, "
            f"{'finished' if f.finished else 'unfinished'})"
        )
        if args.yes:
            remove(f)  # raises, touching nothing, if a run took the folder since the scan
    total = sum(f.size for f in doomed) / 1e6
    print(
        f"{'freed' if args.yes else 'would free'} {total:.1f} MB"
        + ("" if args.yes else "; run again with --yes")
    )
    return 0


PRUNE = ("remove rolling run folders that nothing in the workspace came from", prune_arguments, prune)
