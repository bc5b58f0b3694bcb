"""Commands on where runs run: a ``queue`` of experiments over this machine's ``shares``, a sweep on
a SLURM ``cluster``, and a node that ``join``s a run across machines."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lehr.commands.arguments import env_argument


def _actions(p: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """A command's actions (``lehr queue start``), each added with ``_action`` so that it is
    formatted as the command is: argparse does not pass a parser's formatter on to its subparsers."""
    return p.add_subparsers(dest="action", required=True, metavar="ACTION")


def _action(
    actions: argparse._SubParsersAction[argparse.ArgumentParser],
    p: argparse.ArgumentParser,
    name: str,
    **kw: Any,
) -> argparse.ArgumentParser:
    return actions.add_parser(name, formatter_class=p.formatter_class, **kw)


def queue_arguments(p: argparse.ArgumentParser) -> None:
    actions = _actions(p)
    start = _action(
        actions,
        p,
        "start",
        help="run the queued experiments (lehr exp --queue ...) until none is left",
        description="Run the experiments queued with `python -m lehr exp --queue` (or `dvc exp run "
        "--queue`), N at once, each on its own share of the machine (LEHR_JOBS=N for its stages). "
        "Ctrl-C or SIGTERM stops the queue: no queued experiment starts, and each running one saves "
        "a checkpoint and stops; queued again with the same values, it resumes (docs/parallel.md).",
    )
    start.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=1,
        help="experiments at once, each on 1/N of the cores or its own GPUs",
    )
    _action(
        actions,
        p,
        "stop",
        help="stop the queue from another terminal, as Ctrl-C of `lehr queue start` does",
        description="The same stop as Ctrl-C of `lehr queue start`: no queued experiment starts, and "
        "each running one saves a checkpoint and stops.",
    )


def queue(args: argparse.Namespace) -> int:
    from lehr.project.queue import start, stop_elsewhere

    if args.action == "start":
        return start(Path.cwd(), args.jobs)
    stop_elsewhere(Path.cwd())
    return 0


QUEUE = (
    "run DVC's queued experiments N at a time, each on its own share of the machine",
    queue_arguments,
    queue,
)


def cluster_arguments(p: argparse.ArgumentParser) -> None:
    actions = _actions(p)
    submit = _action(
        actions,
        p,
        "submit",
        help="a sweep of experiments as a SLURM job array; waits and gathers them (docs/team.md)",
        description="Every combination of the -S values (DVC's sweeps: -S F:K=1,2) as one experiment, "
        "each a task of one SLURM job array, at most --at-once running. Each task clones the commit "
        "from the git remote onto shared storage (--folder), runs `lehr exp` there and pushes its "
        "experiment to the git and DVC remotes; this command waits and pulls them here (`lehr "
        "experiments` compares them). A requeued task resumes from its checkpoint. The working tree "
        "must be clean and its commit pushed.",
    )
    _submit_arguments(submit)
    gather = _action(
        actions,
        p,
        "gather",
        help="wait for a sweep's tasks, then pull their experiments here",
        description="Wait for every task of a sweep submitted with --no-wait, then `dvc exp pull` "
        "each finished experiment from the git and DVC remotes.",
    )
    gather.add_argument("folder", help="the sweep's folder, as `lehr cluster submit` printed it")


def _submit_arguments(submit: argparse.ArgumentParser) -> None:
    submit.add_argument(
        "-S",
        "--set-param",
        dest="set",
        action="append",
        default=[],
        metavar="F:K=V",
        help="a param, or several values of it (a sweep), as `dvc exp run -S` takes them, e.g. "
        "conf/base/parameters_anneal.yml:anneal.decay_ratio=0.2,0.4",
    )
    submit.add_argument(
        "--ladder",
        nargs="?",
        const="all",
        metavar="SIZES",
        help="the ladder's rungs instead (all, or sizes: 1,3), each a task; DVC's run cache gathers them",
    )
    submit.add_argument("-n", "--name", help="the sweep's name; its experiments are NAME-1, NAME-2, ...")
    submit.add_argument("--partition", help="SLURM partition (default: the cluster's)")
    submit.add_argument("--account", help="SLURM account to charge")
    submit.add_argument("--time", type=int, default=240, help="each task's time limit, minutes")
    submit.add_argument("--gpus-per-task", type=int, default=0, help="GPUs for each task (0: a CPU run)")
    submit.add_argument("--cpus-per-task", type=int, default=1, help="cores for each task")
    submit.add_argument("--at-once", type=int, default=4, help="tasks running at once, at most")
    submit.add_argument(
        "--folder", default="build/cluster", help="on storage every node shares: the tasks' clones and logs"
    )
    submit.add_argument("--git-remote", default="origin", help="the git remote the tasks clone from")
    submit.add_argument("--no-wait", action="store_true", help="return once submitted; gather later")
    submit.add_argument(
        "--local", action="store_true", help="no SLURM: submitit runs the same tasks on this machine"
    )


def cluster(args: argparse.Namespace) -> int:
    from lehr.paths import profile_in_force
    from lehr.project.cluster import gather_later, submit_sweep

    project = Path.cwd()
    if args.action == "gather":
        return gather_later(project, Path(args.folder))
    return submit_sweep(
        project,
        profile_in_force(project),
        args.set,
        name=args.name,
        folder=Path(args.folder),
        git_remote=args.git_remote,
        local=args.local,
        wait_for_it=not args.no_wait,
        ladder=args.ladder,
        partition=args.partition,
        account=args.account,
        time_min=args.time,
        gpus_per_task=args.gpus_per_task,
        cpus_per_task=args.cpus_per_task,
        at_once=args.at_once,
    )


CLUSTER = (
    "a sweep of experiments as a SLURM job array (submitit), gathered back here",
    cluster_arguments,
    cluster,
)


def shares_arguments(p: argparse.ArgumentParser) -> None:
    pass  # none: it lists every share


def shares(args: argparse.Namespace) -> int:
    from lehr.project.queue import shares_table

    print(shares_table())
    return 0


SHARES = ("who holds which share of this machine's cores and GPUs now", shares_arguments, shares)


def join_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("stage", help="pretrain_stable or anneal")
    env_argument(p, "the one in conf/profile.yaml, which node 0 runs")
    p.add_argument(
        "--params", default="", help="node 0's --params, with this node's pretrain.launch.node_rank"
    )


def join(args: argparse.Namespace) -> int:
    from lehr.paths import profile_in_force
    from lehr.training import join as multi_node

    env = args.env or profile_in_force(Path.cwd())
    node = multi_node.join(Path.cwd(), args.stage, env, multi_node.runtime_params(args.params))
    print(f"node {node} trained its share of the {args.stage} run; node 0 saved the stage's outputs")
    return 0


JOIN = (
    "on node i > 0 of a run across machines: train its share (node 0 runs the stage)",
    join_arguments,
    join,
)
