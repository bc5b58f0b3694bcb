"""Compared experiments on top of DVC's: ``lehr exp`` runs ``dvc exp run`` so that each experiment
is relative to the workspace as it was (DVC leaves a workspace run's ``-S`` change in the params
file, and the next experiment would inherit it), after checking every ``-S`` value as the stages
would (DVC removes a stage's outputs before the stage can refuse one); ``lehr experiments``
reads every experiment of the baseline commit back from git (DVC keeps each as a commit under
``refs/exps``) as one compact table: its changed params, its headline figures, and its difference
from the baseline with a paired 95% interval on the same held-out windows and task examples.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from lehr.project.experiment_refs import experiment_ref, experiments_of, git, show


# -- -S values, as DVC reads them ----------------------------------------------------------------
def shadowed(project: Path, env: str, path: str, key: str) -> str | None:
    """Why a ``-S`` on ``path`` would change nothing the run reads: the profile's file sets ``key``
    too (it overrules conf/base), or ``path`` is a file the profile in force does not read."""
    parts = Path(path).parts
    if parts[:1] != ("conf",) or len(parts) != 3:
        return f"{path} is no params file of lehr's (conf/<profile>/parameters_<stage>.yml)"
    if parts[1] not in ("base", env):
        return f"{path} is not read under the profile {env} (it reads conf/base and conf/{env})"
    over = project / "conf" / env / parts[2]
    if parts[1] != "base" or env == "base" or not over.is_file():
        return None
    node = yaml.safe_load(over.read_text())
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return f"{over.relative_to(project)} sets {key} too, and the profile overrules conf/base: -S it there"


def check_sets(project: Path, env: str, sets: list[str]) -> list[str]:
    """One line per ``-S`` value (each value of a sweep) that a stage would refuse, naming the ``-S``.
    The values are DVC's own reading of them (its Hydra overrides and sweeps), applied to a copy."""
    from dvc.exceptions import InvalidArgumentError
    from dvc.utils.cli_parse import to_path_overrides
    from dvc.utils.hydra import apply_overrides, get_hydra_sweeps

    from lehr.params.check import load_parameters, problems_of
    from lehr.paths import branch_homes

    if not sets:
        return []
    path_overrides = to_path_overrides(sets)
    for path, overrides in path_overrides.items():
        for override in overrides:
            why = shadowed(project, env, path, override.partition("=")[0].lstrip("+~"))
            if why:
                return [f"-S {path}:{override}: {why}"]
    try:
        sweeps = get_hydra_sweeps(path_overrides)
    except (InvalidArgumentError, ValueError) as e:
        return [
            f"-S {' -S '.join(sets)}: {e} (DVC's -S grammar: https://hydra.cc/docs/advanced/override_grammar/basic/)"
        ]
    problems: list[str] = []
    by_hand = branch_homes(project, env)[1]
    with tempfile.TemporaryDirectory(prefix="lehr-exp-") as tmp:
        for combo in sweeps:
            conf = Path(tmp) / "conf"
            shutil.rmtree(conf, ignore_errors=True)
            shutil.copytree(project / "conf", conf)
            said = ", ".join(f"-S {path}:{o}" for path, os_ in combo.items() for o in os_)
            try:
                for path, overrides in combo.items():
                    apply_overrides(Path(tmp) / path, overrides)
            except (InvalidArgumentError, ValueError) as e:
                problems.append(f"{said}: {' '.join(str(e.__cause__ or e).split())}")
                continue
            problems += [f"{p} (from {said})" for p in problems_of(project, env, conf)]
            chosen = (load_parameters(conf, env).get("anneal") or {}).get("branch")
            if chosen and (by_hand / chosen).is_dir():
                problems.append(
                    f"parameter anneal.branch = {chosen!r} is a branch trained by hand "
                    f"({(by_hand / chosen).relative_to(project)}): an experiment's branch may not take its "
                    f"name; choose another (from {said})"
                )
    return list(dict.fromkeys(problems))


# -- lehr exp -------------------------------------------------------------------------------------
def set_args(argv: list[str]) -> list[str]:
    """The ``-S`` values of ``dvc exp run``'s arguments, however written (``-S v``, ``-Sv``,
    ``--set-param v``, ``--set-param=v``, or an abbreviation argparse accepts, ``--set v``)."""
    out, it = [], iter(argv)
    for a in it:
        name, eq, value = a.partition("=")
        if a == "-S" or (len(name) > 3 and "--set-param".startswith(name) and not eq):
            out.append(next(it, ""))
        elif a.startswith("-S"):
            out.append(a[2:])
        elif eq and len(name) > 3 and "--set-param".startswith(name):
            out.append(value)
    return out


def name_arg(argv: list[str]) -> str | None:
    """The experiment's name among ``dvc exp run``'s arguments (``-n N``, ``-nN``, ``--name[=]N``)."""
    for i, a in enumerate(argv):
        if a in ("-n", "--name"):
            return argv[i + 1] if i + 1 < len(argv) else None
        if a.startswith("--name="):
            return a.split("=", 1)[1]
        if a.startswith("-n") and not a.startswith("--"):
            return a[2:]
    return None


def taken_elsewhere(project: Path, names: list[str]) -> list[str]:
    """Experiments of these names on this baseline that a git remote already holds (another machine
    pushed them). Two machines' experiments of one name would be one ref: ``dvc exp push`` of the
    second says it "has diverged" and pushes nothing, yet exits 0. One question per remote, asked
    without a prompt (a remote that wants a password or does not answer is said so, and skipped)."""
    if not names:
        return []
    try:
        head = git(project, "rev-parse", "HEAD").strip()
        remotes = git(project, "remote").split()
    except subprocess.CalledProcessError:
        return []
    prefix = experiment_ref(head)
    quiet = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_SSH_COMMAND": "ssh -o BatchMode=yes"}
    taken = []
    for remote in remotes:
        try:
            out = subprocess.run(
                ["git", "ls-remote", remote, f"{prefix}*"],
                cwd=project,
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                env=quiet,
                timeout=60,
            )
        except subprocess.TimeoutExpired:
            print(
                f"lehr: note: git remote {remote!r} did not answer in 60 s: its names are unchecked",
                file=sys.stderr,
            )
            continue
        held = {line.split("\t")[1][len(prefix) :] for line in out.stdout.splitlines() if "\t" in line}
        for name in (n for n in names if n in held):
            here = subprocess.run(["git", "show-ref", "--quiet", prefix + name], cwd=project).returncode == 0
            fix = (
                "and here (pulled from it): choose another -n"
                if here
                else f"(pushed from another clone): choose another -n, or `dvc exp pull {remote} {name}` to "
                "have that one here"
            )
            taken.append(f"experiment name {name!r} is taken on git remote {remote!r} {fix}")
    return taken


def dvc_outputs(project: Path) -> tuple[list[Path], list[Path]]:
    """The outputs of dvc.yaml's stages: those DVC caches (a checkout puts them back) and those it
    does not (git keeps them: metrics, plots, reports)."""
    cached: list[Path] = []
    uncached: list[Path] = []
    for spec in yaml.safe_load((project / "dvc.yaml").read_text())["stages"].values():
        for key in ("outs", "metrics", "plots"):
            for entry in spec.get(key) or []:
                path, opts = next(iter(entry.items())) if isinstance(entry, dict) else (entry, {})
                if "${" in path:
                    continue
                (cached if (opts or {}).get("cache", True) else uncached).append(project / path)
    return cached, uncached


def unrecorded_outputs(project: Path) -> list[str]:
    """Cached outputs the workspace holds in another version than dvc.lock records: a workspace
    experiment checks them out as recorded first, so they would be lost (DVC's rule)."""
    out = subprocess.run(["dvc", "status", "--json"], cwd=project, capture_output=True, text=True)
    try:
        status = json.loads(out.stdout or "{}")
    except ValueError:
        return []
    cached = {str(p.relative_to(project)) for p in dvc_outputs(project)[0]}
    changed = []
    for entries in status.values():
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict):
                for path, state in (entry.get("changed outs") or {}).items():
                    if path in cached and state in ("modified", "not in cache"):
                        changed.append(path)
    return sorted(set(changed))


def snapshot(project: Path, sets: list[str]) -> dict[Path, bytes | None]:
    """What a workspace experiment rewrites that DVC cannot check out again: the params files it
    sets (DVC rewrites their YAML), dvc.lock and the outputs git keeps. None: the file was absent."""
    from dvc.utils.cli_parse import to_path_overrides

    files = [project / p for p in to_path_overrides(sets)] + [project / "dvc.lock", *dvc_outputs(project)[1]]
    return {f: f.read_bytes() if f.is_file() else None for f in files}


def restore(project: Path, before: dict[Path, bytes | None]) -> list[str]:
    """Every file of ``snapshot`` as it was. Returns those that had changed."""
    back = []
    for f, data in before.items():
        now = f.read_bytes() if f.is_file() else None
        if now != data:
            if data is None:
                f.unlink()
            else:
                f.write_bytes(data)
            back.append(str(f.relative_to(project)))
    return back


def run_to_the_end(cmd: list[str], cwd: Path) -> int:
    """``cmd`` in a process group of its own; a Ctrl-C or SIGTERM to lehr is passed to that group,
    and lehr waits for it to finish (a stage saves its checkpoint) before it restores anything."""
    child = subprocess.Popen(cmd, cwd=cwd, start_new_session=True)
    while True:
        try:
            return child.wait()
        except BaseException as stop:  # KeyboardInterrupt, or lehr's Stopped on SIGTERM
            sig = signal.SIGINT if isinstance(stop, KeyboardInterrupt) else signal.SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, sig)
            child.wait()
            raise


def run(project: Path, env: str, argv: list[str]) -> int:
    """``dvc exp run ARGV`` after checking its ``-S`` values; a workspace run then puts the workspace
    back as it was (the params files as written, dvc.lock, reports and DVC's outputs), so the next
    experiment starts from the same baseline. The experiment itself lives on in git."""
    sets = set_args(argv)
    problems = check_sets(project, env, sets)
    in_workspace = not {"--queue", "--temp", "--run-all"} & set(argv)
    unrecorded = unrecorded_outputs(project) if in_workspace else []
    if unrecorded:
        problems.append(
            f"{', '.join(unrecorded)} differ from what dvc.lock records (made by hand, e.g. by kedro run), "
            "and a workspace experiment checks the recorded version out first: record them (`dvc commit` "
            "and a git commit), or run the experiment with --queue or --temp"
        )
    name = name_arg(argv)
    problems += taken_elsewhere(project, [name] if name else [])
    if problems:
        for p in problems:
            print(f"lehr: error: {p}", file=sys.stderr)
        print("lehr: nothing ran, nothing changed", file=sys.stderr)
        return 2
    before = snapshot(project, sets)
    try:
        rc = run_to_the_end(["dvc", "exp", "run", *argv], project)
    finally:
        back = restore(project, before) if in_workspace else []
        # dvc.yaml's outputs only: the ladder's (ladder/dvc.yaml) are no experiment's business.
        checkout_cmd = ["dvc", "checkout", "--force", "--quiet", "dvc.yaml"]
        checkout = subprocess.run(checkout_cmd, cwd=project) if back else None
    if checkout is not None and checkout.returncode != 0:
        print(
            "lehr: error: `dvc checkout` could not put DVC's outputs back: run it yourself", file=sys.stderr
        )
        return checkout.returncode
    if in_workspace and rc == 0:
        print(
            "lehr: the workspace is back as it was (params, dvc.lock, reports, models), so the next "
            "experiment starts from the same baseline. `python -m lehr experiments` compares them; "
            f"`dvc exp apply {name or 'NAME'}` brings this one's params, models and branch back into the "
            "workspace"
        )
    return rc


# -- lehr experiments -----------------------------------------------------------------------------
def flat_params(project: Path, rev: str) -> dict[str, object]:
    """Every params file's keys at ``rev``, flattened: ``conf/base/parameters_anneal.yml:anneal.shape``."""
    out: dict[str, object] = {}
    for path in git(project, "ls-tree", "-r", "--name-only", rev, "conf").splitlines():
        if Path(path).name.startswith("parameters") and path.endswith((".yml", ".yaml")):
            stack = [("", yaml.safe_load(show(project, rev, path) or "") or {})]
            while stack:
                prefix, node = stack.pop()
                for k, v in node.items():
                    key = f"{prefix}{k}"
                    if isinstance(v, dict) and v:
                        stack.append((key + ".", v))
                    else:
                        out[f"{path}:{key}"] = v
    return out


def changed(base: dict, other: dict) -> list[str]:
    keys = sorted(k for k in base.keys() | other.keys() if base.get(k) != other.get(k))
    return [f"{k.split(':', 1)[1]}={other.get(k, '(removed)')}" for k in keys]


def figures(project: Path, rev: str) -> tuple[dict | None, dict | None]:
    from lehr.paths import catalog_files

    files = catalog_files(project)
    metrics, items = (show(project, rev, files[name]) for name in ("eval_metrics", "scored_items"))
    return (json.loads(metrics) if metrics else None), (json.loads(items) if items else None)


def difference_line(base_items: dict | None, items: dict | None) -> tuple[str, str]:
    """The held-out bits-per-byte difference with its interval, and the tasks that moved significantly."""
    from lehr.reports.comparison import Scored, difference

    if not (base_items and items):
        return "n/a (no scored_items.json: run it under this lehr)", ""
    base, other = Scored.from_record(base_items), Scored.from_record(items)
    if base.items != other.items:
        return "n/a (other held-out windows: other data or context)", ""
    d = difference(base, other)
    h = d["heldout"]["bpb"]
    verdict = ("better" if h["diff"] < 0 else "worse") if h["significant"] else "no sig. difference"
    moved = [
        f"{task}.{metric} {m['diff']:+.3f}"
        for task, ms in d.get("tasks", {}).items()
        for metric, m in ms.items()
        if m["significant"]
    ]
    return f"{h['diff']:+.4f} [{h['lo']:+.4f}, {h['hi']:+.4f}] {verdict}", ", ".join(moved) or "none"


def bpb(metrics: dict | None, model: str) -> str:
    if metrics is None:
        return "n/a"
    try:
        return f"{metrics[model]['heldout']['bpb']:.4f}"
    except (TypeError, KeyError):
        return "n/a"


def table(project: Path, baseline: str = "HEAD") -> str:
    base_rev = git(project, "rev-parse", baseline).strip()
    exps = experiments_of(project, base_rev)
    base_params = flat_params(project, base_rev)
    base_metrics, base_items = figures(project, base_rev)
    rows = [
        ("baseline " + base_rev[:7], "", bpb(base_metrics, "pre_anneal"), bpb(base_metrics, "anneal"), "", "")
    ]
    for name, sha in exps:
        metrics, items = figures(project, sha)
        diff, tasks = difference_line(base_items, items)
        change = ", ".join(changed(base_params, flat_params(project, sha))) or "(none)"
        rows.append((name, change, bpb(metrics, "pre_anneal"), bpb(metrics, "anneal"), diff, tasks))
    head = (
        "experiment",
        "changed params",
        "pre_anneal bpb",
        "anneal bpb",
        "anneal bpb - baseline [95%]",
        "tasks moved",
    )
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *rows]]
    lines.append(
        "held-out bits per byte (lower is better); the interval is a paired bootstrap over the same windows; "
        "tasks moved: accuracy differences whose 95% interval leaves out 0"
    )
    if not exps:
        lines.append(f"no experiments on {base_rev[:7]} yet: `python -m lehr exp -n NAME -S FILE:KEY=VALUE`")
    if base_metrics is None:
        lines.append(
            f"the baseline commit {base_rev[:7]} holds no metrics.json: run `dvc repro` and commit it"
        )
    return "\n".join(lines)
