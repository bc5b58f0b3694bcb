"""Which code trained a run: a hash of the lehr modules a training process executes.

A checkpoint records it, so that a resume under code that computes something else is refused
instead of silently continuing (or silently keeping) weights that code never made.

What counts is the code as Python parses it, not its text: each module's syntax tree without
docstrings, line numbers or columns (comments never reach the tree). A comment, a docstring or a
reformatting leaves the hash as it was; a change to what any statement does changes it. And only
the modules a run can execute count: those reachable by imports from the training loop
(``lehr.engine.run.loop``), found statically, with the packages that hold them; a change to
``export`` or the CLI does not touch a training run's identity.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENTRY = "lehr.engine.run.loop"  # ``train`` lives here: everything a step computes is reachable from it
PACKAGE = "lehr"


@dataclass(frozen=True)
class CodeIdentity:
    sha256: str  # of every module's hash, in module order
    modules: dict[str, str]  # module -> sha256 of its syntax tree

    def as_record(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "modules": self.modules}


def differing(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """Modules whose code differs between two records (added, removed or changed), as file paths."""
    names = sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))
    return [module_path(n) for n in names]


def module_path(name: str) -> str:
    """``lehr.engine.model`` -> ``src/lehr/engine/model.py`` (as a person finds it in the repo)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return name.replace(".", "/") + ".py"
    parts = Path(spec.origin).parts
    return "/".join(parts[parts.index("src") :] if "src" in parts else parts[-3:])


@functools.cache
def of_training() -> CodeIdentity:
    """The identity of the code a training process runs (computed once per process)."""
    modules = {name: _tree_sha256(Path(origin)) for name, origin in sorted(_closure(ENTRY).items())}
    whole = hashlib.sha256("".join(f"{n}={h}\n" for n, h in modules.items()).encode()).hexdigest()
    return CodeIdentity(whole, modules)


def _closure(entry: str) -> dict[str, str]:
    """Module name -> source file of every ``lehr`` module reachable from ``entry`` by imports
    (anywhere in a file: an import inside a function may run too), and their parent packages."""
    found: dict[str, str] = {}
    todo = [entry]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        found[name] = spec.origin
        parent = name.rpartition(".")[0]
        if parent:
            todo.append(parent)
        todo += sorted(imported(Path(spec.origin), name))
    return found


def imported(path: Path, module: str) -> set[str]:
    """The ``lehr`` modules the source file ``path`` (the module ``module``) imports, anywhere in it
    (an import inside a function may run too), relative imports resolved; ``from a import b`` counts
    ``a.b`` when that is a module. The one rule for the code identity and the tests of stage deps."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if _ours(a.name)}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if _ours(base):
                found.add(base)
                found |= {f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}")}
    return found


def _ours(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _tree_sha256(path: Path) -> str:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree, include_attributes=False).encode()).hexdigest()
