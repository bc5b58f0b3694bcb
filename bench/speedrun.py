"""Benchmark: the wall time the training stages take to reach the default run's quality, today's
default against a candidate, side by side in one run.

    python bench/speedrun.py                                  # HEAD against the frozen default
    python bench/speedrun.py --candidate my-branch \
        -S conf/base/parameters_pretrain_stable.yml:pretrain.lr=0.008
    python bench/speedrun.py --rounds 2 --at-budget           # and the default cut to the budget

Each arm is a commit, run from a git worktree of its own under build/speedrun/: the default is
frozen as ``BASELINE`` (so that after a candidate is adopted, the baseline stays what it was), the
candidate is a commit (HEAD by default) with ``-S`` settings on top. Each round runs every arm from
a clean start, one after the other, in alternating order: the training stages as `dvc repro` runs
them (``dvc repro --single-item --force pretrain_stable``, then ``anneal``: start-up, DVC's
hashing and caching included), on this checkout's stage inputs (shards and tasks), which each
arm's dvc.lock must record as its own.

Quality is the anneal branch's held-out bits per byte on evaluate's windows (64 per source), of
the weights evaluate scores (final, or best after an early stop), measured by this checkout's code
for every arm. The target is the committed default's (the default commit's metrics.json) on the
local profile, else the default arm's own; bits per byte compare at the four digits reports print.
A candidate that ends above the target is not a faster run, and is named so. A commit from
before saves were timed shows its save share as n/a.

Each arm's round compiles into an empty torch cache (``TORCHINDUCTOR_CACHE_DIR`` under
build/speedrun/inductor/): a compiled stable stage pays its compile as on a fresh machine, and the
anneal reuses it, as a fresh clone's `make run` does.

Per arm (medians over rounds): each stage's seconds, tok/s of the training steps, the eval,
checkpoint and compile shares of each stage's time, and the share of this CPU's bf16 matmul the steps reach;
then the candidate's time over the default's, against the budget (``--budget``: 60%). With
``--at-budget``, a third arm runs the default with its planned steps cut to the budget: what plain
truncation reaches in that time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from lehr.engine.artifacts.checkpoint import verify as load_state
from lehr.engine.batches import ShardSet
from lehr.engine.evals.evaluation import HeldOut, evaluate, load_model
from lehr.engine.hardware import resolve
from train_loop import matmul_flops

ROOT = Path(__file__).resolve().parents[1]
# Today's default, frozen: the commit whose `make run` took 523 s of training stages on the 2-core
# AVX512-BF16 machine (2026-12-05) and ended at 1.6879 held-out bits per byte.
BASELINE = "66892395b7989426b9f62d098f5ec3fb9dfe58da"
STAGES = ("pretrain_stable", "anneal")
EPILOG = """On the 2-core CPU of docs/benchmarks.md a round of the default profile takes about 18 minutes
(two arms of about 9), and --at-budget adds about 5. It needs this checkout's shard stage built
(`make run`) and arms whose dvc.lock records the same shards. It leaves build/speedrun/logs/
<arm>-round<N>.log (replaced by the next run); the worktrees and compile caches are removed. A
bad -S is found when its arm starts."""
INPUTS = ("shards", "heldout_tasks")  # catalog entries the training stages read from the shard stage
METRICS = "data/08_reporting/metrics.json"
MARKER = ".speedrun-worktree"


@dataclass(frozen=True)
class Arm:
    name: str
    ref: str
    sets: tuple[str, ...] = ()


@dataclass
class Result:
    seconds: dict[str, float]  # stage -> wall seconds of its command
    bpb: float
    tok_s: float
    shares: dict[str, dict[str, float]]  # stage -> {"eval": share, "save": share}
    flop_s: float
    log: Path

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def git(project: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=project, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} in {project} exited {out.returncode}: {out.stderr.strip()}")
    return out.stdout.strip()


def worktree(project: Path, ref: str, folder: Path) -> Path:
    """A fresh worktree of ``ref``; an earlier one this bench made there is removed first."""
    if folder.exists():
        if not (folder / MARKER).is_file():
            raise SystemExit(
                f"{folder} exists and is not a speedrun worktree: remove it or pass --work elsewhere"
            )
        git(project, "worktree", "remove", "--force", str(folder))
    # --force: a folder of ours deleted by hand is still registered; only that entry is replaced.
    git(project, "worktree", "add", "--force", "--detach", str(folder), ref)
    (folder / MARKER).write_text("made by bench/speedrun.py; the next run replaces it\n")
    return folder


def apply_settings(folder: Path, sets: tuple[str, ...]) -> None:
    """``FILE:KEY.PATH=VALUE`` as `dvc exp run -S` takes it, VALUE read as YAML; a key the file
    lacks is added (lehr refuses one it does not know, by name, when the stage starts)."""
    for item in sets:
        try:
            file, rest = item.split(":", 1)
            key, value = rest.split("=", 1)
        except ValueError:
            raise SystemExit(
                f"-S {item!r}: expected FILE:KEY=VALUE, e.g. "
                "conf/base/parameters_pretrain_stable.yml:pretrain.lr=0.008"
            ) from None
        path = folder / file
        if not path.is_file():
            raise SystemExit(f"-S {item!r}: no file {file} at the candidate's commit")
        data = yaml.safe_load(path.read_text()) or {}
        node = data
        for part in key.split(".")[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SystemExit(f"-S {item!r}: {part} in {file} is not a mapping")
        node[key.split(".")[-1]] = yaml.safe_load(value)
        path.write_text(yaml.safe_dump(data, sort_keys=False))


def lock_outs(folder: Path, stage: str = "shard") -> dict[str, str]:
    lock = yaml.safe_load((folder / "dvc.lock").read_text())
    return {o["path"]: o["md5"] for o in lock["stages"][stage]["outs"]}


def profile_of(folder: Path) -> str:
    return yaml.safe_load((folder / "conf/profile.yaml").read_text())["profile"]


def bring_inputs(project: Path, folder: Path, profile: str) -> None:
    from lehr.paths import catalog_paths

    here, there = catalog_paths(project, profile), catalog_paths(folder, profile)
    for name in INPUTS:
        shutil.copytree(here[name], there[name], dirs_exist_ok=True)


def timing_of(run_dir: Path) -> dict[str, float]:
    seconds: dict[str, float] = {}
    tokens = 0.0
    for line in (run_dir / "timing.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("seconds") is None:
            continue
        seconds[rec["kind"]] = seconds.get(rec["kind"], 0.0) + rec["seconds"]
        if rec["kind"] == "train" and rec.get("tok_per_s"):
            tokens += rec["tok_per_s"] * rec["seconds"]
    return {**seconds, "tokens": tokens}


def only_child(folder: Path) -> Path:
    children = [p for p in folder.iterdir() if p.is_dir()]
    if len(children) != 1:
        raise SystemExit(f"expected one run in {folder}, found {len(children)}")
    return children[0]


def run_arm(arm: Arm, project: Path, work: Path, windows: int, round_: int) -> Result:
    from lehr.engine.model import ModelConfig, Transformer
    from lehr.paths import branch_homes, catalog_paths
    from lehr.pipelines.evaluate.scoring import scored_weights

    folder = worktree(project, arm.ref, work / arm.name)
    apply_settings(folder, arm.sets)
    profile = profile_of(project)
    (folder / "conf/profile.yaml").write_text(f"profile: {profile}\n")
    if lock_outs(folder) != lock_outs(project):
        raise SystemExit(
            f"{arm.name} ({arm.ref}) records other shards in its dvc.lock than this checkout's: its "
            f"training stages would read inputs it was not built for. Run the bench from a checkout "
            f"whose shard stage matches, or compare commits that share one"
        )
    bring_inputs(project, folder, profile)
    env = {
        **os.environ,
        "PYTHONPATH": str(folder / "src"),  # the arm's code, not this checkout's editable install
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "KEDRO_DISABLE_TELEMETRY": "1",
        "DVC_NO_ANALYTICS": "1",
        # An empty compile cache for each arm's round: the stable stage compiles as on a fresh
        # machine, and the anneal reuses what it compiled, as a fresh clone's `make run` does.
        "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor" / f"{arm.name}-round{round_}"),
    }
    log = work / "logs" / f"{arm.name}-round{round_}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    seconds = {}
    with open(log, "w") as out:
        for stage in STAGES:
            cmd = ["dvc", "repro", "--single-item", "--force", stage]
            began = time.perf_counter()
            rc = subprocess.run(cmd, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
            seconds[stage] = time.perf_counter() - began
            if rc != 0:
                raise SystemExit(f"{arm.name}: `{' '.join(cmd)}` exited {rc}; its log: {log}")
    paths = catalog_paths(folder, profile)
    runs = {"pretrain_stable": only_child(paths["stable_run"]), "anneal": only_child(paths["anneal_runs"])}
    clocks = {stage: timing_of(d) for stage, d in runs.items()}
    # A commit from before saves were timed has no save records: its share is unknown, not 0. A
    # compile record is the first step of a compiled run; without one the run compiled nothing
    # (or its first log window holds the compile: commits from before it was timed).
    shares = {
        stage: {
            kind: clocks[stage][kind] / seconds[stage] for kind in ("eval", "save") if kind in clocks[stage]
        }
        | {"compile": clocks[stage].get("compile", 0.0) / seconds[stage]}
        for stage in STAGES
    }
    train_s = sum(c.get("train", 0.0) for c in clocks.values())
    tokens = sum(c["tokens"] for c in clocks.values())
    # What evaluate scores: the branch's final weights, or its best if it stopped early.
    _, weights = scored_weights(only_child(branch_homes(folder, profile)[0]))
    hw = resolve("auto", "auto", None)
    model = load_model(weights, hw.device)
    shards = ShardSet(paths["shards"], model.cfg.vocab_size, model.cfg.seq_len)
    held = HeldOut.build(shards.heldout(), model.cfg.seq_len, windows)
    bpb = evaluate(model, held, hw, micro_batch=8)["heldout"]["bpb"]
    flops_per_token = Transformer(ModelConfig(**load_state(weights)["config"]["model"])).flops_per_token()
    tok_s = tokens / train_s if train_s else 0.0
    return Result(seconds, bpb, tok_s, shares, tok_s * flops_per_token, log)


def setting(project: Path, ref: str, profile: str, stage: str, key: str) -> tuple[str, object]:
    """The file that sets ``key`` (section.name) of ``stage``'s params for ``profile`` at ``ref``
    (the profile's file, else base's), and its value."""
    section, name = key.split(".")
    for file in (f"conf/{profile}/parameters_{stage}.yml", f"conf/base/parameters_{stage}.yml"):
        shown = subprocess.run(["git", "show", f"{ref}:{file}"], cwd=project, capture_output=True, text=True)
        params = (yaml.safe_load(shown.stdout) or {}).get(section) or {} if shown.returncode == 0 else {}
        if name in params:
            return file, params[name]
    raise SystemExit(f"no {key} in parameters_{stage}.yml for the {profile} profile at {ref}")


def target_of(project: Path, default: Arm, profile: str, windows: int, measured: float) -> tuple[float, str]:
    """The committed default's figure where it was measured as this bench measures (the local
    profile, evaluate's windows), else the default arm's own."""
    if (
        profile == "local"
        and windows == setting(project, default.ref, profile, "evaluate", "evaluate.eval_windows")[1]
    ):
        committed = json.loads(git(project, "show", f"{default.ref}:{METRICS}"))
        return committed["anneal"]["heldout"][
            "bpb"
        ], f"the committed default's ({default.ref[:10]}'s {METRICS})"
    return measured, "the default arm's own (no committed figure measured this way)"


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--project", type=Path, default=ROOT, help="the checkout whose git repo and stage inputs are used"
    )
    ap.add_argument("--baseline", default=BASELINE, help="the default's commit (default: %(default).10s)")
    ap.add_argument(
        "--candidate",
        default="HEAD",
        help="the candidate's commit or branch (default: %(default)s): commit a change first, or use -S",
    )
    ap.add_argument(
        "-S",
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="FILE:KEY=VALUE",
        help="a setting of the candidate's on top of its commit (repeat for more)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="each arm once a round, in alternating order (default: %(default)s)",
    )
    ap.add_argument(
        "--budget",
        type=float,
        default=0.6,
        help="the candidate's time allowed, of the default's (%(default)s)",
    )
    ap.add_argument(
        "--at-budget", action="store_true", help="a third arm: the default with its steps cut to the budget"
    )
    ap.add_argument("--windows", type=int, help="held-out windows per source scored (default: evaluate's)")
    ap.add_argument(
        "--work", type=Path, default=None, help="where the worktrees and logs go (default: build/speedrun)"
    )
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning, module="kedro")  # at every catalog read
    project = args.project.resolve()
    work = (args.work or project / "build/speedrun").resolve()
    torch.set_num_threads(os.cpu_count() or 1)
    arms = [
        Arm("default", git(project, "rev-parse", args.baseline)),
        Arm("candidate", git(project, "rev-parse", args.candidate), tuple(args.sets)),
    ]
    profile = profile_of(project)
    windows = args.windows or int(
        setting(project, arms[0].ref, profile, "evaluate", "evaluate.eval_windows")[1]
    )
    if args.at_budget:
        file, planned = setting(project, arms[0].ref, profile, "pretrain_stable", "pretrain.planned_steps")
        cut = f"{file}:pretrain.planned_steps={round(planned * args.budget)}"
        arms.append(Arm("default-at-budget", arms[0].ref, (cut,)))
    peak = matmul_flops(torch.bfloat16, torch.device("cpu"), seconds=2.0)
    print(f"speedrun: {args.rounds} round(s), profile {profile}, {os.cpu_count()} cores; ", end="")
    print(f"this CPU's bf16 matmul: {peak / 1e9:.0f} GFLOP/s")
    results: dict[str, list[Result]] = {arm.name: [] for arm in arms}
    try:
        for r in range(args.rounds):
            for arm in arms if r % 2 == 0 else arms[::-1]:
                res = run_arm(arm, project, work, windows, r + 1)
                results[arm.name].append(res)
                where = res.log.relative_to(work)
                print(
                    f"  round {r + 1} {arm.name}: {res.total:.1f} s, {res.bpb:.4f} bpb ({where})", flush=True
                )
    finally:  # the worktrees and compile caches are ours and throwaway; the logs stay
        for arm in arms:
            if (work / arm.name / MARKER).is_file():
                git(project, "worktree", "remove", "--force", str(work / arm.name))
        shutil.rmtree(work / "inductor", ignore_errors=True)
    measured = median([x.bpb for x in results["default"]])
    target, source = target_of(project, arms[0], profile, windows, measured)
    print(f"\ntarget: {target:.4f} held-out bits per byte on {windows} windows per source, {source}")
    report(arms, results, peak)
    default = median([x.total for x in results["default"]])
    for arm in arms[1:]:
        total, bpb = median([x.total for x in results[arm.name]]), median([x.bpb for x in results[arm.name]])
        reached = round(bpb, 4) <= round(target, 4)
        verdict = (
            f"reaches the target in {total / default:.1%} of the default's time"
            if reached
            else f"ends above the target ({bpb:.4f} > {target:.4f}): not a faster run"
        )
        within = "within" if reached and total <= args.budget * default else "outside"
        print(f"ratio ({arm.name} / default): {total / default:.3f}: {verdict}; ", end="")
        print(f"{within} the budget of {args.budget:.0%} ({args.budget * default:.0f} s)")
    print(f"logs: {work / 'logs'}")
    return 0


def report(arms: list[Arm], results: dict[str, list[Result]], peak: float) -> None:
    """One row per arm, medians over the rounds; shares are of each stage's own time (stable/anneal)."""
    columns = (
        "arm",
        "commit",
        "stable s",
        "anneal s",
        "total s",
        "bpb",
        "tok/s",
        "eval %",
        "save %",
        "compile %",
        "bf16 mm",
    )
    rows = [columns]
    for arm in arms:
        rs = results[arm.name]

        def shares(kind: str, rs: list[Result] = rs) -> str:
            return "/".join(
                f"{100 * median([x.shares[s][kind] for x in rs]):.1f}" if kind in rs[0].shares[s] else "n/a"
                for s in STAGES
            )

        rows.append(
            (
                arm.name + ("*" if arm.sets else ""),
                arm.ref[:10],
                *(f"{median([x.seconds[s] for x in rs]):.1f}" for s in STAGES),
                f"{median([x.total for x in rs]):.1f}",
                f"{median([x.bpb for x in rs]):.4f}",
                f"{median([x.tok_s for x in rs]):,.0f}",
                shares("eval"),
                shares("save"),
                shares("compile"),
                f"{median([x.flop_s for x in rs]) / peak:.1%}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    for row in rows:
        print(
            "  ".join(
                cell.ljust(w) if i < 2 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    print("  eval %, save %, compile %: of each stage's own time, stable/anneal; bf16 mm: the training")
    print("  steps' FLOP/s (a compiling first step left out) over this CPU's bf16 matmul")
    for arm in arms:
        if arm.sets:
            print(f"  * {arm.name}: {', '.join(arm.sets)}")


if __name__ == "__main__":
    sys.exit(main())
