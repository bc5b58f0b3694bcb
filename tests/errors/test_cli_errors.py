"""What a user sees when a command goes wrong (issue 31): every --help works; a wrong, renamed or
mistyped parameter is one line naming the key, where it is set and the fix, exit 2; a signal
ends a command or stage with one line and the signal's exit status (130 SIGINT, 143 SIGTERM)."""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import signal
import subprocess
import time
import types
from pathlib import Path

import pytest
import yaml

from lehr.__main__ import COMMANDS, main
from lehr.errors import Stopped
from lehr.errors.messages import parameter_problems
from lehr.params.key_lines import located, where_set
from lehr.params.stages import AnnealParams, PretrainParams
from lehr.project import sandbox
from tests import ROOT
from tests.e2e import env, make_repo, sh


def _base(section: str, stage: str) -> dict:
    return yaml.safe_load((ROOT / f"conf/base/parameters_{stage}.yml").read_text())[section]


# -- 1. --help ------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [[], *([name] for name in COMMANDS)], ids=lambda c: " ".join(c) or "lehr")
def test_help_of_lehr_and_of_every_command_exits_0(command, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*command, "--help"])
    assert stop.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    if command:
        assert " ".join(COMMANDS[command[0]][0].split()) in out  # its summary, as its description
    else:
        assert "paired 95% intervals" in out  # the summary whose % broke argparse's formatting


def test_help_shows_defaults_but_no_empty_ones(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "-h"])
    out = " ".join(capsys.readouterr().out.split())
    assert "held-out windows per source (default: 64)" in out and "(default: None)" not in out


# -- 2. parameters --------------------------------------------------------------------------------
KEYS_OF_ANNEAL = (
    "branch, data_seed, decay_fraction, decay_ratio, decay_steps, eval_every, init_optimizer, min_lr, mix, "
    "origin, patience, shape, tail_fraction"
)


def test_an_unknown_key_is_refused_by_the_dataclass_itself_in_one_line():
    """Kedro builds the params as cls(**mapping): that alone names the key and the known ones."""
    with pytest.raises(ValueError) as e:
        AnnealParams(**{**_base("anneal", "anneal"), "shpae": "cosine"})
    assert str(e.value) == (
        f"unknown parameter anneal.shpae (did you mean shape?); the keys of anneal are: {KEYS_OF_ANNEAL}"
    )
    pretrain = _base("pretrain", "pretrain_stable")
    with pytest.raises(
        ValueError, match=r"^unknown parameter pretrain.model.presett \(did you mean preset\?\); "
    ):
        PretrainParams(**{**pretrain, "model": {**pretrain["model"], "presett": "tiny"}})
    with pytest.raises(
        ValueError, match=r"^unknown parameter pretrain.launch.nnode \(did you mean nnodes\?\)"
    ):
        PretrainParams(**{**pretrain, "launch": {"nnode": 2}})
    with pytest.raises(ValueError, match=r"^unknown parameter pretrain.wibble; the keys of pretrain are: "):
        PretrainParams(**{**pretrain, "wibble": 1})  # nothing close: no guess


def test_a_renamed_or_missing_key_is_said_by_the_dataclass_itself():
    pretrain = _base("pretrain", "pretrain_stable")
    raw = {k: v for k, v in pretrain.items() if k != "planned_decay_fraction"} | {"decay_fraction": 0.3}
    with pytest.raises(ValueError) as e:
        PretrainParams(**raw)
    assert str(e.value) == (
        "parameter pretrain.decay_fraction = 0.3 was renamed: write planned_decay_fraction instead "
        "(the same setting)"
    )
    anneal = {k: v for k, v in _base("anneal", "anneal").items() if k != "origin"}
    with pytest.raises(ValueError, match=r"^parameter anneal.origin is missing: give it a value"):
        AnnealParams(**anneal)


def test_a_renamed_key_of_a_part_is_refused_in_every_config_made_of_it():
    from lehr.config_parts import Part, setting

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Old(Part):
        planned: int = setting(1, renamed_from="total")

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Composed(Old):
        other: int = setting(2, renamed_from="older")

    with pytest.raises(ValueError, match="total = 3 was renamed: write planned instead"):
        Composed(total=3)
    with pytest.raises(ValueError, match="older = 3 was renamed: write other instead"):
        Composed(older=3)


def test_params_still_copy_pickle_and_replace():
    params = AnnealParams(**_base("anneal", "anneal"))
    assert copy.deepcopy(params) == params and pickle.loads(pickle.dumps(params)) == params
    assert dataclasses.replace(params, shape="cosine").shape == "cosine"


def test_kedros_validation_error_is_said_as_lehrs_lines():
    kedro = (
        "Parameter validation failed:\n"
        "- Parameter 'anneal': Failed to instantiate AnnealParams for parameter 'anneal': unknown parameter "
        "anneal.shpae; the keys of anneal are: shape\n"
        "- Parameter 'evaluate': value is None but type is not Optional\n"
        "- Parameter 'soup': Expected dict for dataclass SoupParams, got str"
    )
    assert parameter_problems(kedro) == [
        "unknown parameter anneal.shpae; the keys of anneal are: shape",
        "parameter evaluate is empty (null): it must be a mapping of the keys of evaluate",
        "parameter soup is a str: it must be a mapping of the keys of soup",
    ]


def test_where_a_parameter_is_set(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "smoke").mkdir()
    (tmp_path / "base/parameters_anneal.yml").write_text("anneal:\n  shape: linear\n  min_lr: 0.0\n")
    (tmp_path / "smoke/parameters_anneal.yml").write_text("# smoke\nanneal:\n  min_lr: 0.1\n  shpae: x\n")
    assert where_set("anneal.shpae", {"anneal": {"shpae": "x"}}, tmp_path, "smoke") == "--params"
    assert where_set("anneal.mix.gold", {"anneal": {"mix": "x"}}, tmp_path, "smoke") == "--params"
    assert where_set("anneal.shpae", {}, tmp_path, "smoke") == f"{tmp_path}/smoke/parameters_anneal.yml:4"
    assert where_set("anneal.min_lr", None, tmp_path, "smoke") == f"{tmp_path}/smoke/parameters_anneal.yml:3"
    assert where_set("anneal.shape", None, tmp_path, "smoke") == f"{tmp_path}/base/parameters_anneal.yml:2"
    assert where_set("anneal.origin", None, tmp_path, "smoke") == f"{tmp_path}/base/parameters_anneal.yml:1"
    assert located("a message about no parameter", None, tmp_path, "smoke") == "a message about no parameter"


@pytest.fixture(scope="module")
def params_sandbox(tmp_path_factory) -> Path:
    """`python -m lehr sandbox DEST --profile smoke`, without data: params are validated before any
    node loads some."""
    return sandbox.create(ROOT, tmp_path_factory.mktemp("params") / "sb", "smoke")


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def test_a_mistyped_key_in_params_is_one_line_exit_2(params_sandbox):
    out = sh(
        params_sandbox,
        "kedro",
        "run",
        "--pipelines",
        "anneal",
        "--params",
        "anneal.shpae=cosine",
        check=False,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    said = f"unknown parameter anneal.shpae (did you mean shape?); the keys of anneal are: {KEYS_OF_ANNEAL}"
    assert _error_lines(out.stderr) == [f"lehr: error: --params: {said}"], out.stderr
    assert "No nodes ran" not in out.stderr + out.stdout


def test_a_mistyped_key_in_yaml_names_file_and_line_and_lehr_check_says_the_same(params_sandbox):
    path = params_sandbox / "conf/smoke/parameters_anneal.yml"
    before = path.read_text()
    try:
        path.write_text(before + "  shpae: cosine\n")
        line = len(before.splitlines()) + 1
        out = sh(params_sandbox, "kedro", "run", "--pipelines", "anneal", check=False)
        message = (
            f"unknown parameter anneal.shpae (did you mean shape?); the keys of anneal are: {KEYS_OF_ANNEAL}"
        )
        assert out.returncode == 2
        assert _error_lines(out.stderr) == [
            f"lehr: error: conf/smoke/parameters_anneal.yml:{line}: {message}"
        ], out.stderr
        check = sh(params_sandbox, "python", "-m", "lehr", "check", check=False)
        assert check.returncode == 2 and message in check.stderr
    finally:
        path.write_text(before)


# -- 3. signals -----------------------------------------------------------------------------------
def _stage_that(monkeypatch, what):
    from lehr import cli

    monkeypatch.setattr(cli.kedro_run, "callback", lambda **options: what())
    return cli._run


@pytest.mark.skipif(
    signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL,
    reason="SIGTERM has a handler of the test runner's",
)
def test_sigterm_outside_the_loop_ends_a_stage_with_one_line_and_143(monkeypatch, capsys):
    def stage():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends

    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stop:
        _stage_that(monkeypatch, stage)()
    assert stop.value.code == 143 and signal.getsignal(signal.SIGTERM) == handler
    assert capsys.readouterr().err == (
        "lehr: stopped by SIGTERM before the run finished: run the same command again to finish it\n"
    )


def test_ctrl_c_outside_the_loop_ends_a_stage_with_one_line_and_130(monkeypatch, capsys):
    def stage():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stop:
        _stage_that(monkeypatch, stage)()
    assert stop.value.code == 130
    assert capsys.readouterr().err.startswith("lehr: stopped by SIGINT before the run finished")


def test_a_run_the_loop_stopped_says_its_signal_step_and_checkpoint(monkeypatch):
    from lehr.engine.config import Launch
    from lehr.engine.run import signals
    from lehr.training import job as training_job

    summary = {"stopped": "signal", "step": 6, "out_dir": "runs/auto-1"}
    monkeypatch.setattr(training_job.launch, "run", lambda *a, **k: summary)
    monkeypatch.setattr(training_job.step_forwarder, "mark_attempt", lambda out_dir: None)
    monkeypatch.setattr(signals, "_received", "SIGINT")
    with pytest.raises(Stopped) as stop:
        training_job.run_engine(
            types.SimpleNamespace(out_dir="runs/auto-1"), types.SimpleNamespace(launch=Launch())
        )
    assert stop.value.exit_status == 130 and str(stop.value) == (
        "stopped by SIGINT at step 6; its checkpoint is saved in runs/auto-1: run the stage again to resume"
    )
    monkeypatch.setattr(signals, "_received", None)  # through torchrun: the workers heard it
    with pytest.raises(Stopped, match="stopped by a signal at step 6") as stop:
        training_job.run_engine(
            types.SimpleNamespace(out_dir="runs/auto-1"), types.SimpleNamespace(launch=Launch())
        )
    assert stop.value.exit_status == 143


def test_ctrl_c_of_a_lehr_command_is_one_line_and_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    summary, arguments, _ = COMMANDS["runs"]
    monkeypatch.setitem(COMMANDS, "runs", (summary, arguments, interrupted))
    assert main(["runs"]) == 130
    assert capsys.readouterr().err == "lehr: stopped by SIGINT\n"


def test_ctrl_c_and_sigterm_during_training_end_the_stage_in_one_line(tmp_path, corpus_dir):
    """For real: SIGINT once the first step is logged (exit 130), then the stage run again resumes
    and a SIGTERM stops it the same way (exit 143); never a traceback."""
    repo = make_repo(tmp_path / "repo", corpus_dir)
    sh(repo, "dvc", "repro", "shard")
    for sig in (signal.SIGINT, signal.SIGTERM):
        proc = subprocess.Popen(
            ["kedro", "run", "--pipelines", "pretrain_stable"],
            cwd=repo,
            env=env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if "| loss" in line:  # a step logged: the loop runs
                proc.send_signal(sig)
                break
        stderr = "".join(seen) + proc.stderr.read()
        assert proc.wait(timeout=120) == 128 + sig, stderr[-3000:]
        last = stderr.strip().splitlines()[-1]
        assert last.startswith(f"lehr: stopped by {sig.name} at step "), stderr[-3000:]
        assert last.endswith(": run the stage again to resume") and "checkpoint is saved in" in last
        assert "Traceback" not in stderr and "No nodes ran" not in stderr and " ERROR " not in stderr
    assert "resumed from checkpoint" in stderr


def test_ladder_predict_refuses_what_is_no_count_and_says_when_it_extrapolates(capsys):
    fit = ["--fit", str(ROOT / "data/08_reporting/ladder.json")]
    for params, tokens in (("0", "1e6"), ("-5", "1e6"), ("nan", "1e6"), ("2e6", "inf"), ("2e6", "0")):
        assert main(["ladder", "predict", "--params", params, "--tokens", tokens, *fit]) == 2
        assert "is no count to predict at: give a positive, finite number" in capsys.readouterr().err
    assert main(["ladder", "predict", "--params", "1e300", "--tokens", "1e6", *fit]) == 0
    out, err = capsys.readouterr()
    assert "1e+300 parameters" in out and "note: an extrapolation: the ladder's largest model is" in out
    assert "nan" not in out and "inf" not in out and not err


def test_a_lack_of_room_is_told_from_an_errno_wherever_the_writer_put_it(tmp_path):
    """safetensors says "(os error 27)" in text, torch.save "unexpected pos" with no errno at all."""
    import errno

    from lehr.errors.messages import explained, no_room

    assert no_room(OSError(errno.ENOSPC, "No space left on device")) == "the disk is full"
    assert no_room(RuntimeError("I/O error: File too large (os error 27)")) == (
        "the file-size limit (ulimit -f) is reached"
    )
    assert no_room(ValueError("bad value")) is None
    assert no_room(RuntimeError("unexpected pos 512"), tmp_path) is None  # room here, and no limit
    wrapped = RuntimeError("saving failed")
    wrapped.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded", str(Path.cwd() / "data" / "x.bin"))
    said = explained(wrapped)
    assert said.startswith("no room writing data/x.bin: the disk quota is used up. Free space"), said
