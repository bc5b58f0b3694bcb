"""The README's newcomer's tour, run as written: every command of its bash block, parsed from
README.md (so the two cannot drift), in order, in a sandbox that `make smoke` builds, with MLflow
on as a person has it. Each must exit 0; afterwards every branch made by hand is still there, each
experiment differs from the baseline only by its own -S and is told apart in MLflow, the notebook
runs on what the tour made, and the project itself is as it was."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from lehr.engine.artifacts.state import State
from lehr.project.experiment_refs import experiments_of
from lehr.project.experiments import changed, flat_params
from tests import ROOT
from tests.e2e import cores_of, dir_hash, env, runs_of, sh, stages_run

pytestmark = pytest.mark.slow
SANDBOX = "build/smoke"


def tour() -> list[str]:
    """The tour's command lines: its bash block, without comment lines."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## A newcomer's tour.*?```bash\n(.*?)```", text, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def commented(prefix: str) -> str:
    """A command the tour shows in a comment (a server that runs until Ctrl-C)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## A newcomer's tour.*?```bash\n(.*?)```", text, re.S).group(1)
    return next(line.lstrip("# ").strip() for line in block.splitlines() if prefix in line)


def as_run_here(line: str, sandbox: Path) -> str:
    """The line with the sandbox where the tour says build/smoke, and its ``../../`` (the project,
    seen from build/smoke) pointing at this checkout: the developer's own build/smoke stays theirs."""
    line = line.replace("make smoke", f"make smoke SMOKE={sandbox}")
    line = line.replace(f"cd {SANDBOX}", f"cd {sandbox}")
    return line.replace("../../", f"{ROOT}/")


def project_state() -> tuple[str, str]:
    status = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    lock = ROOT / "dvc.lock"
    return status.stdout, hashlib.sha256(lock.read_bytes()).hexdigest() if lock.is_file() else ""


def branches(sandbox: Path) -> dict[str, str]:
    homes = [sandbox / "data/06_models/anneal", sandbox / "data/06_models/branches"]
    return {p.name: dir_hash(p) for h in homes for p in h.iterdir() if not p.name.startswith(".")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_line(line: str, cwd: Path, person: dict) -> subprocess.CompletedProcess:
    """One line of the tour in a session of its own. The tour is the suite's longest chain: where the
    kernel shares the CPU by session (autogroup), it gets a share of its own instead of a part of the
    pytest workers' one (617 s of pytest's 698 s under 4 workers, 490 s so; docs/tests.md). A session
    of its own no longer hears a Ctrl-C at the terminal, so a timeout or an interrupt of the test
    kills the line's whole session: no training outlives it."""
    with subprocess.Popen(
        ["bash", "-c", line],
        cwd=cwd,
        env=person,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_readme_tour_runs_as_written(tmp_path, request, monkeypatch):
    sandbox, before, outputs = tmp_path / "smoke", project_state(), {}
    cwd, person = ROOT, {**env(), "LEHR_MLFLOW": "1"}
    for line in tour():
        run = as_run_here(line, sandbox)
        started = time.monotonic()
        proc = run_line(run, cwd, person)
        print(f"{time.monotonic() - started:6.1f} s  {line}")  # where the tour's time goes (pytest -s)
        assert proc.returncode == 0, (
            f"{line}\nexited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
        outputs[line] = proc.stdout
        if line.startswith("source ") and f"cd {SANDBOX}" in line:
            cwd = sandbox
        if "lehr branches" in line and "hand_made" not in outputs:
            outputs["hand_made"] = branches(sandbox)
            outputs["pre_anneal"] = dir_hash(sandbox / "data/06_models/pre_anneal")
        if line.startswith("kedro run --pipelines evaluate"):
            outputs["metrics"] = json.loads((sandbox / "data/08_reporting/by_hand/metrics.json").read_text())
            outputs["evaluated"] = sorted(branches(sandbox))

    # make smoke left the project as it was, and its sandbox gives the dvc.lock of every fresh run
    # (the session's smoke run is another), every entry: no clock, path or machine in what DVC
    # hashes. (The baseline commit keeps make smoke's dvc.lock; each experiment puts it back.)
    assert project_state() == before
    # Asked for only now: the tour's worker trains from its first second, not after that build.
    smoke_repo = request.getfixturevalue("smoke_repo")
    assert (sandbox / "dvc.lock").read_text() == (smoke_repo.parent / "reference" / "dvc.lock").read_text()
    # Every branch made by hand (and its soup) outlived the experiments, byte for byte.
    made, now = outputs["hand_made"], branches(sandbox)
    assert {"gold-cosine", "gold-linear", "early"} <= set(made)
    assert all(now.get(name) == digest for name, digest in made.items()), set(made) - set(now)
    assert "soup-gold-cosine-gold-linear" in now
    # The branch from a point along the stable phase (step 20): it decays 20% of those steps, and
    # `lehr branches` shows who made it and where it started.
    points = json.loads((sandbox / "data/06_models/branch_points/index.json").read_text())
    assert points == {"tokens-10240": {"step": 20, "tokens": 10240}}
    assert State.read(sandbox / "data/06_models/branches/early/final").step == 24  # 20 + 0.2 x 20
    listing = next(v for k, v in outputs.items() if "lehr branches" in k).splitlines()
    assert any(line.split()[:3] == ["early", "hand", "tokens-10240"] for line in listing)
    # evaluate scored every model, the soup like any other, and each against early on the same
    # windows (paired intervals); `lehr compare` does the same for any two checkpoints.
    metrics = outputs["metrics"]
    assert sorted(metrics["branches"]) == outputs["evaluated"]
    soup = metrics["branches"]["soup-gold-cosine-gold-linear"]
    assert soup["heldout"]["bpb"] > 0 and set(soup["tasks"]) == set(metrics["pre_anneal"]["tasks"]) != set()
    assert metrics["branches"]["early"]["origin"] == "tokens-10240"
    assert metrics["branches"]["early"]["tokens"] == 24 * 512 and metrics["anneal"]["origin"] == "pre_anneal"
    vs, current = metrics["vs_baseline"], metrics["anneal"]["branch"]
    assert vs["baseline"] == "early" and {"pre_anneal", current, "gold-cosine"} <= set(vs)
    d = vs[current]["heldout"]["bpb"]
    assert d["lo"] <= d["diff"] <= d["hi"] and d["n"] == 16  # 8 windows of each of 2 sources
    compared = next(v for k, v in outputs.items() if k.startswith("python -m lehr compare"))
    assert "branches/gold-cosine/final - data/06_models/branches/early/final" in compared
    assert "heldout.bpb" in compared and "tasks.heldout_next_sentence.acc" in compared
    # Each experiment differs from the baseline commit only by its own -S.
    head = sh(sandbox, "git", "rev-parse", "HEAD").stdout.strip()
    base = flat_params(sandbox, head)
    got = {name: changed(base, flat_params(sandbox, sha)) for name, sha in experiments_of(sandbox, head)}
    assert got.pop("linear") == ["anneal.shape=linear"]
    assert got.pop("cosine-baseline") == ["pretrain.schedule=cosine"]
    assert sorted(got.values()) == [["anneal.decay_ratio=0.2"], ["anneal.decay_ratio=0.4"]], got
    # An anneal param re-runs only anneal and evaluate, in the workspace and in the queue's copies
    # (whose pre_anneal comes from DVC's cache); the cosine baseline its own stable phase too.
    linear = next(v for k, v in outputs.items() if "-n linear" in k)
    cosine = next(v for k, v in outputs.items() if "-n cosine-baseline" in k)
    assert stages_run(linear) == ["anneal", "evaluate"]
    assert stages_run(cosine) == ["pretrain_stable", "anneal", "evaluate"]
    assert stages_run(outputs["python -m lehr queue start -j 2"]) == ["anneal", "evaluate"] * 2
    # The workspace is the baseline again after each experiment, pre_anneal included.
    assert sh(sandbox, "git", "status", "--porcelain").stdout == ""
    assert dir_hash(sandbox / "data/06_models/pre_anneal") == outputs["pre_anneal"]
    # MLflow tells the experiments apart, each with the stage runs it made, all in the sandbox's one
    # store (the queued ones ran in temporary workspaces and wrote there too, not beside themselves).
    runs, _ = runs_of(sandbox)
    by_exp = runs.groupby("tags.dvc.exp_name")["tags.lehr.stage"].apply(sorted).to_dict()
    assert by_exp["linear"] == ["anneal", "evaluate"]
    assert by_exp["cosine-baseline"] == ["anneal", "evaluate", "pretrain_stable"]
    assert all(by_exp[queued] == by_exp["linear"] for queued in got)
    # The two queued at once each trained on a share of its own: half the cores (lehr queue start -j 2),
    # and other cores where they ran side by side.
    queued = runs[runs["tags.dvc.exp_name"].isin(list(got)) & (runs["tags.lehr.stage"] == "anneal")]
    a, b = queued.to_dict("records")
    cores = [set(cores_of(r["tags.lehr.cores"])) for r in (a, b)]
    assert [len(c) for c in cores] == [len(os.sched_getaffinity(0)) // 2] * 2, cores
    if a["start_time"] < b["end_time"] and b["start_time"] < a["end_time"]:
        assert not cores[0] & cores[1], cores
    assert not list((sandbox / ".dvc/tmp/exps").rglob("mlflow.db"))
    shown = next(v for k, v in outputs.items() if k.startswith("dvc exp show"))
    assert "anneal.heldout.bpb" in shown and re.search(r"^\|.*\blinear\b.*\| \d+\.\d+", shown, re.M), shown
    # Each queued experiment annealed the baseline's own stable phase, and DVC shows its figures.
    data = json.loads(sh(sandbox, "dvc", "exp", "show", "--json").stdout)
    exps = {e["name"]: e["revs"][0]["data"] for c in data for e in c.get("experiments") or [] if "name" in e}
    stable = json.loads((sandbox / "data/08_reporting/stable_metrics.json").read_text())
    for name in got:
        figures = exps[name]["metrics"]
        assert figures["data/08_reporting/stable_metrics.json"]["data"] == stable
        pre = figures["data/08_reporting/metrics.json"]["data"]["pre_anneal"]["heldout"]["bpb"]
        assert pre == pytest.approx(metrics["pre_anneal"]["heldout"]["bpb"], rel=1e-9)  # the same weights
        assert figures["data/08_reporting/metrics.json"]["data"]["anneal"]["heldout"]["bpb"] > 0
    table = next(v for k, v in outputs.items() if k.startswith("python -m lehr experiments"))
    assert re.search(r"^linear\s+anneal\.shape=linear\s+[\d.]+\s+[\d.]+\s+[+-]\d\.\d{4} \[", table, re.M), (
        table
    )

    # Bad input on the tour's sandbox: refused before anything changes.
    params = (sandbox / "conf/base/parameters_anneal.yml").read_bytes()
    reports = dir_hash(sandbox / "data/08_reporting")
    typo = sh(
        sandbox,
        "python",
        "-m",
        "lehr",
        "exp",
        "-n",
        "typo",
        "-S",
        "conf/base/parameters_anneal.yml:anneal.shape=cosin",
        check=False,
    )
    assert typo.returncode == 2 and "anneal.shape = 'cosin' must be one of" in typo.stderr, typo.stderr
    assert "-S conf/base/parameters_anneal.yml:anneal.shape=cosin" in typo.stderr
    assert (sandbox / "conf/base/parameters_anneal.yml").read_bytes() == params
    assert dir_hash(sandbox / "data/08_reporting") == reports
    assert "typo" not in dict(experiments_of(sandbox, head))
    # A branch name the DVC stage's branch holds is refused to `kedro run`, naming both.
    dvc_branch = json.loads((sandbox / "data/08_reporting/metrics.json").read_text())["anneal"]["branch"]
    taken = sh(
        sandbox,
        "kedro",
        "run",
        "--pipelines",
        "anneal",
        "--params",
        f"anneal.branch={dvc_branch}",
        check=False,
    )
    assert taken.returncode == 2 and f"anneal branch {dvc_branch!r} is the DVC anneal stage's" in taken.stderr
    assert f"data/06_models/anneal/{dvc_branch}" in taken.stderr and "anneal.branch=NAME" in taken.stderr
    nowhere = sh(
        sandbox, "kedro", "run", "--pipelines", "anneal", "--params", "anneal.origin=tokens-999", check=False
    )
    assert nowhere.returncode == 2
    assert "names no branch point of the stable run; its branch points are: tokens-10240" in nowhere.stderr
    assert dir_hash(sandbox / "data/08_reporting") == reports
    # A second `make smoke` keeps a sandbox with the person's commits and experiments.
    again = subprocess.run(
        ["make", "smoke", f"SMOKE={sandbox}"], cwd=ROOT, env=env(), capture_output=True, text=True
    )
    assert again.returncode != 0 and "FORCE=1" in again.stderr and (sandbox / "dvc.lock").exists()
    assert sh(sandbox, "git", "rev-list", "--count", "HEAD").stdout.strip() == "2"

    # The notebook the tour ends on, run headless on what the tour made.
    import nbformat
    from nbclient import NotebookClient

    for key, value in env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("LEHR_PROJECT", str(sandbox))
    nb = nbformat.read(ROOT / "notebooks/compare_experiments.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # stripped in git
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(sandbox)}}
    ).execute()
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "cosine-baseline" in text  # the printed gain per experiment


def test_the_tours_mlflow_ui_serves_and_stops_whole_on_sigterm(smoke_repo, tmp_path):
    port = free_port()
    cmd = commented("lehr mlflow-ui") + f" --port {port}"
    repo = tmp_path / "repo"  # a copy: the server writes beside its store, and other tests copy smoke_repo
    shutil.copytree(smoke_repo, repo, symlinks=True)
    server = subprocess.Popen(
        ["bash", "-c", f"exec {cmd}"],
        cwd=repo,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).status == 200
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, server.stderr.read()[-3000:]
                time.sleep(1)
        group = os.getpgid(server.pid)
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 128 + signal.SIGTERM
        time.sleep(1)
        left = subprocess.run(["pgrep", "-f", "--", f"--port {port}"], capture_output=True, text=True).stdout
        assert left == "", f"left behind: {left} (group {group})"
    finally:
        if server.poll() is None:
            server.kill()
