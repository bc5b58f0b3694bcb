"""Kedro's project commands, as lehr runs them: ``kedro run`` with lehr's errors as one line.

A stage that refuses bad input, or a hook that refuses a run, says what is wrong and what to do;
Kedro would print that line at the end of a long traceback. This ``run`` is Kedro's own (the same
options, the same session), with an explained error (``lehr.errors``) printed alone, exit 2.
"""

from __future__ import annotations

import sys

import click
from kedro.framework.cli.project import run as kedro_run

from lehr.errors import EXIT, explained


@click.group(name="lehr")
def cli() -> None:
    """lehr's project commands."""


def _run(**options) -> None:
    try:
        kedro_run.callback(**options)
    except Exception as e:
        message = explained(e) or _missing_profile(e, options.get("env"))
        if message is None:
            raise
        click.secho(f"lehr: error: {message}", fg="red", err=True)
        sys.exit(EXIT)


def _missing_profile(error: Exception, env: str | None) -> str | None:
    """``--env nope``: Kedro's MissingConfigException, said as what it means here."""
    if type(error).__name__ != "MissingConfigException" or not env:
        return None
    from pathlib import Path

    profiles = sorted(p.name for p in Path("conf").iterdir() if p.is_dir() and p.name != "base")
    return f"no profile {env!r}: the profiles (--env) are the folders of conf/: {', '.join(profiles)}"


cli.add_command(
    click.Command(
        "run", callback=_run, params=kedro_run.params, help=kedro_run.help, short_help=kedro_run.short_help
    )
)
