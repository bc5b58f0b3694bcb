"""Compared experiments on top of DVC's: ``lehr exp`` runs ``dvc exp run`` so that each experiment
is relative to the workspace as it was (DVC leaves a workspace run's ``-S`` change in the params
file, and the next experiment would inherit it), after checking every ``-S`` value as the stages
would (DVC removes a stage's outputs before the stage can refuse one); ``lehr experiments``
reads every experiment of the baseline commit back from git (DVC keeps each as a commit under
``refs/exps``) as one compact table: its changed params, its headline figures, and its difference
from the baseline with a paired 95% interval on the same held-out windows and task examples.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

SWEEP = re.compile(r"^(choice|range)\((.*)\)$")
REPORTS = Path("data/08_reporting")


# -- the params a run would see ------------------------------------------------------------------
def load_parameters(conf: Path, env: str) -> dict:
    from kedro.config import OmegaConfigLoader

    loader = OmegaConfigLoader(
        conf_source=str(conf), base_env="base", default_run_env=env, merge_strategy={"parameters": "soft"}
    )
    return loader["parameters"]


def problems_of(project: Path, env: str, conf: Path | None = None) -> list[str]:
    """Every problem a stage would find with the params in ``conf`` (default: the project's), checked
    against the data the project has now."""
    from lehr.conf_visibility import untracked
    from lehr.params_check import check_all
    from lehr.project import catalog_paths
    from lehr.stage_checks import data_problems

    parameters = load_parameters(conf or project / "conf", env)
    paths = catalog_paths(project, env)
    problems = check_all(parameters) + data_problems(parameters, paths["corpus"], paths["shards"])
    return problems + untracked(project, env)


# -- -S values, as DVC reads them ----------------------------------------------------------------
def parse_set(arg: str) -> tuple[str, str, list]:
    """``file:key=value`` -> (file, key, [values]); a sweep (``choice(a,b)``, ``range(a,b,s)``) gives
    each of its values, the way ``dvc exp run --queue`` expands it."""
    target, sep, raw = arg.partition("=")
    path, colon, key = target.rpartition(":")
    if not sep or not colon or not key:
        raise ValueError(
            f"-S {arg}: write -S <params file>:<key>=<value>, e.g. -S conf/base/parameters_anneal.yml:"
            "anneal.shape=linear (lehr's params live in conf/<profile>/parameters_<stage>.yml, "
            "not in params.yaml)"
        )
    sweep = SWEEP.match(raw.strip())
    if sweep is None:
        return path, key, [yaml.safe_load(raw)]
    args = [yaml.safe_load(v) for v in sweep.group(2).split(",")]
    return path, key, args if sweep.group(1) == "choice" else list(range(*args))


def set_key(mapping: dict, key: str, value) -> None:
    *parents, last = key.split(".")
    for part in parents:
        mapping = mapping.setdefault(part, {})
    mapping[last] = value


def shadowed(project: Path, env: str, path: str, key: str) -> str | None:
    """The profile's file that sets ``key`` too, when ``path`` is conf/base's: there the change would be
    overruled, and the experiment would be the baseline under another name."""
    base = Path(path)
    if base.parts[:2] != ("conf", "base") or env == "base":
        return None
    over = project / "conf" / env / base.name
    node = yaml.safe_load(over.read_text()) if over.is_file() else None
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return str(over.relative_to(project))


def check_sets(project: Path, env: str, sets: list[str]) -> list[str]:
    """One line per ``-S`` value (each value of a sweep) that a stage would refuse, naming the ``-S``."""
    parsed = []
    for arg in sets:
        path, key, values = parse_set(arg)
        if not (project / path).is_file():
            return [f"-S {arg}: no params file {path}; the profile's files are conf/base/ and conf/{env}/"]
        over = shadowed(project, env, path, key)
        if over:
            return [
                f"-S {arg}: {over} sets {key} too, and the profile {env} overrules conf/base: write -S "
                f"{over}:{key}=..."
            ]
        parsed.append((arg, path, key, values))
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="lehr-exp-") as tmp:
        for combo in itertools.product(*[[(a, p, k, v) for v in vs] for a, p, k, vs in parsed]):
            conf = Path(tmp) / "conf"
            shutil.rmtree(conf, ignore_errors=True)
            shutil.copytree(project / "conf", conf)
            for _, path, key, value in combo:
                file = conf / Path(path).relative_to("conf")
                data = yaml.safe_load(file.read_text()) or {}
                set_key(data, key, value)
                file.write_text(yaml.safe_dump(data))
            said = ", ".join(f"-S {p}:{k}={v}" for _, p, k, v in combo)
            problems += [f"{p} (from {said})" for p in problems_of(project, env, conf)]
    return list(dict.fromkeys(problems))


# -- lehr exp -------------------------------------------------------------------------------------
def set_args(argv: list[str]) -> list[str]:
    out, it = [], iter(argv)
    for a in it:
        if a in ("-S", "--set-param"):
            out.append(next(it, ""))
        elif a.startswith("--set-param="):
            out.append(a.split("=", 1)[1])
    return out


def snapshot(project: Path) -> dict[Path, bytes]:
    """What a workspace experiment rewrites that DVC cannot check out again: the params files (and
    their YAML as written), dvc.lock and the reports git keeps."""
    files = [*project.glob("conf/**/*.yml"), project / "dvc.lock", *(project / REPORTS).glob("*")]
    return {f: f.read_bytes() for f in files if f.is_file()}


def restore(project: Path, before: dict[Path, bytes]) -> list[str]:
    """Every file of ``snapshot`` as it was; a report the run added goes. Returns what changed back."""
    back = []
    for f in [*project.glob("conf/**/*.yml"), project / "dvc.lock", *(project / REPORTS).glob("*")]:
        if f.is_file() and f not in before:
            f.unlink()
            back.append(str(f.relative_to(project)))
    for f, data in before.items():
        if not f.is_file() or f.read_bytes() != data:
            f.write_bytes(data)
            back.append(str(f.relative_to(project)))
    return back


def run(project: Path, env: str, argv: list[str]) -> int:
    """``dvc exp run ARGV`` after checking its ``-S`` values; a workspace run then puts the workspace
    back as it was (params as written, dvc.lock, reports and DVC's outputs), so the next experiment
    starts from the same baseline. The experiment itself lives on in git (``dvc exp apply NAME``)."""
    problems = check_sets(project, env, set_args(argv))
    if problems:
        for p in problems:
            print(f"lehr: error: {p}", file=sys.stderr)
        print("lehr: nothing ran, nothing changed", file=sys.stderr)
        return 2
    in_workspace = not {"--queue", "--temp"} & set(argv)
    before = snapshot(project)
    try:
        rc = subprocess.run(["dvc", "exp", "run", *argv], cwd=project).returncode
    finally:
        back = restore(project, before)
        if in_workspace and back:
            subprocess.run(["dvc", "checkout", "--force", "--quiet"], cwd=project, check=False)
    if in_workspace and rc == 0:
        print(
            "lehr: the workspace is back as it was (params, dvc.lock, reports, models), so the next "
            "experiment starts from the same baseline; `python -m lehr experiments` compares them, "
            "`dvc exp apply NAME` brings one into the workspace"
        )
    return rc


# -- lehr experiments -----------------------------------------------------------------------------
def git(project: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=project, capture_output=True, text=True, check=True).stdout


def show(project: Path, rev: str, path: str) -> str | None:
    out = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=project, capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def experiments_of(project: Path, baseline: str) -> list[tuple[str, str]]:
    """(name, commit) of every experiment DVC saved on ``baseline``, oldest first."""
    prefix = f"refs/exps/{baseline[:2]}/{baseline[2:]}/"
    refs = git(project, "for-each-ref", "--sort=committerdate", "--format=%(refname) %(objectname)", prefix)
    return [(ref[len(prefix) :], sha) for ref, sha in (line.split() for line in refs.splitlines())]


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
    metrics, items = (show(project, rev, str(REPORTS / f)) for f in ("metrics.json", "scored_items.json"))
    return (json.loads(metrics) if metrics else None), (json.loads(items) if items else None)


def difference_line(base_items: dict | None, items: dict | None) -> tuple[str, str]:
    """The held-out bits-per-byte difference with its interval, and the tasks that moved significantly."""
    from lehr.comparison import Scored, difference

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
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]
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
