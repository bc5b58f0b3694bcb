"""``python -m lehr``: small commands around the pipeline (Kedro runs the stages themselves).

python -m lehr corpus --out DIR         lay out the bundled corpus in a new folder
python -m lehr branches [--root DIR]    list the anneal branches side by side (default: the catalog's)
python -m lehr info CHECKPOINT          which commit, config and data made a checkpoint
python -m lehr export CHECKPOINT OUT [--hf]   safetensors + config JSON, or a transformers model
python -m lehr eval CHECKPOINT --task F.jsonl  score a checkpoint or export on a task file
python -m lehr generate CHECKPOINT --prompt P  sample text, streamed
python -m lehr compare A B              B - A per source and task, with paired 95% intervals
python -m lehr ladder predict --params N --tokens D   the ladder's predicted loss, with an interval
python -m lehr lm-eval CHECKPOINT --tasks T,U  lm-evaluation-harness tasks (the lm-eval extra)
python -m lehr runs                     the rolling run folders: step, state, use, size
python -m lehr prune [--unfinished] [--yes]   remove rolling folders nothing in the workspace came from
python -m lehr check [--env PROFILE]    validate every stage's params against the data there is
python -m lehr exp -n NAME -S F:K=V     `dvc exp run` with its -S values checked first, from the same baseline
python -m lehr experiments              every experiment: changed params, figures, paired 95% difference
python -m lehr queue start -j N         the queued experiments, N at once, each on its share; Ctrl-C stops
python -m lehr queue stop               no queued experiment starts; running ones save a checkpoint, stop
python -m lehr cluster submit -S F:K=1,2   a sweep as a SLURM job array; its experiments come back here
python -m lehr shares                   who holds which share of this machine (cores, GPUs)
python -m lehr mlflow-ui [--port N]    MLflow's UI on this machine, stopped whole by Ctrl-C or SIGTERM
python -m lehr mlflow-server [--root D] [--host H]   one tracking server for a team (docs/team.md)
python -m lehr sandbox DEST [--profile P] [--ladder]  a throwaway copy of the project (`make smoke`)
python -m lehr join STAGE --params ...  node i > 0 of a run across machines: train its share
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from lehr.engine.artifacts.state import State
from lehr.errors import EXIT, explained


def _corpus(args: argparse.Namespace) -> int:
    from lehr.dataprep.bundled_corpus import build

    out = Path(args.out)
    if out.exists():
        # Whatever is there may be a user's own corpus: lehr never replaces or deletes it.
        print(
            f"{out} exists: left as it is (the bundled corpus is laid out only where no corpus is; "
            f"to lay it out again, move {out} away first)"
        )
        return 0
    for stream, n in build(out).items():
        print(f"{stream:20s} {n:6d} documents")
    print(f"bundled corpus written to {args.out}")
    return 0


def _last_eval(progress: dict) -> dict:
    evals = progress["evals"]
    return evals[-1] if evals else {}


def _branches(args: argparse.Namespace) -> int:
    from lehr.catalog.branches_dataset import made_by, scan, scan_homes
    from lehr.paths import branch_homes

    if args.root:
        homes, (branches, left_out) = (Path(args.root),), scan(Path(args.root))
    else:
        homes = branch_homes(Path.cwd(), args.env)
        branches, left_out = scan_homes(*homes)  # the listing evaluate and soup read
    for line in left_out:
        print(f"left out: {line}", file=sys.stderr)
    if not branches:
        print(
            f"no anneal branches in {' or '.join(map(str, homes))}; make one with `kedro run --pipelines "
            "anneal --params anneal.branch=NAME`"
        )
        return 0
    from lehr.tracking.provenance import origin_name

    print(
        f"{'branch':28s} {'made by':>9s} {'origin':>16s} {'step':>6s} {'tokens':>11s} {'heldout.bpb':>12s} "
        f"{'best loss':>10s}"
    )
    for p in branches.values():
        prog = State.read(p / "final").progress
        ev = _last_eval(prog)
        print(
            f"{p.name:28s} {made_by(p):>9s} {origin_name(p / 'final') or '?':>16s} {prog['step']:6d} "
            f"{prog['tokens']:11,d} {ev.get('heldout', {}).get('bpb', float('nan')):12.4f} "
            f"{prog.get('best_loss') or float('nan'):10.4f}"
        )
    from lehr.paths import portable

    print(f"folders: {', '.join(map(portable, homes))} (docs/tracking.md: which command writes where)")
    return 0


def _ingredients(state: dict) -> list[str]:
    """The recipe's ingredients a checkpoint was trained with (a record leaves out those off)."""
    from lehr.engine.config import RUN_INGREDIENTS
    from lehr.engine.model import ModelConfig

    math = state.get("config_math", {})
    model = ModelConfig(**state["config"]["model"]).ingredients
    return model + [f"{k}={math[k]}" for k in RUN_INGREDIENTS if k in math]


def _info(args: argparse.Namespace) -> int:
    from lehr.engine.artifacts.checkpoint import verify

    State.read(Path(args.checkpoint))  # a folder that is no checkpoint at all is named as such first
    state = verify(Path(args.checkpoint))  # what it prints is of these very files
    prov, prog, ev = state.get("provenance", {}), state["progress"], _last_eval(state["progress"])
    lines = {
        "checkpoint": args.checkpoint,
        "stage": prov.get("stage", "?"),
        "engine code sha256": state.get("code", {}).get("sha256", "not recorded"),
        # A checkpoint is the same bytes at any commit of its code, so DVC's lock holds at every one
        # (checkpoints made before 2026-12-04 still name theirs).
        "git commit": f"{prov['git_commit']} (recorded before 2026-12-04)"
        if "git_commit" in prov
        else "not in a checkpoint: MLflow's run of the stage has it (tag git_commit)",
        "step": prog["step"],
        "tokens seen": f"{prog['tokens']:,}",
        "config hash": state["math_hash"],
        "data manifest sha256": state["manifest_sha256"],
        "tokenizer sha256": state["tokenizer_sha256"],
        "world size": state["world_size"],
        "device": state["device"],
        "cuda": state["cuda"],
        "made under": ", ".join(
            f"{k} {v}" for k, v in state.get("versions", {"torch": state["torch"]}).items()
        ),
        "anneal start": f"{prog.get('anneal_start')} ({prog.get('anneal_reason')})",
        "ingredients": ", ".join(_ingredients(state)) or "none (docs/recipe.md)",
    }
    from lehr import versions

    other = versions.differing(state.get("versions"))
    if other:
        lines["versions here differ"] = ", ".join(other)
    # Which code trained which steps (a resume under new code, a branch's origin). The commit is
    # in MLflow's tags, not here: a checkpoint is the same bytes at any commit of the same code.
    for i, part in enumerate(prog.get("trained_by", [])):
        until = prog["trained_by"][i + 1]["from_step"] if i + 1 < len(prog["trained_by"]) else prog["step"]
        lines[f"trained steps {part['from_step']}-{until} by"] = f"code {part['code_sha256'][:16]}" + "".join(
            f", {k} {v}" for k, v in part.get("versions", {}).items() if k != "python"
        )
    # A resume under another plan (budget, stop rule, early stop) whose trained steps were the new
    # plan's (``lehr.engine.run.plan``): from which step, and what changed.
    for change in prog.get("plan_changes", []):
        lines[f"plan changed at step {change['step']}"] = ", ".join(
            f"{k} {old} → {new}" for k, (old, new) in change["changed"].items()
        )
    lines.update({f"held-out heldout.{k}": f"{v:.4f}" for k, v in ev.get("heldout", {}).items()})
    lines.update({f"input {path}": digest for path, digest in prov.get("inputs", {}).items()})
    width = max(map(len, lines))
    for key, value in lines.items():
        print(f"{key:{width}s}  {value}")
    if args.config:
        print(json.dumps(state["config"], indent=1))
    return 0


def _export(args: argparse.Namespace) -> int:
    from lehr.engine.artifacts.export import export_hf, export_plain

    tokenizer = Path(args.tokenizer) if args.tokenizer else None
    out = (export_hf if args.hf else export_plain)(Path(args.checkpoint), Path(args.out), tokenizer)
    print(
        f"exported {args.checkpoint} to {out}"
        + (" (load it with transformers' from_pretrained)" if args.hf else "")
    )
    return 0


def _model_and_tokenizer(args: argparse.Namespace):
    from lehr.engine.artifacts.export import load_for_inference
    from lehr.engine.hardware import resolve

    device = resolve("auto", "fp32", None).device  # the device a run would pick, in full precision
    model, tokenizer = load_for_inference(
        Path(args.checkpoint), Path(args.tokenizer) if args.tokenizer else None, device
    )
    return model, tokenizer, device


def _eval(args: argparse.Namespace) -> int:
    from lehr.engine.evals.tasks import Scorer, evaluate_task, read_task

    task = read_task(Path(args.task))
    model, tokenizer, device = _model_and_tokenizer(args)
    result = evaluate_task(Scorer(model, tokenizer, device, args.batch_size), task, args.limit)
    print(json.dumps({"task": task.name, "kind": task.kind, **result}, indent=1))
    return 0


def _lm_eval(args: argparse.Namespace) -> int:
    try:
        from lehr.reports import lm_eval_harness
    except ImportError as e:
        print(f"lehr: error: {e}", file=sys.stderr)
        return 2
    results = lm_eval_harness.run(
        Path(args.checkpoint),
        [t for t in args.tasks.split(",") if t],
        include_path=Path(args.include_path) if args.include_path else None,
        limit=args.limit,
        num_fewshot=args.num_fewshot,
        batch_size=args.batch_size,
        tokenizer=Path(args.tokenizer) if args.tokenizer else None,
        output=Path(args.output) if args.output else None,
        samples=Path(args.log_samples) if args.log_samples else None,
    )
    print(lm_eval_harness.table(results))
    return 0


def _generate(args: argparse.Namespace) -> int:
    from lehr.engine.evals.evaluation import prompt_ids, sample

    model, tokenizer, device = _model_and_tokenizer(args)
    ids = prompt_ids(tokenizer, args.prompt)
    tokens = sample(
        model, ids, args.max_tokens, device, temperature=args.temperature, top_k=args.top_k, seed=args.seed
    )
    new, shown = [], ""
    print(args.prompt, end="", flush=True)
    for token in tokens:  # printed as they come
        new.append(token.item())
        text = tokenizer.decode(new)
        if text.startswith(shown) and not text.endswith("\ufffd"):  # wait out a split UTF-8 character
            print(text[len(shown) :], end="", flush=True)
            shown = text
    print(tokenizer.decode(new)[len(shown) :])
    return 0


def _compare(args: argparse.Namespace) -> int:
    from tokenizers import Tokenizer

    from lehr.engine.artifacts.checkpoint import verify
    from lehr.engine.batches import ShardSet, manifest_sha256
    from lehr.engine.evals.evaluation import HeldOut, load_model
    from lehr.engine.evals.tasks import read_task
    from lehr.engine.hardware import resolve
    from lehr.reports import comparison

    paths = (Path(args.a), Path(args.b))
    states = [verify(p) for p in paths]
    comparison.check_comparable(*states, tuple(map(str, paths)))
    shards = Path(states[0]["config"]["shards"])
    if manifest_sha256(shards) != states[0]["manifest_sha256"]:
        raise ValueError(
            f"the shards in {shards} are not those {args.a} and {args.b} trained on (their manifest "
            "changed since): the held-out windows would not be theirs. Re-make the shards they trained on."
        )
    hw = resolve("auto", "fp32", None)
    models = [load_model(p, hw.device) for p in paths]
    cfg = models[0].cfg
    held = HeldOut.build(ShardSet(shards, cfg.vocab_size, cfg.seq_len).heldout(), cfg.seq_len, args.windows)
    tokenizer = Tokenizer.from_file(str(shards / "tokenizer.json"))
    tasks = [read_task(Path(t)) for t in args.task or sorted(_catalog(args)["heldout_tasks"].glob("*.jsonl"))]
    base, other = (comparison.score(m, held, tasks, tokenizer, hw, args.batch_size) for m in models)
    print(comparison.table(comparison.difference(base, other), args.a, args.b))
    return 0


def _ladder(args: argparse.Namespace) -> int:
    from lehr.reports.scaling_fit import predict

    path = Path(args.fit)
    if not path.is_file():
        raise FileNotFoundError(f"no ladder fit at {path}: run `make ladder` first (docs/ladder.md)")
    if (args.checkpoint is None) == (args.params is None or args.tokens is None) or (
        args.checkpoint and (args.params or args.tokens)
    ):
        raise ValueError("give --params N and --tokens D, or --checkpoint PATH (a trained model), not both")
    fitted = json.loads(path.read_text())
    run = _trained(Path(args.checkpoint)) if args.checkpoint else None
    n, d = (run["n_params"], run["tokens"]) if run else (args.params, args.tokens)
    r = predict(fitted, n, d)
    loss = f"{r['loss']:.4f} nats/token"
    bpb = f"{r['bpb']:.4f} bits/byte"
    if "loss_interval" in r:
        loss += " [{:.4f}, {:.4f}]".format(*r["loss_interval"])
        bpb += " [{:.4f}, {:.4f}]".format(*r["bpb_interval"])

    def count(x: float) -> str:
        return f"{x:,.0f}" if x < 1e15 else f"{x:.3g}"

    print(f"{count(n)} parameters, {count(d)} tokens: held-out loss {loss}, {bpb} (95% interval)")
    if run and run["bpb"] is not None:
        inside = "bpb_interval" in r and r["bpb_interval"][0] <= run["bpb"] <= r["bpb_interval"][1]
        print(
            f"{args.checkpoint} itself: {run['bpb']:.4f} bits/byte at its last eval; the prediction is "
            f"{r['bpb'] / run['bpb'] - 1:+.1%} off, {'inside' if inside else 'outside'} its interval"
        )
    for what, largest in r["beyond"].items():
        size = (
            f"model is {count(largest)} parameters"
            if what == "n_params"
            else f"budget is {count(largest)} tokens"
        )
        print(
            f"note: an extrapolation: the ladder's largest {size}; the interval covers the fit's "
            "uncertainty, not whether the law holds that far"
        )
    family = fitted.get("family")
    if family is None and (family := _family_in_conf()) is not None:
        print(
            "note: this fit records no family of rungs (made before 2026-12-03): it is read from this "
            "project's conf"
        )
    if family is None:
        print("note: this fit records no family of rungs (made before 2026-12-03), and no conf here does")
    elif run:
        from lehr.stages.ladder_rungs import family_gaps  # torch and the engine: only for a checkpoint

        for gap in family_gaps(family, run["model"], run["decay"], run["batch_warmup_steps"]):
            print(f"note: an extrapolation across shapes: {gap}")
    else:
        from lehr.stages.ladder_params import ShapeRule

        shape = ShapeRule(**family["shape"])
        overrides = ", ".join(f"{k} {v}" for k, v in sorted(family.get("overrides", {}).items()))
        print(
            f"note: the law is of the ladder's family: depths {family['depths']}, width "
            f"{shape.width_rule()}, heads of {shape.head_dim}, {shape.seq_len}-token context, the rest "
            f"{shape.preset}'s{f' with {overrides}' if overrides else ''}, each cooled down "
            f"{family['decay_ratio']} of its steps; for a model of another shape or anneal it is an "
            "extrapolation (--checkpoint names how a trained one differs)"
        )
    return 0


def _family_in_conf() -> dict | None:
    """The ladder's family as this project's params describe it: a fit made before fits recorded
    their own (2026-12-03) was made from these unless they changed since (ladder/dvc.lock says)."""
    from lehr.config_parts import from_mapping
    from lehr.paths import profile_in_force
    from lehr.project.experiments import load_parameters
    from lehr.stages.ladder_params import LadderParams

    conf = Path.cwd() / "conf"
    if not conf.is_dir():
        return None
    ladder = load_parameters(conf, profile_in_force(Path.cwd())).get("ladder")
    return from_mapping(LadderParams, ladder, "ladder").family() if ladder else None


def _trained(folder: Path) -> dict:
    """What the ladder's law needs of a trained checkpoint: its size, tokens, model, anneal and figure."""
    from lehr.engine.artifacts.state import State
    from lehr.engine.memory import parameter_count
    from lehr.engine.model import ModelConfig

    state = State.read(folder)
    evals = state.progress.get("evals") or [{}]
    start, steps = state.config.get("anneal_start"), state.config.get("anneal_steps", 0)
    return {
        "n_params": parameter_count(ModelConfig(**state.config["model"])),
        "tokens": state.tokens,
        "model": state.config["model"],
        "decay": (start, steps) if start is not None else None,
        "batch_warmup_steps": state.config.get("batch_warmup_steps", 0),
        "bpb": evals[-1].get("heldout", {}).get("bpb"),
    }


def _check(args: argparse.Namespace) -> int:
    """Validate every stage's params under a profile, as the stages would, without running one.

    `dvc exp run -S key=bad` removes a stage's outputs before its command can refuse the value;
    checking first (`make check-params`, `lehr exp`) keeps them."""
    from lehr.paths import profile_in_force
    from lehr.project import conf_visibility
    from lehr.project.experiments import problems_of

    env = args.env or profile_in_force(Path.cwd())
    for note in conf_visibility.unread_overrides(Path.cwd(), env):
        print(f"note: {note}")
    from lehr.errors import located

    problems = problems_of(Path.cwd(), env)
    for p in problems:
        print(f"lehr: {located(p, None, Path('conf'), env)}", file=sys.stderr)
    if not problems:
        print(f"parameters of profile {env}: every stage's params are valid, against the data there is")
    return 2 if problems else 0


def _exp(args: argparse.Namespace) -> int:
    from lehr.paths import profile_in_force
    from lehr.project.experiments import run

    return run(Path.cwd(), profile_in_force(Path.cwd()), args.dvc_args)


def _experiments(args: argparse.Namespace) -> int:
    from lehr.project.experiments import table

    print(table(Path.cwd(), args.baseline))
    return 0


def _queue(args: argparse.Namespace) -> int:
    from lehr.project import queue

    if args.action == "start":
        return queue.start(Path.cwd(), args.jobs)
    queue.stop_elsewhere(Path.cwd())
    return 0


def _cluster(args: argparse.Namespace) -> int:
    from lehr.paths import profile_in_force
    from lehr.project import cluster

    project = Path.cwd()
    if args.action == "gather":
        return cluster.gather_later(project, Path(args.folder))
    return cluster.submit_sweep(
        project,
        profile_in_force(project),
        args.set,
        name=args.name,
        folder=Path(args.folder),
        git_remote=args.git_remote,
        local=args.local,
        wait_for_it=not args.no_wait,
        ladder=args.ladder,
        partition=args.partition,
        account=args.account,
        time_min=args.time,
        gpus_per_task=args.gpus_per_task,
        cpus_per_task=args.cpus_per_task,
        at_once=args.at_once,
    )


def _shares(args: argparse.Namespace) -> int:
    from lehr.project.queue import shares_table

    print(shares_table())
    return 0


def _mlflow_ui(args: argparse.Namespace) -> int:
    from lehr.project.mlflow_service import ui

    return ui(args.store, args.host, args.port)


def _mlflow_server(args: argparse.Namespace) -> int:
    from lehr.project.mlflow_service import server

    return server(Path(args.root), args.host, args.port, args.allowed_hosts)


def _sandbox(args: argparse.Namespace) -> int:
    from lehr.project.sandbox import create

    dest = create(Path.cwd(), Path(args.dest), args.profile, force=args.force, ladder=args.ladder)
    print(f"sandbox on the {args.profile} profile in {dest}: `cd {dest} && dvc repro` runs it")
    return 0


def _join(args: argparse.Namespace) -> int:
    from lehr.paths import profile_in_force
    from lehr.stages.join import join, runtime_params

    env = args.env or profile_in_force(Path.cwd())
    node = join(Path.cwd(), args.stage, env, runtime_params(args.params))
    print(f"node {node} trained its share of the {args.stage} run; node 0 saved the stage's outputs")
    return 0


def _catalog(args: argparse.Namespace) -> dict[str, Path]:
    from lehr.paths import catalog_paths

    return catalog_paths(Path.cwd(), getattr(args, "env", None))


def _layout(args: argparse.Namespace):
    from lehr.paths import branch_homes
    from lehr.project.run_folders import Layout

    paths = _catalog(args)
    homes = branch_homes(Path.cwd(), getattr(args, "env", None))
    return Layout(paths["stable_run"], paths["pre_anneal"], paths["anneal_runs"], homes)


def _runs(args: argparse.Namespace) -> int:
    from lehr.project.run_folders import scan

    layout = _layout(args)
    folders = scan(layout)
    if not folders:
        print(f"no rolling run folders in {layout.stable_run} or {layout.anneal_runs}")
        return 0
    print(f"{'kind':7s} {'folder':36s} {'step':>6s} {'state':12s} {'in use':6s} {'MB':>9s}")
    for f in folders:
        state = "running" if f.live else "finished" if f.finished else "stopped"
        print(
            f"{f.kind:7s} {f.path.name:36s} {f.step if f.step is not None else '-':>6} "
            f"{state:12s} {'yes' if f.in_use else 'no':6s} {f.size / 1e6:9.1f}"
            + (f"  ({f.live})" if f.live else "")
        )
    return 0


def _prune(args: argparse.Namespace) -> int:
    from lehr.project.run_folders import prunable, remove, scan

    folders = scan(_layout(args))
    for f in folders:
        if f.live:
            print(f"keeping {f.path}: a run is writing it ({f.live})")
    doomed = prunable(folders, unfinished=args.unfinished)
    if not doomed:
        print(
            "nothing to prune: every rolling folder is in use" + ("" if args.unfinished else " or unfinished")
        )
        return 0
    for f in doomed:
        print(
            f"{'removing' if args.yes else 'would remove'} {f.path} ({f.size / 1e6:.1f} MB, "
            f"{'finished' if f.finished else 'unfinished'})"
        )
        if args.yes:
            remove(f)  # raises, touching nothing, if a run took the folder since the scan
    total = sum(f.size for f in doomed) / 1e6
    print(
        f"{'freed' if args.yes else 'would free'} {total:.1f} MB"
        + ("" if args.yes else "; run again with --yes")
    )
    return 0


# -- the arguments several commands share ------------------------------------------------------
def _checkpoint_arg(p: argparse.ArgumentParser, exports_too: bool = True) -> None:
    p.add_argument(
        "checkpoint",
        help="a checkpoint, or a folder made by `lehr export` (plain or --hf)" if exports_too else None,
    )


def _tokenizer_arg(p: argparse.ArgumentParser, extra: str = "") -> None:
    p.add_argument(
        "--tokenizer", help=f"default: the tokenizer of the shards the checkpoint trained on{extra}"
    )


def _env_arg(p: argparse.ArgumentParser, default: str = "the one in force") -> None:
    p.add_argument("--env", help=f"the profile (Kedro environment); default: {default}")


def _batch_size_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--batch-size",
        type=int,
        default=16,
        help="sequences of the model's context scored at once (a batch: at most this many x seq_len tokens)",
    )


# -- one builder per command --------------------------------------------------------------------
def _corpus_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out", required=True, help="a folder that does not exist yet (dvc.yaml's corpus stage names it)"
    )


def _branches_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--root", help="one folder of branches; default: both homes in the catalog's anneal_branches"
    )
    _env_arg(p)


def _info_args(p: argparse.ArgumentParser) -> None:
    _checkpoint_arg(p, exports_too=False)
    p.add_argument("--config", action="store_true", help="also print the full resolved config")


def _export_args(p: argparse.ArgumentParser) -> None:
    _checkpoint_arg(p, exports_too=False)
    p.add_argument("out")
    p.add_argument(
        "--hf",
        action="store_true",
        help="a Hugging Face folder: LlamaForCausalLM, or Qwen3ForCausalLM with qk_norm (needs transformers)",
    )
    _tokenizer_arg(p, "; either way it must be the one the checkpoint recorded (sha256)")


def _eval_args(p: argparse.ArgumentParser) -> None:
    _checkpoint_arg(p)
    p.add_argument(
        "--task", required=True, help='{"context", "choices", "label"} or {"context", "target"} lines'
    )
    p.add_argument("--limit", type=int, help="the first N examples only")
    _batch_size_arg(p)
    _tokenizer_arg(p)


def _compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="the baseline checkpoint")
    p.add_argument("b", help="the checkpoint compared with it")
    p.add_argument("--windows", type=int, default=64, help="held-out windows per source")
    p.add_argument(
        "--task", action="append", help="a task file (repeat for more); default: the built-in held-out tasks"
    )
    _batch_size_arg(p)
    _env_arg(p)


def _ladder_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["predict"])
    p.add_argument("--params", type=float, help="parameters, counted as n_params in stage metrics")
    p.add_argument("--tokens", type=float, help="training tokens, the decay included")
    p.add_argument(
        "--checkpoint",
        help="a trained model instead (e.g. data/06_models/anneal/<branch>/final): its size and tokens, "
        "its own figure beside the prediction, and how its shape and anneal differ from the ladder's",
    )
    p.add_argument("--fit", default="data/08_reporting/ladder.json", help="the ladder's fit (make ladder)")


def _lm_eval_args(p: argparse.ArgumentParser) -> None:
    _checkpoint_arg(p)
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task names, e.g. hellaswag,piqa")
    p.add_argument("--include-path", help="a folder of lm-eval task YAML files (your own, local data)")
    p.add_argument("--limit", type=int, help="the first N examples of each task only")
    p.add_argument("--num-fewshot", type=int)
    _batch_size_arg(p)
    p.add_argument("--output", help="write lm-eval's results JSON here")
    p.add_argument("--log-samples", help="write each example's requests and responses here (JSONL)")
    _tokenizer_arg(p)


def _generate_args(p: argparse.ArgumentParser) -> None:
    _checkpoint_arg(p)
    p.add_argument("--prompt", default="The", help="the text the sample continues")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to sample")
    p.add_argument("--temperature", type=float, default=0.8, help="below 1 sharper, above 1 more varied")
    p.add_argument("--top-k", type=int, default=40, help="sample among the k likeliest tokens only")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed (the same seed, the same text)")
    _tokenizer_arg(p)


def _exp_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dvc_args",
        nargs=argparse.REMAINDER,
        help="`dvc exp run`'s own arguments, e.g. -n linear "
        "-S conf/base/parameters_anneal.yml:anneal.shape=linear",
    )


def _queue_args(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser(
        "start",
        help="run the queued experiments (lehr exp --queue ...) until none is left",
        description="Run the experiments queued with `python -m lehr exp --queue` (or `dvc exp run "
        "--queue`), N at once, each on its own share of the machine (LEHR_JOBS=N for its stages). "
        "Ctrl-C or SIGTERM stops the queue: no queued experiment starts, and each running one saves "
        "a checkpoint and stops; queued again with the same values, it resumes (docs/parallel.md).",
        formatter_class=Help,
    )
    start.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=1,
        help="experiments at once, each on 1/N of the cores or its own GPUs",
    )
    actions.add_parser(
        "stop",
        help="stop the queue from another terminal, as Ctrl-C of `lehr queue start` does",
        description="The same stop as Ctrl-C of `lehr queue start`: no queued experiment starts, and "
        "each running one saves a checkpoint and stops.",
        formatter_class=Help,
    )


def _cluster_args(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    submit = actions.add_parser(
        "submit",
        help="a sweep of experiments as a SLURM job array; waits and gathers them (docs/team.md)",
        description="Every combination of the -S values (DVC's sweeps: -S F:K=1,2) as one experiment, "
        "each a task of one SLURM job array, at most --at-once running. Each task clones the commit "
        "from the git remote onto shared storage (--folder), runs `lehr exp` there and pushes its "
        "experiment to the git and DVC remotes; this command waits and pulls them here (`lehr "
        "experiments` compares them). A requeued task resumes from its checkpoint. The working tree "
        "must be clean and its commit pushed.",
        formatter_class=Help,
    )
    submit.add_argument(
        "-S",
        "--set-param",
        dest="set",
        action="append",
        default=[],
        metavar="F:K=V",
        help="a param, or several values of it (a sweep), as `dvc exp run -S` takes them, e.g. "
        "conf/base/parameters_anneal.yml:anneal.decay_ratio=0.2,0.4",
    )
    submit.add_argument(
        "--ladder",
        nargs="?",
        const="all",
        metavar="SIZES",
        help="the ladder's rungs instead (all, or sizes: 1,3), each a task; DVC's run cache gathers them",
    )
    submit.add_argument("-n", "--name", help="the sweep's name; its experiments are NAME-1, NAME-2, ...")
    submit.add_argument("--partition", help="SLURM partition (default: the cluster's)")
    submit.add_argument("--account", help="SLURM account to charge")
    submit.add_argument("--time", type=int, default=240, help="each task's time limit, minutes")
    submit.add_argument("--gpus-per-task", type=int, default=0, help="GPUs for each task (0: a CPU run)")
    submit.add_argument("--cpus-per-task", type=int, default=1, help="cores for each task")
    submit.add_argument("--at-once", type=int, default=4, help="tasks running at once, at most")
    submit.add_argument(
        "--folder", default="build/cluster", help="on storage every node shares: the tasks' clones and logs"
    )
    submit.add_argument("--git-remote", default="origin", help="the git remote the tasks clone from")
    submit.add_argument("--no-wait", action="store_true", help="return once submitted; gather later")
    submit.add_argument(
        "--local", action="store_true", help="no SLURM: submitit runs the same tasks on this machine"
    )
    gather = actions.add_parser(
        "gather",
        help="wait for a sweep's tasks, then pull their experiments here",
        description="Wait for every task of a sweep submitted with --no-wait, then `dvc exp pull` "
        "each finished experiment from the git and DVC remotes.",
        formatter_class=Help,
    )
    gather.add_argument("folder", help="the sweep's folder, as `lehr cluster submit` printed it")


def _no_args(p: argparse.ArgumentParser) -> None:
    pass


def _mlflow_ui_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store", default="sqlite:///mlflow.db", help="the tracking store (conf/base/mlflow.yml's)"
    )
    _bind_args(p)


def _mlflow_server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--root", default="mlflow-server", help="the server's own folder: runs (mlflow.db) and artifacts"
    )
    _bind_args(p)
    p.add_argument(
        "--allowed-hosts",
        help="the names clients may call the server by (MLflow's --allowed-hosts; default beyond "
        "127.0.0.1: this machine's names and addresses)",
    )


def _bind_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="127.0.0.1: this machine only; another address opens it, unauthenticated, to all who reach it",
    )
    p.add_argument("--port", type=int, default=5000)


def _experiments_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--baseline", default="HEAD", help="the commit the experiments branched from")


def _sandbox_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dest", help="a folder that does not exist yet, or an earlier sandbox (replaced)")
    p.add_argument("--profile", default="smoke", help="the profile it runs: a folder of conf/")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier sandbox even if it holds commits or experiments",
    )
    p.add_argument(
        "--ladder",
        action="store_true",
        help="bring the ladder's stages (ladder/dvc.yaml) along: `dvc repro ladder/dvc.yaml` runs them there",
    )


def _prune_args(p: argparse.ArgumentParser) -> None:
    _env_arg(p)
    p.add_argument(
        "--unfinished", action="store_true", help="also runs that stopped part way (their progress is lost)"
    )
    p.add_argument("--yes", action="store_true", help="remove them; without it, only say what would go")


def _join_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("stage", help="pretrain_stable or anneal")
    _env_arg(p, "the one in conf/profile.yaml, which node 0 runs")
    p.add_argument(
        "--params", default="", help="node 0's --params, with this node's pretrain.launch.node_rank"
    )


# name: (what it does, its arguments, what runs it)
COMMANDS = {
    "corpus": ("lay out the bundled corpus in the raw layer", _corpus_args, _corpus),
    "branches": ("list the anneal branches", _branches_args, _branches),
    "info": ("provenance, progress and metrics of a checkpoint", _info_args, _info),
    "export": ("export a checkpoint for use outside lehr", _export_args, _export),
    "check": ("validate every stage's params under a profile without running anything", _env_arg, _check),
    "eval": ("score a checkpoint on a task file (JSONL: multiple choice or cloze)", _eval_args, _eval),
    "lm-eval": (
        'lm-evaluation-harness tasks on a checkpoint (pip install -e ".[lm-eval]")',
        _lm_eval_args,
        _lm_eval,
    ),
    "generate": ("sample text from a checkpoint, streamed to stdout", _generate_args, _generate),
    "ladder": ("predict held-out loss and bits per byte from the ladder's fit", _ladder_args, _ladder),
    "compare": (
        "the difference of two checkpoints per source and task, with paired 95% intervals",
        _compare_args,
        _compare,
    ),
    "exp": (
        "`dvc exp run` with every -S value checked first, each experiment relative to the same baseline",
        _exp_args,
        _exp,
    ),
    "experiments": (
        "every experiment of the baseline commit: changed params, figures, difference with its 95% interval",
        _experiments_args,
        _experiments,
    ),
    "queue": (
        "run DVC's queued experiments N at a time, each on its own share of the machine",
        _queue_args,
        _queue,
    ),
    "cluster": (
        "a sweep of experiments as a SLURM job array (submitit), gathered back here",
        _cluster_args,
        _cluster,
    ),
    "shares": ("who holds which share of this machine's cores and GPUs now", _no_args, _shares),
    "mlflow-ui": (
        "MLflow's UI on the project's store until Ctrl-C, all of it stopped then",
        _mlflow_ui_args,
        _mlflow_ui,
    ),
    "mlflow-server": (
        "one MLflow tracking server for a team (sqlite + artifacts in --root) until Ctrl-C",
        _mlflow_server_args,
        _mlflow_server,
    ),
    "sandbox": (
        "a throwaway copy of this project on a profile, as its own git + DVC repo",
        _sandbox_args,
        _sandbox,
    ),
    "runs": ("list the rolling run folders (resume points of each configuration)", _env_arg, _runs),
    "prune": ("remove rolling run folders that nothing in the workspace came from", _prune_args, _prune),
    "join": (
        "on node i > 0 of a run across machines: train its share (node 0 runs the stage)",
        _join_args,
        _join,
    ),
}


class Help(argparse.ArgumentDefaultsHelpFormatter):
    """An option's default where it has one to show and its help does not say it already;
    argparse %-formats every help, so a % in one (95% intervals) is a percent sign."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = (action.help or "").replace("%", "%%")
        default = action.default
        if default is None or default is False or default == "" or default is argparse.SUPPRESS:
            return text
        if "default" in text or not (action.option_strings or action.nargs in ("?", "*")):
            return text
        return f"{text} (default: %(default)s)"


REEXEC = "LEHR_WORKSPACE_CODE"  # set for the one re-run under the workspace's code


def run_the_workspaces_code(argv: list[str]) -> None:
    """At a lehr project's root, run that project's ``src/lehr``, as Kedro does for its stages.
    The ``lehr`` a virtualenv installed may be another checkout's (a sandbox shares the project's
    virtualenv), and an edit in this workspace would then not run while its records named it. So
    the command runs again with the workspace's ``src`` first; if that still imports another lehr,
    it is refused, naming both."""
    src = Path.cwd() / "src"
    if not (src / "lehr" / "__main__.py").is_file():
        return  # not at a lehr project's root: whichever lehr is installed is the one meant
    running = Path(__file__).resolve().parent
    if running == (src / "lehr").resolve():
        os.environ.pop(REEXEC, None)  # its children decide for themselves
        return
    if os.environ.get(REEXEC):
        raise SystemExit(
            f"lehr: error: this is the lehr in {running}, but the project here runs {src / 'lehr'}; with "
            f"PYTHONPATH={src} it still imported the other. Run the commands with this project's own "
            "virtualenv (make setup), or from the project the virtualenv belongs to."
        )
    pythonpath = os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))
    os.execve(
        sys.executable,
        [sys.executable, "-m", "lehr", *argv],
        {**os.environ, "PYTHONPATH": pythonpath, REEXEC: "1"},
    )


def main(argv: list[str] | None = None) -> int:
    from lehr.errors import VALIDATOR, Stopped, quiet_config_loader, quiet_errors, stop_on_signals

    quiet_config_loader()
    if argv is None:  # a command line, not a call from Python
        run_the_workspaces_code(sys.argv[1:])

    parser = argparse.ArgumentParser(
        prog="lehr",
        description="Small commands around the pipeline; Kedro runs its stages: kedro run --pipelines STAGE",
        formatter_class=Help,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (summary, add_arguments, run) in COMMANDS.items():
        p = sub.add_parser(name, help=summary, description=summary, formatter_class=Help)
        add_arguments(p)
        p.set_defaults(func=run)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["exp"] and argv[1:2] not in (["-h"], ["--help"]):
        # `lehr exp` hands its arguments to `dvc exp run` as they are (argparse would take -n, -S as its own).
        args = argparse.Namespace(func=_exp, dvc_args=argv[1:])
    else:
        args = parser.parse_args(argv)
    try:
        with stop_on_signals(), quiet_errors(VALIDATOR):
            return args.func(args)
    except Exception as e:
        message = explained(e)
        if message is None:
            raise
        for line in message.splitlines():  # one per parameter when several fail
            print(f"lehr: error: {line}", file=sys.stderr)
        return EXIT
    except (Stopped, KeyboardInterrupt) as e:
        stop = Stopped.of(e)
        print(f"lehr: {stop}", file=sys.stderr)
        return stop.exit_status


if __name__ == "__main__":
    raise SystemExit(main())
