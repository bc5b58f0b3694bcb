"""Experiments side by side: the same two anneal-only experiments, queued and run one
after the other (``lehr queue start -j 1``: each stage on the whole machine, as before shares), then
two at once (``-j 2``: each on half the cores), in one run on one machine. It prints each way's wall
time and their ratio, each anneal's own time and bits per byte, and whether an experiment run beside
the other gives the same bytes as the same experiment alone on a share of the same size.

    python bench/parallel_queue.py                        # in a project whose `dvc repro` is committed
    python bench/parallel_queue.py --project build/smoke --key decay_ratio --values 0.2 0.4

The project must be clean (``git status``) with its pipeline up to date: the experiments change
one anneal setting (``anneal.shape``: linear and cosine, each as long as the default's anneal), so
each runs ``anneal`` and ``evaluate`` from the committed ``pre_anneal``. Wall time is the whole
``lehr queue start`` command, DVC's start-up included: what a person waits for. The bench's
experiments and their rolling folders are removed at the end (``--keep`` keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from lehr.project.experiment_refs import experiments_of, git, show
from lehr.project.queue import no_workers_left
from lehr.project.run_folders import Layout, remove, scan

ANNEAL = "conf/base/parameters_anneal.yml:anneal"
METRICS = "data/08_reporting/metrics.json"


def run(project: Path, *cmd: str, env: dict | None = None) -> str:
    out = subprocess.run(cmd, cwd=project, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        )
    return out.stdout


def queue(project: Path, prefix: str, key: str, values: list[str]) -> list[str]:
    """One experiment per value, each with a branch of its own: the same params would find the
    branch an earlier way trained, in the project's run folders, and train nothing."""
    names = [f"{prefix}-{v.replace('.', 'p')}" for v in values]
    for name, value in zip(names, values, strict=True):
        sets = ["-S", f"{ANNEAL}.{key}={value}", "-S", f"{ANNEAL}.branch={name}"]
        run(project, sys.executable, "-m", "lehr", "exp", "--queue", "-n", name, *sets)
    return names


def timed(project: Path, *cmd: str, env: dict | None = None) -> float:
    started = time.perf_counter()
    run(project, *cmd, env=env)
    return time.perf_counter() - started


def stage_seconds(log: str, stage: str) -> float | None:
    """The stage's own time, from its end line in the experiment's log."""
    found = re.search(rf"{stage}: done in (\d+) s", log)
    return float(found.group(1)) if found else None


def figures(metrics: str) -> dict:
    """The anneal's figures in metrics.json, without the branch's name (each way names its own)."""
    anneal = json.loads(metrics)["anneal"]
    return {k: v for k, v in anneal.items() if k != "branch"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--project", type=Path, default=Path("."), help="a lehr project, its pipeline run and committed"
    )
    ap.add_argument("--key", default="shape", help="the anneal setting the two experiments differ in")
    ap.add_argument(
        "--values",
        nargs=2,
        default=["linear", "cosine"],
        help="its two values (the default's: two anneals of one length, so neither waits for the other)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the bench's experiments afterwards")
    args = ap.parse_args()
    project = args.project.resolve()
    if run(project, "git", "status", "--porcelain", "--untracked-files=no").strip():
        raise SystemExit(
            f"{project} has uncommitted changes: experiments are relative to a commit; commit first"
        )
    head = git(project, "rev-parse", "HEAD").strip()
    lehr_queue = (sys.executable, "-m", "lehr", "queue", "start")

    sequential = queue(project, "par-seq", args.key, args.values)
    t_seq = timed(project, *lehr_queue, "-j", "1")
    together = queue(project, "par-j2", args.key, args.values)
    t_par = timed(project, *lehr_queue, "-j", "2")
    # The first experiment again, alone on the share it had beside the other (LEHR_JOBS=2, -j 1).
    (alone,) = queue(project, "par-alone", args.key, args.values[:1])
    no_workers_left(project)  # the -j 2 queue's lingering workers
    run(project, "dvc", "exp", "run", "--run-all", "-j", "1", env={"LEHR_JOBS": "2"})

    exps = dict(experiments_of(project, head))
    missing = [n for n in [*sequential, *together, alone] if n not in exps]
    if missing:
        raise SystemExit(f"experiment(s) {', '.join(missing)} failed: `dvc queue logs NAME` says why")
    names = [*sequential, *together, alone]
    logs = {n: run(project, "dvc", "queue", "logs", n) for n in names}
    reused = [n for n in names if "nothing trained" in logs[n]]
    if reused:
        raise SystemExit(f"{', '.join(reused)} trained nothing (an earlier run's folder): nothing measured")
    anneal = {n: figures(show(project, exps[n], METRICS)) for n in names}
    print(f"project {project} at {head[:7]}, {len(os.sched_getaffinity(0))} cores")
    print(f"{'experiment':18s} {'anneal s':>9s} {'evaluate s':>11s} {'anneal bpb':>11s}")
    for n in names:
        a, e = stage_seconds(logs[n], "anneal"), stage_seconds(logs[n], "evaluate")
        print(
            f"{n:18s} {a or float('nan'):9.0f} {e or float('nan'):11.0f} {anneal[n]['heldout']['bpb']:11.4f}"
        )
    print(f"one after the other (-j 1): {t_seq:7.0f} s")
    print(f"two at once (-j 2):         {t_par:7.0f} s")
    print(f"ratio (-j 2 / -j 1):        {t_par / t_seq:7.3f}")
    same = anneal[together[0]] == anneal[alone]
    print(
        f"{together[0]} beside the other, {alone} alone on its share: the anneal's figures "
        f"{'identical' if same else 'DIFFERENT'} (metrics.json)"
    )
    if not args.keep:  # its experiments and their rolling folders, which live in the project
        run(project, "dvc", "exp", "remove", *sequential, *together, alone)
        runs = project / "data/06_models/anneal_runs"
        for folder in scan(Layout(project / "nowhere", project / "nowhere", runs, ())):
            if folder.path.name.rsplit("-", 1)[0] in names:
                remove(folder)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
