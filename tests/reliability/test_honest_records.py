"""Every record tells the truth, tried as an operator tries it: names that would leave their
folder, a corpus file changed under its old size and time, slices of two corpora, symlinks, a
checkpoint whose weights were swapped, a finished run run again, errors that must name the file.
Each checks the message and that what was there before is byte for byte as it was. The real code
changes in a sandbox, and two clones of one commit, are in ``test_code_in_the_record.py``."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from lehr.__main__ import main
from lehr.catalog import CheckpointDataset, TokenStreamsDataset
from lehr.catalog.branches_dataset import AnnealBranchesDataset
from lehr.config_parts import from_mapping
from lehr.dataprep.corpus import Corpus, CorpusError
from lehr.dataprep.params import TokenizeParams
from lehr.dataprep.token_index import TokenStoreError
from lehr.dataprep.token_reader import load
from lehr.engine.artifacts import code_identity
from lehr.engine.artifacts.checkpoint import CheckpointError
from lehr.engine.config import Launch
from lehr.engine.evals.tasks import TaskError, read_task
from lehr.engine.processes.launch import run
from lehr.engine.run.loop import train
from lehr.engine.run.metrics import CLOCK_KEYS, timing
from lehr.files import locks
from lehr.params.mix_checks import corpus_problems
from lehr.params.stages import AnnealParams, PretrainParams, SoupParams
from lehr.pipelines.soup.nodes import make_soup
from lehr.pipelines.tokenize.nodes import encode_corpus, train_tokenizer
from tests import ROOT
from tests.conftest import SMOKE_TOKENIZE
from tests.e2e import dir_hash

BAD_NAMES = ["../../victim", "../../../../escaped", "a/b", ".hid", "..", "a..b", "x" * 300, "", " sp"]


def _section(path: str, section: str) -> dict:
    import yaml

    return yaml.safe_load((ROOT / path).read_text())[section]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_one_rule_for_every_name_that_becomes_a_folder(name):
    anneal = _section("conf/base/parameters_anneal.yml", "anneal")
    pretrain = _section("conf/base/parameters_pretrain_stable.yml", "pretrain")
    cases = [(AnnealParams, anneal, "branch"), (SoupParams, {"branches": "a+b", "name": ""}, "name")]
    cases.append((PretrainParams, pretrain, "run_name"))
    for cls, base, key in cases:
        if name == "":  # "" means: lehr names it
            from_mapping(cls, {**base, key: name}, cls.SECTION)
            continue
        with pytest.raises(
            ValueError, match=f"parameter {cls.SECTION}.{key} = .* must be a plain folder name"
        ):
            from_mapping(cls, {**base, key: name}, cls.SECTION)
    for good in ("gold-cosine", "v1.2", "A_b-3"):
        from_mapping(AnnealParams, {**anneal, "branch": good}, "anneal")


def _trained(tiny_config, out: Path, **overrides) -> Path:
    """A tiny finished run's ``final`` checkpoint (two eval points, a few seconds)."""
    cfg = tiny_config(out_dir=str(out), planned_steps=12, eval_every=6, ckpt_every=6, **overrides)
    return Path(train(cfg)["final"])


def _branch(tiny_config, root: Path, name: str, origin: str) -> None:
    """A branch folder as the anneal stage saves it, grown from a pre_anneal of sha256 ``origin``."""
    provenance = {"inputs": {"data/06_models/pre_anneal/state.json": origin}}
    final = _trained(tiny_config, root.parent / f"run-{name}", provenance=provenance)
    AnnealBranchesDataset(str(root)).save({"branch": name, "run_dir": str(final.parent), "curve": "{}\n"})


def test_soups_refuse_mixed_origins_a_trained_name_and_a_folder_lehr_did_not_make(tiny_config, tmp_path):
    root = tmp_path / "anneal"
    for name, origin in (("a", "1" * 64), ("b", "1" * 64), ("c", "2" * 64)):
        _branch(tiny_config, root, name, origin)
    before = dir_hash(root)
    branches = AnnealBranchesDataset(str(root)).load()
    with pytest.raises(
        ValueError,
        match=r"different pre_anneal checkpoints .*: a from pre_anneal 1{12}; c from pre_anneal 2{12}",
    ):
        make_soup(branches, SoupParams(branches=["a", "c"], name=""))
    with pytest.raises(ValueError, match=r"soup.name = 'b' is a trained anneal branch"):
        make_soup(branches, SoupParams(branches=["a", "b"], name="b"))
    assert dir_hash(root) == before
    # The dataset holds the same line whoever calls it: a user's folder is never written into.
    victim = root / "mine"
    victim.mkdir()
    (victim / "notes.txt").write_text("my notes\n")

    def soup() -> dict:
        return make_soup(branches, SoupParams(branches=["a", "b"], name=""))

    with pytest.raises(Exception, match=r"mine exists and lehr did not make it .* never writes into"):
        AnnealBranchesDataset(str(root)).save({**soup(), "branch": "mine"})
    with pytest.raises(Exception, match=r"a is a trained anneal branch: a soup may not take its name"):
        AnnealBranchesDataset(str(root)).save({**soup(), "branch": "a"})
    assert (victim / "notes.txt").read_text() == "my notes\n" and sorted(
        p.name for p in victim.iterdir()
    ) == ["notes.txt"]
    for _ in range(2):  # its own name: made, and made again in place
        made = soup()
        AnnealBranchesDataset(str(root)).save(made)
        assert not Path(made["run_dir"]).exists()  # the averaged weights' scratch folder went
    assert "soup-a-b" in AnnealBranchesDataset(str(root)).load()
    assert (root / "soup-a-b" / "final" / "model.safetensors").is_file()


def test_branches_left_out_are_each_named(tiny_config, tmp_path, caplog):
    root = tmp_path / "anneal"
    _branch(tiny_config, root, "kept", "1" * 64)
    _branch(tiny_config, root, "gone", "1" * 64)
    shutil.rmtree(root / "gone" / "final")  # deleted by hand
    (root / ".hid").mkdir()
    with caplog.at_level(logging.WARNING):
        assert list(AnnealBranchesDataset(str(root)).load()) == ["kept"]
    assert "gone: no final/state.json" in caplog.text and ".hid: not a branch name" in caplog.text


def test_the_code_identity_ignores_comments_and_docstrings_and_code_a_run_never_runs(tmp_path):
    identity = code_identity.of_training()
    assert "lehr.engine.model" in identity.modules and "lehr.engine.run.loop" in identity.modules
    assert "lehr.engine.artifacts.export" not in identity.modules and "lehr.__main__" not in identity.modules
    source = (ROOT / "src/lehr/engine/model.py").read_text()
    variants = {
        "comment": source.replace("\nclass ", "\n# a comment, moving every line below\nclass ", 1),
        "docstring": source.replace('"""', '"""Reworded. ', 1),
        "format": source.replace("std=cfg.init_std / math.sqrt", "std=(cfg.init_std) / math.sqrt"),
        "math": source.replace("std=cfg.init_std / math.sqrt", "std=cfg.init_std * 1.5 / math.sqrt"),
    }
    assert all(v != source for v in variants.values())
    hashes = {}
    for kind, text in variants.items():
        (tmp_path / f"{kind}.py").write_text(text)
        hashes[kind] = code_identity._tree_sha256(tmp_path / f"{kind}.py")
    ours = identity.modules["lehr.engine.model"]
    assert hashes["comment"] == hashes["docstring"] == hashes["format"] == ours != hashes["math"]


def test_a_finished_run_run_again_trains_and_writes_nothing(tiny_config, tmp_path):
    cfg = tiny_config(out_dir=str(tmp_path / "run"), planned_steps=20)
    first = train(cfg)
    files = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (tmp_path / "run").rglob("*") if p.is_file()}
    again = train(cfg)
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in (tmp_path / "run").rglob("*") if p.is_file()}
    assert after == files
    same = {k for k in first if first[k] == again[k]}
    assert set(first) - same == {"mode", "resumed_from"} and again["mode"] == "resume"
    assert again["wall_seconds"] > 0 and again["tok_per_s"] > 0


def test_a_resumed_run_reports_the_whole_runs_wall_time_and_tok_per_s(tiny_config, tmp_path):
    run = dict(out_dir=str(tmp_path / "run"), anneal_start=20, anneal_steps=20)
    part = train(tiny_config(end_step=20, **run))
    whole = train(tiny_config(**run))
    records = [json.loads(line) for line in (tmp_path / "run" / "timing.jsonl").read_text().splitlines()]
    assert whole["wall_seconds"] == round(sum(r["seconds"] for r in records), 1) > part["wall_seconds"]
    assert (whole["wall_seconds"], whole["tok_per_s"]) == timing(tmp_path / "run")
    # What the run computed holds no clock reading: DVC versions it, and a rerun must match it.
    computed = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert computed and not any(k in json.loads(line) for line in computed.splitlines() for k in CLOCK_KEYS)


def test_a_resume_saves_the_optimizer_state_in_the_same_bytes(tiny_config, tmp_path):
    """The optimizer's hyperparameters came back from a checkpoint as lists, not tuples: the same
    tensors in other bytes, so DVC saw another pre_anneal after every resume."""
    run = dict(anneal_start=20, anneal_steps=20)
    train(tiny_config(out_dir=str(tmp_path / "a"), **run))
    train(tiny_config(out_dir=str(tmp_path / "b"), end_step=17, **run))
    train(tiny_config(out_dir=str(tmp_path / "b"), **run))
    for name in ("model.safetensors", "optimizer.pt", "rng_rank0.pt"):
        assert (tmp_path / "a/final" / name).read_bytes() == (tmp_path / "b/final" / name).read_bytes(), name


def _corpus(corpus_dir: Path, dest: Path) -> Path:
    root = dest / "corpus"
    shutil.copytree(corpus_dir / "heldout", root / "heldout")
    (root / "silver").mkdir(parents=True)
    for f in sorted((corpus_dir / "silver" / "sotu").iterdir())[:6]:
        shutil.copy2(f, root / "silver" / f.name)
    return root


def _encode(root: Path, out: Path, tok, **overrides):
    params = TokenizeParams(**{**SMOKE_TOKENIZE, "max_bytes_per_stream": 0, **overrides})
    ds = TokenStreamsDataset(str(out / "tokens"))
    ds.save(encode_corpus(Corpus(root), tok, params, out / "tokens" / "parts"))
    return ds


def test_a_file_changed_under_its_old_size_and_time_is_encoded_again(corpus_dir, tmp_path, caplog):
    root = _corpus(corpus_dir, tmp_path)
    tok = train_tokenizer(Corpus(root), TokenizeParams(**SMOKE_TOKENIZE))
    ds = _encode(root, tmp_path, tok)
    victim = sorted((root / "silver").iterdir())[0]
    text = victim.read_text()
    st = victim.stat()
    new = text.replace("the", "THE")
    assert new != text and len(new.encode()) == len(text.encode())
    victim.write_text(new)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # as cp -p / rsync -a / tar x leave it
    assert (victim.stat().st_size, victim.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    with caplog.at_level(logging.INFO):
        ds = _encode(root, tmp_path, tok)
    n = len(Corpus(root).files())
    assert f"{n - 1} of {n} task(s) reused" in caplog.text
    streams = ds.load()
    decoded = Tokenizer.from_str(tok.to_str()).decode(
        [int(i) for chunk in streams.chunks("train/silver") for i in chunk], skip_special_tokens=False
    )
    assert "THE" in decoded and new.split("THE")[0][-200:] in decoded


def test_slices_cut_from_different_corpora_are_not_merged(corpus_dir, tmp_path):
    root = _corpus(corpus_dir, tmp_path)
    tok = train_tokenizer(Corpus(root), TokenizeParams(**SMOKE_TOKENIZE))
    _encode(root, tmp_path, tok, slice="1/2")
    extra = sorted((corpus_dir / "silver" / "sotu").iterdir())[10]
    shutil.copy2(extra, root / "silver" / extra.name)  # the corpus grows between the two slices
    _encode(root, tmp_path, tok, slice="2/2")
    before = dir_hash(tmp_path / "tokens")
    with pytest.raises(TokenStoreError) as e:
        load(tmp_path / "tokens")
    message = str(e.value)
    assert "slices 1/2 and 2/2" in message and "different plans" in message
    assert f"only the second has silver/{extra.name}" in message and "against" in message
    assert dir_hash(tmp_path / "tokens") == before


def test_symlinked_folders_are_followed_and_loops_named(tmp_path, caplog):
    outside = tmp_path / "elsewhere" / "speeches"
    outside.mkdir(parents=True)
    (outside / "one.txt").write_text("a speech\n")
    root = tmp_path / "corpus"
    (root / "gold").mkdir(parents=True)
    (root / "gold" / "own.txt").write_text("own text\n")
    (root / "silver").symlink_to(outside.parent, target_is_directory=True)
    (outside / "loop").symlink_to(outside.parent, target_is_directory=True)
    (root / "gold" / "dangling.txt").symlink_to(tmp_path / "nowhere.txt")
    with caplog.at_level(logging.WARNING):
        files = [p.relative_to(root).as_posix() for p in Corpus(root).files()]
    assert files == ["gold/own.txt", "silver/speeches/one.txt"]
    assert "silver/speeches/loop: a symlink loop" in caplog.text
    assert "dangling.txt: a symlink to" in caplog.text and "does not exist" in caplog.text


def test_a_fifo_or_a_link_to_a_device_in_the_corpus_is_named_not_skipped(tmp_path):
    """Either would never end to read, and DVC hangs hashing it: tokenize refuses and lehr check
    (corpus_problems) names each, with the fix."""
    root = tmp_path / "corpus"
    (root / "gold").mkdir(parents=True)
    (root / "gold" / "own.txt").write_text("own text\n")
    os.mkfifo(root / "gold" / "pipe.txt")
    (root / "gold" / "zeros.jsonl").symlink_to("/dev/zero")
    problems = corpus_problems(root)
    assert len(problems) == 2
    assert "gold/pipe.txt is a FIFO (named pipe), not a regular file" in problems[0]
    assert "zeros.jsonl (a symlink to /dev/zero) is a character device" in problems[1]
    assert all("DVC would hang hashing it. Move it out of the corpus folder." in p for p in problems)
    with pytest.raises(CorpusError, match=r"pipe.txt is a FIFO .* Move it out of the corpus folder"):
        Corpus(root).files()


def _swapped(tiny_config, tmp_path) -> Path:
    """A checkpoint whose model.safetensors was replaced by another model's (same shape)."""
    ours = _trained(tiny_config, tmp_path / "ours")
    theirs = _trained(tiny_config, tmp_path / "theirs", seed=7)
    shutil.copy2(theirs / "model.safetensors", ours / "model.safetensors")
    return ours


def test_every_command_that_reads_a_checkpoint_checks_its_sha256s(tiny_config, tmp_path, capsys):
    ckpt = _swapped(tiny_config, tmp_path)
    task = tmp_path / "t.jsonl"
    task.write_text(json.dumps({"context": "The", "choices": [" a", " b"], "label": 0}) + "\n")
    before = dir_hash(ckpt)
    for argv in (
        ["info", str(ckpt)],
        ["eval", str(ckpt), "--task", str(task)],
        ["generate", str(ckpt), "--max-tokens", "2"],
        ["export", str(ckpt), str(tmp_path / "out")],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"{ckpt / 'model.safetensors'} is missing or does not match the sha256" in err, argv
        assert "dvc checkout" in err
    assert dir_hash(ckpt) == before and not (tmp_path / "out").exists()


def test_a_truncated_export_is_named(tiny_config, tmp_path, capsys):
    ckpt = _trained(tiny_config, tmp_path / "run")
    assert main(["export", str(ckpt), str(tmp_path / "out")]) == 0
    weights = tmp_path / "out" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5])
    assert main(["generate", str(tmp_path / "out"), "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert f"{weights} cannot be read" in err and "truncated" in err


_EXPORT_UNDER_LIMIT = """
import resource, sys
from lehr.__main__ import main
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
sys.exit(main(["export", sys.argv[1], sys.argv[2]]))
"""


def test_a_full_disk_during_export_is_said_and_the_earlier_export_kept(tiny_config, tmp_path):
    ckpt = _trained(tiny_config, tmp_path / "run")
    assert main(["export", str(ckpt), str(tmp_path / "out")]) == 0
    before = dir_hash(tmp_path / "out")
    proc = subprocess.run(
        [sys.executable, "-c", _EXPORT_UNDER_LIMIT, str(ckpt), str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "file-size limit (ulimit -f) is reached" in proc.stderr and "Traceback" not in proc.stderr
    assert dir_hash(tmp_path / "out") == before and not list(tmp_path.glob(".tmp-*"))


def test_task_files_with_non_utf8_bytes_name_file_and_line(tmp_path):
    path = tmp_path / "t.jsonl"
    good = json.dumps({"context": "The", "target": " end"}).encode()
    path.write_bytes(good + b"\n" + good + b"\n" + b'{"context": "caf\xe9", "target": " x"}\n')
    with pytest.raises(TaskError, match=r"t.jsonl:3: not UTF-8 \(byte 0xe9 at column 17\)"):
        read_task(path)


def test_a_parquet_null_is_named_by_its_row_in_the_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "c" / "gold").mkdir(parents=True)
    texts = ["x"] * 2000 + [None] + ["y"] * 10
    pq.write_table(pa.table({"text": texts}), tmp_path / "c" / "gold" / "p.parquet", row_group_size=1500)
    with pytest.raises(
        CorpusError, match=r"p.parquet:row 2000 \(row 500 of row group 1\): field 'text' is null"
    ):
        list(Corpus(tmp_path / "c").documents())


def test_a_pre_anneal_still_in_training_is_said_as_such(tmp_path):
    runs = tmp_path / "stable_run"
    (runs / "auto-1234").mkdir(parents=True)
    dataset = CheckpointDataset(str(tmp_path / "pre_anneal"), "pretrain_stable", runs=str(runs))
    with (
        locks.hold(runs / "auto-1234", "training run"),  # a real lock, held by this live process
        pytest.raises(Exception, match=r"does not exist yet: pretrain_stable is training it now \(pid"),
    ):
        dataset.load()
    with pytest.raises(Exception, match=r"does not exist: run pretrain_stable first"):
        dataset.load()


@pytest.mark.slow
def test_lm_eval_without_the_hub_says_so_in_one_line(tiny_config, tmp_path):
    ckpt = _trained(tiny_config, tmp_path / "run")
    proc = subprocess.run(
        [sys.executable, "-m", "lehr", "lm-eval", str(ckpt), "--tasks", "hellaswag", "--limit", "1"],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "lm-eval could not fetch the data of hellaswag" in proc.stderr and "--include-path" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_parts_encoded_under_other_versions_are_refused_unless_the_setting_says_reuse(corpus_dir, tmp_path):
    """A part whose record says another tokenizers encoded it (as a run before an upgrade leaves
    it) is not reused silently: refused naming both versions, or reused and named in the index."""
    root = _corpus(corpus_dir, tmp_path)
    tok = train_tokenizer(Corpus(root), TokenizeParams(**SMOKE_TOKENIZE))
    _encode(root, tmp_path, tok)
    index = json.loads((tmp_path / "tokens" / "streams.json").read_text())
    assert index["versions"]["tokenizers"] == importlib.metadata.version("tokenizers")
    record = sorted((tmp_path / "tokens" / "parts").glob(".*.resume"))[0]
    made = json.loads(record.read_text())
    record.write_text(json.dumps({**made, "versions": {**made["versions"], "tokenizers": "0.23.2"}}))
    before = dir_hash(tmp_path / "tokens")
    with pytest.raises(
        TokenStoreError, match=r"tokenizers 0\.23\.2 \(here [\d.]+\).*reuse_under_new_versions"
    ):
        _encode(root, tmp_path, tok)
    assert dir_hash(tmp_path / "tokens") == before
    _encode(root, tmp_path, tok, reuse_under_new_versions=True)
    index = json.loads((tmp_path / "tokens" / "streams.json").read_text())
    assert [v["tokenizers"] for v in index["reused_under_other_versions"].values()] == ["0.23.2"]


def test_a_resume_under_other_versions_is_refused_unless_allowed_and_then_recorded(tiny_config, tmp_path):
    train(tiny_config(end_step=10, planned_steps=20))
    state_file = tmp_path / "run" / "checkpoints" / "step_00000010" / "state.json"
    state = json.loads(state_file.read_text())
    assert state["versions"]["numpy"] == importlib.metadata.version("numpy")
    # The checkpoint as an environment with another numpy would have written it, checksum and all.
    old = {**state["versions"], "numpy": "1.26.4"}
    state["progress"]["trained_by"][0]["versions"] = old
    text = json.dumps({**state, "versions": old}, indent=1)
    state_file.write_text(text)
    (state_file.parent / "state.json.sha256").write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")
    with pytest.raises(
        CheckpointError, match=r"other versions \(numpy 1\.26\.4 \(here [\d.]+\)\).*resume_under_new_code"
    ):
        train(tiny_config(planned_steps=20))
    summary = train(tiny_config(planned_steps=20, resume_under_new_code=True))
    assert summary["mode"] == "resume"
    trained_by = json.loads((tmp_path / "run" / "final" / "state.json").read_text())["progress"]["trained_by"]
    assert [(t["from_step"], t["versions"]["numpy"]) for t in trained_by] == [
        (0, "1.26.4"),
        (10, importlib.metadata.version("numpy")),
    ]
    assert main(["info", str(tmp_path / "run" / "final")]) == 0


def test_a_link_where_lehr_would_write_is_refused_and_a_leftover_link_removed_as_a_link(
    tiny_config, tmp_path, caplog, dead_pid
):
    """An operator's symlink in a branch home, a run folder that is a link, and a link left under a
    staging name: each named with its target, never followed, and what it points to untouched."""
    root = tmp_path / "anneal"
    _branch(tiny_config, root, "real", "1" * 64)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(root / "real", elsewhere)
    before = dir_hash(elsewhere)
    (root / "evil").symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING):
        assert list(AnnealBranchesDataset(str(root)).load()) == ["real"]
    assert f"evil: a symbolic link (to {elsewhere})" in caplog.text
    run_dir = _trained(tiny_config, tmp_path / "run-evil").parent
    for _ in range(2):  # the second time as well: nothing was renamed or half-done by the first
        with pytest.raises(Exception, match=rf"anneal/evil is a symbolic link \(to {elsewhere}\).*rm "):
            AnnealBranchesDataset(str(root)).save(
                {"branch": "evil", "run_dir": str(run_dir), "curve": "{}\n"}
            )
    assert (root / "evil").is_symlink() and dir_hash(elsewhere) == before
    # A run folder that is a link: refused before any work.
    (tmp_path / "linked-run").symlink_to(elsewhere)
    with pytest.raises(FileExistsError, match=r"linked-run is a symbolic link .*lehr \(training run\)"):
        run(tiny_config(out_dir=str(tmp_path / "linked-run")), Launch())
    assert dir_hash(elsewhere) == before
    # A link under a dead writer's staging name goes as a link.
    (root / f".old-gone-{dead_pid}").symlink_to(elsewhere)
    AnnealBranchesDataset(str(root)).save({"branch": "again", "run_dir": str(run_dir), "curve": "{}\n"})
    assert not os.path.lexists(root / f".old-gone-{dead_pid}") and not os.path.lexists(root / "gone")
    assert dir_hash(elsewhere) == before  # never restored as a branch, never followed
