"""``python -m lehr``: small commands around the pipeline (Kedro runs the stages themselves).
Each command's arguments and handler are in ``lehr.commands``, one module per family.

python -m lehr corpus --out DIR         lay out the bundled corpus in a new folder
python -m lehr branches [--root DIR]    list the anneal branches side by side (default: the catalog's)
python -m lehr info CHECKPOINT          which code, config and data made a checkpoint
python -m lehr export CHECKPOINT OUT [--hf]   safetensors + config JSON, or a transformers model
python -m lehr eval CHECKPOINT --task F.jsonl  score a checkpoint or export on a task file
python -m lehr generate CHECKPOINT --prompt P  sample text, streamed
python -m lehr compare A B              B - A per source and task, with paired 95% intervals
python -m lehr ladder predict --params N --tokens D   the ladder's predicted loss, with an interval
python -m lehr lm-eval CHECKPOINT --tasks T,U  lm-evaluation-harness tasks (the lm-eval extra)
python -m lehr runs                     the rolling run folders: step, state, use, size
python -m lehr prune [--unfinished] [--yes]   remove rolling folders nothing in the workspace came from
python -m lehr check [--env PROFILE]    validate every stage's params against the data there is
python -m lehr exp -n NAME -S F:K=V     `dvc exp run` with its -S values checked first, from the same baseline
python -m lehr experiments              every experiment: changed params, figures, paired 95% difference
python -m lehr queue start -j N         the queued experiments, N at once, each on its share; Ctrl-C stops
python -m lehr queue stop               no queued experiment starts; running ones save a checkpoint, stop
python -m lehr cluster submit -S F:K=1,2   a sweep as a SLURM job array; its experiments come back here
python -m lehr shares                   who holds which share of this machine (cores, GPUs)
python -m lehr mlflow-ui [--port N]    MLflow's UI on this machine, stopped whole by Ctrl-C or SIGTERM
python -m lehr mlflow-server [--root D] [--host H]   one tracking server for a team (docs/team.md)
python -m lehr sandbox DEST [--profile P] [--ladder]  a throwaway copy of the project (`make smoke`)
python -m lehr join STAGE --params ...  node i > 0 of a run across machines: train its share
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from lehr.commands import checkpoints, data, experiments, ladder, machines, model_folders, tracking
from lehr.errors import EXIT
from lehr.errors.messages import explained

# name: (what it does, its arguments, what runs it), in the order `lehr --help` lists them
COMMANDS = {
    "corpus": data.CORPUS,
    "branches": model_folders.BRANCHES,
    "info": checkpoints.INFO,
    "export": checkpoints.EXPORT,
    "check": experiments.CHECK,
    "eval": checkpoints.EVAL,
    "lm-eval": checkpoints.LM_EVAL,
    "generate": checkpoints.GENERATE,
    "ladder": ladder.LADDER,
    "compare": checkpoints.COMPARE,
    "exp": experiments.EXP,
    "experiments": experiments.EXPERIMENTS,
    "queue": machines.QUEUE,
    "cluster": machines.CLUSTER,
    "shares": machines.SHARES,
    "mlflow-ui": tracking.MLFLOW_UI,
    "mlflow-server": tracking.MLFLOW_SERVER,
    "sandbox": experiments.SANDBOX,
    "runs": model_folders.RUNS,
    "prune": model_folders.PRUNE,
    "join": machines.JOIN,
}


class Help(argparse.ArgumentDefaultsHelpFormatter):
    """An option's default where it has one to show and its help does not say it already;
    argparse %-formats every help, so a % in one (95% intervals) is a percent sign."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = (action.help or "").replace("%", "%%")
        default = action.default
        if default is None or default is False or default == "" or default is argparse.SUPPRESS:
            return text
        if "default" in text or not (action.option_strings or action.nargs in ("?", "*")):
            return text
        return f"{text} (default: %(default)s)"


REEXEC = "LEHR_WORKSPACE_CODE"  # set for the one re-run under the workspace's code


def run_the_workspaces_code(argv: list[str]) -> None:
    """At a lehr project's root, run that project's ``src/lehr``, as Kedro does for its stages.
    The ``lehr`` a virtualenv installed may be another checkout's (a sandbox shares the project's
    virtualenv), and an edit in this workspace would then not run while its records named it. So
    the command runs again with the workspace's ``src`` first; if that still imports another lehr,
    it is refused, naming both."""
    src = Path.cwd() / "src"
    if not (src / "lehr" / "__main__.py").is_file():
        return  # not at a lehr project's root: whichever lehr is installed is the one meant
    running = Path(__file__).resolve().parent
    if running == (src / "lehr").resolve():
        os.environ.pop(REEXEC, None)  # its children decide for themselves
        return
    if os.environ.get(REEXEC):
        raise SystemExit(
            f"lehr: error: this is the lehr in {running}, but the project here runs {src / 'lehr'}; with "
            f"PYTHONPATH={src} it still imported the other. Run the commands with this project's own "
            "virtualenv (make setup), or from the project the virtualenv belongs to."
        )
    pythonpath = os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))
    os.execve(
        sys.executable,
        [sys.executable, "-m", "lehr", *argv],
        {**os.environ, "PYTHONPATH": pythonpath, REEXEC: "1"},
    )


def main(argv: list[str] | None = None) -> int:
    from lehr.errors import Stopped, stop_on_signals
    from lehr.errors.kedro_logs import VALIDATOR, quiet_config_loader, quiet_errors

    quiet_config_loader()
    if argv is None:  # a command line, not a call from Python
        run_the_workspaces_code(sys.argv[1:])

    parser = argparse.ArgumentParser(
        prog="lehr",
        description="Small commands around the pipeline; Kedro runs its stages: kedro run --pipelines STAGE",
        formatter_class=Help,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (summary, add_arguments, run) in COMMANDS.items():
        p = sub.add_parser(name, help=summary, description=summary, formatter_class=Help)
        add_arguments(p)
        p.set_defaults(func=run)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["exp"] and argv[1:2] not in (["-h"], ["--help"]):
        # `lehr exp` hands its arguments to `dvc exp run` as they are (argparse would take -n, -S as its own).
        args = argparse.Namespace(func=experiments.exp, dvc_args=argv[1:])
    else:
        args = parser.parse_args(argv)
    try:
        with stop_on_signals(), quiet_errors(VALIDATOR):
            return args.func(args)
    except Exception as e:
        message = explained(e)
        if message is None:
            raise
        for line in message.splitlines():  # one per parameter when several fail
            print(f"lehr: error: {line}", file=sys.stderr)
        return EXIT
    except (Stopped, KeyboardInterrupt) as e:
        stop = Stopped.of(e)
        print(f"lehr: {stop}", file=sys.stderr)
        return stop.exit_status


if __name__ == "__main__":
    raise SystemExit(main())
