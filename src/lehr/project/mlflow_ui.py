"""``python -m lehr mlflow-ui``: MLflow's UI on the project's store, on this machine only, that stops
whole on Ctrl-C or SIGTERM.

``mlflow ui`` alone ignores SIGTERM, and on Ctrl-C leaves its job-execution workers (``huey``)
behind. Here it runs with job execution off and one web worker, in a process group of its own,
and a signal to this process ends that whole group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

GRACE_S = 10  # then the group is killed


def serve(store: str, host: str, port: int) -> int:
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store]
    cmd += ["--host", host, "--port", str(port), "--workers", "1"]
    server = subprocess.Popen(cmd, env=env, start_new_session=True)
    received: list[int] = []

    def stop(signum: int, _frame) -> None:
        received.append(signum)
        with_group(server.pid, signal.SIGTERM)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    print(f"MLflow UI on http://{host}:{port} (store {store}); Ctrl-C stops it", flush=True)
    try:
        rc = server.wait()
    finally:
        if server.poll() is None:
            try:
                server.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        with_group(server.pid, signal.SIGKILL)  # whatever of the group is left, workers included
    return 128 + received[0] if received else rc


def with_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
