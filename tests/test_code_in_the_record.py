"""The code in the record, tried in sandboxes as an operator would: a comment-only change to the
engine retrains nothing and rewrites nothing; a change to its math is refused, naming the file,
until the operator says to go on, and then the record names both; a soup named out of its
folder, a stray parameters file and an unknown profile are each refused in one line with
everything left as it was. (Two fresh runs of one commit making one dvc.lock: test_readme_tour.py.)"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import yaml

from tests import ROOT
from tests.e2e import ARTIFACTS, dir_hash, lock_hash, sh, stages_run

pytestmark = pytest.mark.slow


@pytest.fixture
def repo(smoke_repo, tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(smoke_repo, copy, symlinks=True)
    return copy


def _outputs(repo) -> dict[str, str]:
    return {
        a: dir_hash(repo / a) if (repo / a).is_dir() else (repo / a).read_bytes().hex() for a in ARTIFACTS
    }


def _engine(repo, name: str):
    return repo / "src/lehr/engine" / name


def test_a_comment_change_retrains_nothing_and_a_math_change_is_refused_until_allowed(repo, tmp_path):
    before, lock = _outputs(repo), shutil.copy2(repo / "dvc.lock", tmp_path / "before.lock")
    model = _engine(repo, "model.py")
    source = model.read_text()
    model.write_text(
        source.replace('"""', '"""Reworded: ', 1).replace("\nclass ", "\n# a comment\nclass ", 1)
    )
    out = sh(repo, "dvc", "repro")
    assert {"pretrain_stable", "anneal"} <= set(stages_run(out.stdout))  # DVC saw the change...
    assert out.stderr.count("nothing trained, nothing rewritten") == 2  # ...lehr: the same code
    assert _outputs(repo) == before
    for artifact in ARTIFACTS:
        assert lock_hash(repo / "dvc.lock", artifact) == lock_hash(lock, artifact), artifact

    # The initialisation changes: the finished run's weights are not this code's.
    model.write_text(source.replace("std=cfg.init_std / math.sqrt", "std=cfg.init_std * 1.5 / math.sqrt"))
    out = sh(repo, "dvc", "repro", "pretrain_stable", check=False)
    assert out.returncode != 0
    assert "trained by other engine code (src/lehr/engine/model.py differs" in out.stderr
    assert "resume_under_new_code" in out.stderr and "Traceback" not in out.stderr
    assert _outputs(repo) == before

    # Told to go on under the new code: the record keeps both, and says which trained what.
    params = repo / "conf/smoke/parameters_pretrain_stable.yml"
    smoke = yaml.safe_load(params.read_text())
    smoke["pretrain"]["resume_under_new_code"] = True
    params.write_text(yaml.safe_dump(smoke))
    sh(repo, "dvc", "repro", "pretrain_stable")
    info = sh(repo, "python", "-m", "lehr", "info", "data/06_models/pre_anneal").stdout
    trained = [line for line in info.splitlines() if line.startswith("trained steps")]
    assert len(trained) == 2 and trained[0].split("by")[1] != trained[1].split("by")[1], info


def test_operator_mistakes_are_refused_in_one_line_and_change_nothing(repo):
    victim = repo / "data" / "victim"
    victim.mkdir()
    (victim / "notes.txt").write_text("mine\n")
    before = _outputs(repo)
    (branch,) = [p.name for p in (repo / "data/06_models/anneal").iterdir() if not p.name.startswith(".")]
    for params, said in (
        (f"soup.branches={branch}+{branch},soup.name=../../victim", "parameter soup.name = '../../victim'"),
        (f"soup.branches={branch}+{branch},soup.name={branch}", f"soup.name = '{branch}' is a trained"),
    ):
        out = sh(repo, "kedro", "run", "--pipelines", "soup", "--params", params, check=False)
        assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr, out.stderr[
            -3000:
        ]
    out = sh(repo, "kedro", "run", "--pipelines", "anneal", "--env", "nope", check=False)
    assert out.returncode == 2 and "no profile 'nope'" in out.stderr and "Traceback" not in out.stderr
    (repo / "conf/smoke/parameters_mine.yml").write_text("anneal: {shape: linear}\n")
    out = sh(repo, "kedro", "run", "--pipelines", "anneal", check=False)
    assert (
        out.returncode == 2 and "lehr: error: refusing to run: conf/smoke/parameters_mine.yml" in out.stderr
    )
    assert "Traceback" not in out.stderr
    assert (victim / "notes.txt").read_text() == "mine\n" and _outputs(repo) == before


def test_dvc_and_kedro_read_the_same_parameters_under_every_profile(repo):
    """conf/local is the local profile's, as Kedro has it: under smoke or gpu neither DVC nor a
    run reads it, and `lehr check` says an override there does not apply."""
    from dvc.repo import Repo
    from kedro.config import OmegaConfigLoader

    (repo / "conf/local/parameters_anneal.yml").write_text("anneal: {shape: cosine, bogus_key: 1}\n")
    (repo / "ladder").mkdir()  # the ladder's stages too (a sandbox has them with --ladder): their params
    shutil.copy2(ROOT / "ladder/dvc.yaml", repo / "ladder/dvc.yaml")
    for profile in ("smoke", "gpu", "local"):
        (repo / "conf/profile.yaml").write_text(f"profile: {profile}\n")
        with Repo(str(repo)) as dvc:
            tracked = {p.def_path for stage in dvc.index.stages for p in stage.params}
        loader = OmegaConfigLoader(str(repo / "conf"), base_env="base", default_run_env=profile)
        read = {
            f"conf/{env}/{f.name}"
            for env in ("base", profile)
            for f in (repo / "conf" / env).glob("parameters_*.yml")
            if f.name != "parameters_soup.yml"  # soup is not a DVC stage
        }
        assert tracked == read, profile
        applied = loader["parameters"]["anneal"].get("shape") == "cosine"
        assert applied == (profile == "local"), profile
        check = sh(repo, "python", "-m", "lehr", "check", check=False)
        if profile == "local":
            assert check.returncode == 2 and "anneal.bogus_key" in check.stderr
        else:
            assert check.returncode == 0, check.stderr
            assert "conf/local/parameters_anneal.yml sets anneal, which a run under the" in check.stdout


def test_an_edit_in_the_workspace_is_what_runs_and_what_the_record_names(repo, tmp_path):
    """The virtualenv's lehr is the project checkout's; this workspace (a copy) has its own src.
    `python -m lehr`, the `lehr` script and DVC's corpus stage all run the workspace's code."""
    edited = repo / "src/lehr/dataprep/bundled_corpus.py"
    edited.write_text(
        edited.read_text() + '\nprint("the edit in this workspace ran", file=__import__("sys").stderr)\n'
    )
    for cmd in (["python", "-m", "lehr"], ["lehr"]):
        out = sh(repo, *cmd, "corpus", "--out", str(tmp_path / "corpus"))
        assert "the edit in this workspace ran" in out.stderr, out.stderr[-2000:]
    assert json.loads(sh(repo, "dvc", "status", "corpus", "--json").stdout)  # DVC sees the edit...
    out = sh(repo, "dvc", "repro", "corpus")
    assert "the edit in this workspace ran" in out.stdout + out.stderr  # ...and runs it
    deps = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["corpus"]["deps"]
    recorded = next(d["md5"] for d in deps if d["path"] == "src/lehr/dataprep/bundled_corpus.py")
    assert recorded == hashlib.md5(edited.read_bytes()).hexdigest()
