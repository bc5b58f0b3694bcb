"""The layout keeps its promises: the engine imports nothing of Kedro, DVC or MLflow, no two
modules import each other (directly or round a longer circle, at any depth of a function), and a
training setting has one default, which the shipped base config shows as it is."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import yaml

from lehr.engine.artifacts.code_identity import imported
from lehr.engine.config import SHARED_PARTS, BranchConfig, Launch
from tests import ROOT

SRC = ROOT / "src"


def _imports(path: Path) -> set[str]:
    """Every ``lehr`` module this file imports, wherever the import statement stands (the code
    identity's rule: relative imports too)."""
    module = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
    return {m for m in imported(path, module) if _module_path(m)}


def _module_path(module: str) -> Path | None:
    base = SRC / module.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _graph() -> dict[str, set[str]]:
    modules = {
        ".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__"): p
        for p in SRC.rglob("*.py")
    }
    # A package's __init__ is not an edge back to its modules: importing one of them runs it first.
    return {m: {i for i in _imports(p) if i != m and not m.startswith(i + ".")} for m, p in modules.items()}


def test_no_module_imports_itself_round_a_circle():
    graph = _graph()
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import circles: {cycles}"


def test_the_engine_knows_nothing_of_kedro_dvc_or_mlflow():
    for path in (SRC / "lehr" / "engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert name.split(".")[0] not in ("kedro", "dvc", "mlflow"), (path, name)
                # The engine imports only the shared kit (config_parts, errors, files, tokens, versions).
                assert not name.startswith(
                    (
                        "lehr.pipelines",
                        "lehr.params",
                        "lehr.training",
                        "lehr.hooks",
                        "lehr.commands",
                        "lehr.project",
                        "lehr.paths",
                        "lehr.catalog",
                        "lehr.reports",
                        "lehr.dataprep",
                        "lehr.tracking",
                    )
                ), (path, name)


def test_every_training_setting_has_one_default_which_the_base_config_shows():
    """The engine's parts declare each default; conf/base lists every setting at that value, so a
    reader of the YAML sees every knob and no second default can drift from the first."""
    pretrain = yaml.safe_load((ROOT / "conf/base/parameters_pretrain_stable.yml").read_text())["pretrain"]
    anneal = yaml.safe_load((ROOT / "conf/base/parameters_anneal.yml").read_text())["anneal"]
    for part in (*SHARED_PARTS, Launch, BranchConfig):
        section, values = {
            Launch: ("pretrain.launch", pretrain["launch"]),
            BranchConfig: ("anneal", anneal),
        }.get(part, ("pretrain", pretrain))
        for f in dataclasses.fields(part):
            assert f.name in values, f"conf/base does not show {section}.{f.name}"
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            assert values[f.name] == default, (f.name, values[f.name], default)


def test_only_the_state_module_opens_a_checkpoints_state():
    """One reader of state.json (lehr.engine.artifacts.state): no other module builds its path or
    globs for it, so a new field, or an old checkpoint without one, is handled in one place."""
    home = SRC / "lehr/engine/artifacts/state.py"
    openers = []
    for path in sorted(SRC.rglob("*.py")):
        if path == home:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            joined = isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
            called = isinstance(node, ast.Call)
            operands = [node.right] if joined else node.args if called else []
            if any(
                isinstance(a, ast.Constant) and a.value in ("state.json", "state.json.sha256")
                for a in operands
            ):
                openers.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not openers, openers
