"""A team on two machines, as two clones of one project on the smoke profile (minutes: ``make
integration``): a bare git remote, a local DVC remote and one MLflow server (``lehr mlflow-server``).

- ``dvc push`` on one clone; on the other, ``dvc pull`` (exit 0), a ``dvc repro`` that trains nothing
  and a branch by hand from the pulled ``pre_anneal``;
- an experiment from each clone at once, each tracked whole on the shared server, with its host,
  share and run folder; ``dvc exp push``/``pull`` bring both into one clone's ``lehr experiments``,
  each with its interval; a name the remote holds already is refused before anything trains;
- in the sandbox, ``dvc pull``, ``dvc checkout`` and ``dvc exp apply`` exit 0.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

from tests.e2e import env, sh, team

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ANNEAL = "conf/base/parameters_anneal.yml:anneal"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """``python -m lehr mlflow-server`` on a free port of 127.0.0.1, stopped by SIGTERM at the end."""
    port = free_port()
    root = tmp_path / "server"
    proc = subprocess.Popen(
        ["python", "-m", "lehr", "mlflow-server", "--root", str(root), "--port", str(port)],
        env=env(),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            break
        except OSError:
            assert proc.poll() is None and time.time() < deadline, (
                proc.stdout.read() if proc.poll() else "no answer"
            )
            time.sleep(0.5)
    yield url, root
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # the whole group is gone, workers included


def test_two_clones_share_data_and_experiments_through_the_remotes_and_one_mlflow_server(
    smoke_repo, tmp_path, mlflow_server
):
    url, server_root = mlflow_server
    a, b = team(smoke_repo, tmp_path)

    # B: the data arrives, the pipeline is up to date, and a branch starts from the pulled pre_anneal.
    sh(b, "dvc", "pull")
    assert "Data and pipelines are up to date" in sh(b, "dvc", "status").stdout
    assert "Running stage" not in sh(b, "dvc", "repro").stdout
    out = sh(b, "kedro", "run", "--pipelines", "anneal", "--params", "anneal.branch=from-b").stderr
    assert "branch data/06_models/branches/from-b" in out, out
    assert "pretrain_stable" not in out

    # One experiment on each machine at once, both tracked on the one server.
    tracked = {"MLFLOW_TRACKING_URI": url, "LEHR_MLFLOW": "1", "LEHR_JOBS": "2"}
    runs = {
        clone: subprocess.Popen(
            ["python", "-m", "lehr", "exp", "-n", name, "-S", f"{ANNEAL}.decay_ratio={ratio}"],
            cwd=clone,
            env={**env(), **tracked},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for clone, name, ratio in ((a, "exp-a", 0.3), (b, "exp-b", 0.4))
    }
    for _clone, proc in runs.items():
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, output

    # Each landed whole on the server: its stages FINISHED, with host, share and its own run folder.
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=url)
    (experiment,) = [e for e in client.search_experiments() if e.name == "lehr"]
    anneals = {
        r.data.tags["dvc.exp_name"]: r
        for r in client.search_runs([experiment.experiment_id], "tags.`lehr.stage` = 'anneal'")
        if r.data.tags.get("dvc.exp_name")
    }
    assert set(anneals) == {"exp-a", "exp-b"}
    for r in anneals.values():
        assert r.info.status == "FINISHED"
        assert r.data.tags["lehr.host"] == socket.gethostname() and r.data.tags["lehr.cores"]
        assert r.data.metrics, "no metrics reached the server"
        artifacts = server_root / "artifacts" / experiment.experiment_id / r.info.run_id / "artifacts"
        assert (artifacts / "reports").is_dir(), f"no reports in the server's artifact root ({artifacts})"
    folders = {r.data.tags["lehr.run_folder"] for r in anneals.values()}
    assert len(folders) == 2, "two clones' runs share one run identity"

    # The experiments travel: B's comes to A, and A's table shows both with their intervals.
    for clone, name in ((a, "exp-a"), (b, "exp-b")):
        pushed = sh(clone, "dvc", "exp", "push", "origin", name)
        assert "diverged" not in pushed.stdout + pushed.stderr
    sh(a, "dvc", "exp", "pull", "origin", "exp-b")
    table = sh(a, "python", "-m", "lehr", "experiments").stdout
    for name in ("exp-a", "exp-b"):
        (line,) = [row for row in table.splitlines() if row.startswith(name)]
        assert "[" in line and "]" in line, table  # its paired 95% interval

    # A name the remote already holds is refused by name, before anything trains.
    taken = sh(
        b, "python", "-m", "lehr", "exp", "-n", "exp-a", "-S", f"{ANNEAL}.decay_ratio=0.5", check=False
    )
    assert taken.returncode == 2
    assert "experiment name 'exp-a' is taken on git remote 'origin' (pushed from another" in taken.stderr
    pulled = sh(
        a, "python", "-m", "lehr", "exp", "-n", "exp-b", "-S", f"{ANNEAL}.decay_ratio=0.5", check=False
    )
    assert "'exp-b' is taken on git remote 'origin' and here (pulled from it)" in pulled.stderr, pulled.stderr
    # Why: DVC's own push of a name the remote holds pushes nothing, exits 0, and says "diverged"
    # (the word lehr's cluster tasks look for).
    sh(b, "dvc", "exp", "run", "-n", "exp-a", "-S", f"{ANNEAL}.decay_ratio=0.5")
    diverged = sh(b, "dvc", "exp", "push", "origin", "exp-a")
    assert "diverged" in diverged.stdout + diverged.stderr, diverged

    # In the sandbox (A), DVC's commands exit 0 once everything they need is there.
    sh(a, "dvc", "pull")
    sh(a, "dvc", "checkout")
    sh(a, "dvc", "exp", "apply", "exp-b")
    sh(a, "dvc", "checkout")
