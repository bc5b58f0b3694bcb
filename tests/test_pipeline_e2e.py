"""End to end on the smoke profile in a throwaway git repo: a real `dvc repro` of all five stages
with MLflow tracking, Kedro anneal branches beside DVC's (two at once), the provenance CLI, a stage
across two "nodes", your own task file, a profile override. Branch points, soups, evaluate's
paired comparison, experiments told apart in MLflow and the comparison notebook are in the
README's tour (tests/test_readme_tour.py); an interrupted stable phase resuming to the same weights
and MLflow curve in tests/reliability/test_chaos.py."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lehr.engine.artifacts.state import State
from tests.e2e import dir_hash, env, runs_of, sh, stages_run

pytestmark = pytest.mark.slow
ALL = ["tokenize", "shard", "pretrain_stable", "anneal", "evaluate"]
MLFLOW = {"LEHR_MLFLOW": "1"}
KEDRO_ANNEAL = ["kedro", "run", "--pipelines", "anneal", "--params"]


@pytest.fixture
def repo(smoke_repo, tmp_path):
    """A copy of the session's smoke repo as its one `dvc repro` left it (git, DVC cache, outputs,
    MLflow store): each test may change its copy, so the tests pass alone and in any order."""
    copy = tmp_path / "repo"
    shutil.copytree(smoke_repo, copy, symlinks=True)
    return copy


def test_repro_builds_every_artifact_and_a_second_repro_is_a_no_op(repo):
    for artifact in (
        "data/02_intermediate/tokenizer.json",
        "data/04_feature/shards/manifest.json",
        "data/06_models/pre_anneal/model.safetensors",
        "data/08_reporting/metrics.json",
        "data/08_reporting/loss_curve.png",
        "data/08_reporting/curves.csv",
    ):
        assert (repo / artifact).is_file(), artifact
    metrics = json.loads((repo / "data/08_reporting/metrics.json").read_text())
    for key in ("pre_anneal", "anneal", "anneal_gain", "unigram"):
        assert "bpb" in metrics[key]["heldout"]
    assert set(metrics["pre_anneal"]) >= {"wikipedia", "sotu", "heldout"}
    for model in ("pre_anneal", "anneal"):  # the built-in held-out tasks, with stderr and chance
        tasks = metrics[model]["tasks"]
        assert set(tasks) == {"heldout_last_word", "heldout_next_sentence"}
        assert (
            tasks["heldout_next_sentence"]["chance"] == 0.25
            and tasks["heldout_next_sentence"]["examples"] > 0
        )
        assert 0 <= tasks["heldout_last_word"]["acc"] <= 1 and "acc_stderr" in tasks["heldout_last_word"]
    assert (repo / "data/08_reporting/task_accuracy.png").is_file()
    stable = json.loads((repo / "data/08_reporting/stable_metrics.json").read_text())
    assert set(stable["tiers"]) == {"gold", "silver"} and all(
        t["epochs"] > 0 for t in stable["tiers"].values()
    )
    # The clock's figures go where neither DVC nor git looks.
    assert "wall_seconds" not in stable and "tok_per_s" not in stable
    timing = json.loads((repo / "data/08_reporting/timing/stable.json").read_text())
    assert timing["wall_seconds"] > 0 and timing["tok_per_s"] > 0
    assert "timing" not in sh(repo, "git", "status", "--porcelain", "--ignored=no").stdout
    again = sh(repo, "dvc", "repro")
    assert stages_run(again.stdout) == [] and "is cached" not in again.stdout


def test_every_stage_run_is_tracked_with_provenance(repo):
    runs, client = runs_of(repo)
    head = sh(repo, "git", "rev-parse", "HEAD").stdout.strip()
    assert sorted(runs["tags.lehr.stage"]) == sorted(s.replace("-", "_") for s in ALL)
    assert (runs["status"] == "FINISHED").all()
    assert runs["tags.lehr.group"].nunique() == 1  # one dvc repro, one group
    assert (runs["tags.git_commit"] == head).all()
    assert runs["tags.data.manifest_sha256"].str.len().max() == 64
    stable = runs[runs["tags.lehr.stage"] == "pretrain_stable"].iloc[0]
    assert len(client.get_metric_history(stable.run_id, "train.loss")) >= 5
    assert len(client.get_metric_history(stable.run_id, "eval.heldout.bpb")) >= 2
    assert stable["params.pretrain.model.preset"] == "tiny"
    assert "sha256:" in stable["tags.artifact.pre_anneal"]
    artifacts = {a.path for a in client.list_artifacts(stable.run_id, "reports")}
    assert {"reports/stable_metrics.json", "reports/stable.json"} <= artifacts  # stable.json: the timing
    assert stable["tags.version.tokenizers"] == importlib.metadata.version("tokenizers")


def test_info_cli_names_the_code_config_and_data_and_no_output_holds_the_commit(repo):
    out = sh(repo, "python", "-m", "lehr", "info", "data/06_models/pre_anneal").stdout
    fields = {line.split("  ")[0]: line.split()[-1] for line in out.splitlines()}
    state = State.read(repo / "data/06_models/pre_anneal")
    assert fields["engine code sha256"] == state.code["sha256"]
    manifest = (repo / "data/04_feature/shards/manifest.json").read_bytes()
    assert fields["data manifest sha256"] == hashlib.sha256(manifest).hexdigest()
    assert "held-out heldout.bpb" in out and "tokens seen" in out
    # What DVC hashes never names the commit it was made at (MLflow's tags do): a fresh clone of a
    # later commit makes the same dvc.lock.
    head = sh(repo, "git", "rev-parse", "HEAD").stdout.strip()
    stages = yaml.safe_load((repo / "dvc.lock").read_text())["stages"].values()
    for path in sorted({entry["path"] for stage in stages for entry in stage.get("outs", [])}):
        root = repo / path
        for f in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()):
            data = f.read_bytes()
            assert head.encode() not in data and b"git_commit" not in data, f


def test_kedro_anneal_branches_live_beside_others_and_leave_pre_anneal_alone(repo):
    """Two branches trained at once, each its own MLflow run in the project's one store (which the
    two create together, its first use serialised by a lock), under any allowed name: one with a
    dot (v1.2) goes through anneal, evaluate and the CLI."""
    pre = dir_hash(repo / "data/06_models/pre_anneal")
    before = all_branches(repo)
    (repo / "mlflow.db").unlink()
    together = [
        subprocess.Popen(
            [*KEDRO_ANNEAL, f"anneal.branch={name},anneal.shape=cosine"],
            cwd=repo,
            env={**env(), **MLFLOW},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("v1.2", "side")
    ]
    errors = [proc.communicate(timeout=300)[1] for proc in together]
    assert [proc.returncode for proc in together] == [0, 0], "\n----\n".join(e[-3000:] for e in errors)
    after = all_branches(repo)
    assert dir_hash(repo / "data/06_models/pre_anneal") == pre
    assert {"v1.2", "side"} <= set(after) and all(after[name] == h for name, h in before.items())
    runs, _ = runs_of(repo)
    trained = runs[runs["tags.lehr.stage"] == "anneal"]
    assert list(trained["status"]) == ["FINISHED"] * 2
    assert set(trained["params.anneal.branch"]) == {"v1.2", "side"}
    # A branch trained by hand lives in its own home, with its record; DVC's home is as it was.
    record = json.loads((repo / "data/06_models/branches/v1.2/branch.json").read_text())
    assert record["made_by"] == "hand" and record["params"]["anneal"]["shape"] == "cosine"
    listing = sh(repo, "python", "-m", "lehr", "branches").stdout
    assert "v1.2" in listing
    sh(repo, "kedro", "run", "--pipelines", "evaluate", "--params", "evaluate.branches=v1.2")
    metrics = json.loads((repo / "data/08_reporting/by_hand/metrics.json").read_text())
    assert (
        metrics["branches"]["v1.2"]["heldout"]["bpb"] > 0
        and metrics["branches"]["v1.2"]["weights"] == "final"
    )


def all_branches(repo: Path) -> dict[str, str]:
    """Every branch of both homes (DVC's anneal stage's, and by hand), by name: its folder's hash."""
    homes = [repo / "data/06_models/anneal", repo / "data/06_models/branches"]
    return {p.name: dir_hash(p) for home in homes for p in home.iterdir() if not p.name.startswith(".")}


def test_unknown_branch_asked_of_evaluate_is_refused(repo):
    out = sh(
        repo,
        "kedro",
        "run",
        "--pipelines",
        "evaluate",
        "--env",
        "smoke",
        "--params",
        "evaluate.branches=[nope]",
        check=False,
        extra_env=MLFLOW,
    )
    assert out.returncode != 0
    assert "unknown anneal branch(es) nope" in out.stderr
    runs, _ = runs_of(repo)
    last = runs.sort_values("start_time").iloc[-1]
    assert last["status"] == "FAILED" and "unknown anneal branch" in last["tags.lehr.error"]


def test_pretrain_stage_across_two_nodes_kedro_on_node_0_and_join_on_node_1(repo):
    """Two "machines" on 127.0.0.1, one gloo worker each, through torchrun's static rendezvous:
    node 0 runs the Kedro stage and saves its outputs, node 1 joins with `lehr join` and exits 0;
    a Kedro run on node 1 is refused before any work, naming the command for it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    params = (  # a shorter stable phase: 36 steps at most (smoke's branch point, step 20, the earliest)
        f"pretrain.run_name=two-nodes,pretrain.micro_batch=2,pretrain.planned_steps=40,"
        f"pretrain.launch.nnodes=2,pretrain.launch.rdzv_endpoint=127.0.0.1:{port},pretrain.launch.node_rank="
    )
    refused = sh(
        repo, "kedro", "run", "--pipelines", "pretrain_stable", "--params", params + "1", check=False
    )
    assert refused.returncode != 0 and "python -m lehr join pretrain_stable" not in refused.stderr
    assert "python -m lehr join <stage>" in refused.stderr
    logs = [repo.parent / f"node{i}.log" for i in (0, 1)]
    nodes = [
        # Two nodes on one machine are two runs on its cores: declared, each claims half of them.
        subprocess.Popen(
            cmd, cwd=repo, env={**env(), "LEHR_JOBS": "2"}, stdout=log.open("w"), stderr=subprocess.STDOUT
        )
        for log, cmd in zip(
            logs,
            (
                ["kedro", "run", "--pipelines", "pretrain_stable", "--params", params + "0"],
                [sys.executable, "-m", "lehr", "join", "pretrain_stable", "--params", params + "1"],
            ),
            strict=True,
        )
    ]
    deadline = time.monotonic() + 300
    try:  # a node that fails leaves the other waiting at the rendezvous: stop at the first failure
        while any(n.poll() is None for n in nodes) and not any(n.poll() for n in nodes):
            assert time.monotonic() < deadline, "the two nodes did not finish in 300 s"
            time.sleep(0.5)
    finally:
        for n in nodes:
            n.kill()
            n.wait()
    outputs = [log.read_text() for log in logs]
    assert [n.returncode for n in nodes] == [0, 0], "\n----\n".join(o[-3000:] for o in outputs)
    assert "2 process(es)" in outputs[0] and "node 1 trained its share" in outputs[1]
    run = repo / "data/06_models/stable_run/two-nodes/pre_anneal"
    state = json.loads((run / "state.json").read_text())
    assert state["world_size"] == 2 and (run / "rng_rank1.pt").is_file()
    pre_anneal = json.loads((repo / "data/06_models/pre_anneal/state.json").read_text())
    assert pre_anneal["files"] == state["files"]  # node 0 saved the stage's output


def test_an_override_in_the_profile_is_a_change_dvc_sees_and_a_stray_one_is_refused(repo):
    assert json.loads(sh(repo, "dvc", "status", "dvc.yaml", "--json").stdout) == {}
    override = repo / "conf/smoke/parameters_anneal.yml"  # the sandbox's profile is smoke
    shipped = override.read_text()
    override.write_text(shipped.replace("anneal:\n", "anneal:\n  shape: cosine\n", 1))
    changed = json.loads(sh(repo, "dvc", "status", "dvc.yaml", "--json").stdout)
    assert set(changed) == {"anneal", "evaluate"}, changed  # the stages that read anneal's params, no others
    override.write_text(shipped)
    (repo / "conf/smoke/parameters_mine.yml").write_text("anneal: {shape: linear}\n")
    out = sh(repo, "kedro", "run", "--pipelines", "anneal", check=False)
    assert out.returncode != 0
    assert "conf/smoke/parameters_mine.yml sets anneal, which no stage in dvc.yaml tracks" in out.stderr
    assert "parameters_mine.yml" in sh(repo, "python", "-m", "lehr", "check", check=False).stderr


def test_a_task_file_of_your_own_reruns_evaluate_and_is_scored_on_every_model(repo):
    from tests import ROOT

    shutil.copy2(
        ROOT / "tests/fixtures/tasks/everyday_choice.jsonl", repo / "data/01_raw/tasks/everyday.jsonl"
    )
    assert set(json.loads(sh(repo, "dvc", "status", "dvc.yaml", "--json").stdout)) == {"evaluate"}
    out = sh(repo, "dvc", "repro")
    assert stages_run(out.stdout) == ["evaluate"]
    metrics = json.loads((repo / "data/08_reporting/metrics.json").read_text())
    for model in ("pre_anneal", "anneal"):
        assert metrics[model]["tasks"]["everyday"]["examples"] == 6
    bad = sh(repo, "kedro", "run", "--pipelines", "evaluate", "--params", "evaluate.tasks=nope", check=False)
    assert (
        bad.returncode != 0
        and "unknown task(s) nope in evaluate.tasks; the tasks are: everyday" in bad.stderr
    )
