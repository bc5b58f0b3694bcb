"""Kedro's project commands, as lehr runs them: ``kedro run`` with lehr's errors as one line.

A stage that refuses bad input, or a hook that refuses a run, says what is wrong and what to do;
Kedro would print that line at the end of a long traceback. This ``run`` is Kedro's own (the same
options, the same session), with an explained error (``lehr.errors``) printed alone, exit 2: a
parameter's names where it is set (``--params``, or the YAML file and line). A signal (Ctrl-C,
``kill``) ends it with one line too, and the signal's exit status (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click
from kedro.framework.cli.project import run as kedro_run

from lehr.errors import EXIT, Stopped, stop_on_signals
from lehr.errors.kedro_logs import NODE_FAILURE, VALIDATOR, held_back, quiet_errors, release
from lehr.errors.messages import explained
from lehr.params.key_lines import located


@click.group(name="lehr")
def cli() -> None:
    """lehr's project commands."""


def _run(**options) -> None:
    held: list = []
    try:
        with stop_on_signals(), quiet_errors(VALIDATOR), held_back(NODE_FAILURE) as held:
            run = kedro_run.callback
            assert run is not None  # Kedro's `run` command is its function's
            run(**options)
    except Exception as e:
        message = explained(e) or _missing_profile(e, options.get("env"))
        if message is None:
            release(held)
            raise
        conf, env = _conf_and_env(options)
        for line in message.splitlines():  # one per parameter when several fail
            click.secho(f"lehr: error: {located(line, options.get('params'), conf, env)}", fg="red", err=True)
        sys.exit(EXIT)
    except (Stopped, KeyboardInterrupt) as e:
        stop = Stopped.of(e, " before the run finished: run the same command again to finish it")
        _end_tracking_run()
        click.echo(f"lehr: {stop}", err=True)
        sys.exit(stop.exit_status)


def _conf_and_env(options: dict) -> tuple[Path, str]:
    from lehr.paths import profile_in_force

    conf = Path(options.get("conf_source") or "conf")
    return conf, options.get("env") or profile_in_force(Path.cwd())


def _end_tracking_run() -> None:
    """A run a signal stopped is KILLED in MLflow (at exit MLflow would end it as FINISHED: the
    stop is no error, so Kedro's error hook, which marks it FAILED, never sees it)."""
    if "mlflow" not in sys.modules:
        return
    import mlflow

    with contextlib.suppress(Exception):
        if mlflow.active_run():
            mlflow.end_run("KILLED")


def _missing_profile(error: Exception, env: str | None) -> str | None:
    """``--env nope``: Kedro's MissingConfigException, said as what it means here."""
    if type(error).__name__ != "MissingConfigException" or not env:
        return None

    profiles = sorted(p.name for p in Path("conf").iterdir() if p.is_dir() and p.name != "base")
    return f"no profile {env!r}: the profiles (--env) are the folders of conf/: {', '.join(profiles)}"


cli.add_command(
    click.Command(
        "run", callback=_run, params=kedro_run.params, help=kedro_run.help, short_help=kedro_run.short_help
    )
)
