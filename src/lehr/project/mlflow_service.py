"""MLflow's UI on the project's store (``python -m lehr mlflow-ui``), or one tracking server for a
team (``python -m lehr mlflow-server``), each stopped whole by Ctrl-C or SIGTERM.

``mlflow ui`` and ``mlflow server`` alone ignore SIGTERM, and on Ctrl-C leave their job-execution
workers (``huey``) behind. Here each runs with job execution off and one web worker, in a process
group of its own, and a signal to this process ends that whole group.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

GRACE_S = 10  # then the group is killed


def ui(store: str, host: str, port: int) -> int:
    cmd = ["ui", "--backend-store-uri", store]
    return _serve(cmd, host, port, f"MLflow UI on http://{host}:{port} (store {store})")


def server(root: Path, host: str, port: int, allowed_hosts: str | None = None) -> int:
    """A tracking server whose runs live in ``root/mlflow.db`` (sqlite) and whose artifacts live in
    ``root/artifacts``: clients send both over HTTP (the server proxies artifacts), so a clone on
    another machine needs no path of this one's, only ``MLFLOW_TRACKING_URI=http://host:port``."""
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    cmd = ["server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}"]
    cmd += ["--artifacts-destination", str(root / "artifacts"), "--serve-artifacts"]
    if not _loopback(host):
        # MLflow's server checks no one: whoever reaches the port reads and writes every run.
        print(
            f"warning: bound to {host}, beyond this machine, and with no authentication of its own: "
            "anyone who reaches the port reads and changes every run (docs/team.md)",
            file=sys.stderr,
            flush=True,
        )
        # MLflow answers only requests addressed to localhost or a private address unless told
        # otherwise (its guard against DNS rebinding): clients elsewhere name this machine.
        cmd += ["--allowed-hosts", allowed_hosts or ",".join(_names_of_this_machine(host, port))]
    # Clients elsewhere reach a server bound to every interface by this machine's name.
    url = f"http://{socket.gethostname() if _unspecified(host) else host}:{port}"
    return _serve(
        cmd,
        host,
        port,
        f"MLflow server on {url} (runs and artifacts in {root}); clients: export MLFLOW_TRACKING_URI={url}",
    )


def _names_of_this_machine(host: str, port: int) -> list[str]:
    """What clients may call this server in their requests' Host header: this machine's names and
    addresses (the one bound to, or all of them), each with and without the port."""
    import psutil  # DVC's dependency, so always there

    names = {"localhost", socket.gethostname(), socket.getfqdn()}
    names.update(
        a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET
    )
    if not _unspecified(host):
        names.add(host)
    return sorted(f"{n}{p}" for n in names for p in ("", f":{port}"))


def _unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def _serve(cmd: list[str], host: str, port: int, banner: str) -> int:
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", *cmd, "--host", host, "--port", str(port), "--workers", "1"]
    process = subprocess.Popen(cmd, env=env, start_new_session=True)
    received: list[int] = []

    def stop(signum: int, _frame) -> None:
        received.append(signum)
        with_group(process.pid, signal.SIGTERM)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    print(f"{banner}; Ctrl-C stops it", flush=True)
    try:
        rc = process.wait()
    finally:
        if process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=GRACE_S)
        with_group(process.pid, signal.SIGKILL)  # whatever of the group is left, workers included
    return 128 + received[0] if received else rc


def with_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
