"""Commands that serve MLflow's tracking: its UI on this machine (``mlflow-ui``), or one server for
a team (``mlflow-server``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def _bind_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="127.0.0.1: this machine only; another address opens it, unauthenticated, to all who reach it",
    )
    p.add_argument("--port", type=int, default=5000)


def mlflow_ui_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store", default="sqlite:///mlflow.db", help="the tracking store (conf/base/mlflow.yml's)"
    )
    _bind_arguments(p)


def mlflow_ui(args: argparse.Namespace) -> int:
    from lehr.project.mlflow_service import ui

    return ui(args.store, args.host, args.port)


MLFLOW_UI = (
    "MLflow's UI on the project's store until Ctrl-C, all of it stopped then",
    mlflow_ui_arguments,
    mlflow_ui,
)


def mlflow_server_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--root", default="mlflow-server", help="the server's own folder: runs (mlflow.db) and artifacts"
    )
    _bind_arguments(p)
    p.add_argument(
        "--allowed-hosts",
        help="the names clients may call the server by (MLflow's --allowed-hosts; default beyond "
        "127.0.0.1: this machine's names and addresses)",
    )


def mlflow_server(args: argparse.Namespace) -> int:
    from lehr.project.mlflow_service import server

    return server(Path(args.root), args.host, args.port, args.allowed_hosts)


MLFLOW_SERVER = (
    "one MLflow tracking server for a team (sqlite + artifacts in --root) until Ctrl-C",
    mlflow_server_arguments,
    mlflow_server,
)
