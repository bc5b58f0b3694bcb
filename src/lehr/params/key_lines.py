"""Where a parameter is set: ``--params``, or the YAML file and line that gives it its value, so
that a message about a parameter names the place to change it."""

from __future__ import annotations

import re
from pathlib import Path

from lehr.errors.messages import shown

_KEY = re.compile(r"^(?:unknown )?parameter (?P<key>[A-Za-z0-9_.\-]+)")


def located(message: str, runtime_params: dict | None, conf: Path, env: str) -> str:
    """``message`` about a parameter, prefixed with where that parameter is set: ``--params``, or
    the YAML file and line under ``conf`` (``conf/smoke/parameters_anneal.yml:3``). Other messages,
    and a parameter set nowhere, are left as they are."""
    m = _KEY.match(message)
    where = m and where_set(m["key"].strip("."), runtime_params, conf, env)
    return f"{where}: {message}" if where else message


def where_set(key: str, runtime_params: dict | None, conf: Path, env: str) -> str | None:
    """Where the parameter ``key`` (``anneal.shape``, ``pretrain.stable_mix.gold``) gets its value:
    ``--params``, else the profile's YAML (which overrides base), else base's; for a key set nowhere
    (a missing one) the file that sets its nearest parent, base's first (where every key has its
    place). None when no file sets even its section."""
    path = key.split(".")
    if _given(runtime_params or {}, path):
        return "--params"
    files = {folder: _parameter_files(conf / folder) for folder in (env, "base")}
    for depth in range(len(path), 0, -1):
        order = (env, "base") if depth == len(path) else ("base", env)
        for f in (f for folder in order for f in files[folder]):
            line = _line_of(f, path[:depth])
            if line is not None:
                return f"{shown(f)}:{line}"
    return None


def _given(mapping: dict, path: list[str]) -> bool:
    """Whether ``mapping`` (``--params``, nested) sets the key at ``path``, or a value above it that
    is no mapping (``pretrain.stable_mix=x``: its keys are all of --params)."""
    for part in path:
        if not isinstance(mapping, dict):
            return True
        if part not in mapping:
            return False
        mapping = mapping[part]
    return True


def _parameter_files(folder: Path) -> list[Path]:
    """The files Kedro reads parameters from (its patterns parameters*, parameters*/**, **/parameters*)."""
    if not folder.is_dir():
        return []
    return sorted(
        f
        for f in folder.rglob("*")
        if f.suffix in (".yml", ".yaml")
        and f.is_file()
        and any(part.startswith("parameters") for part in f.relative_to(folder).parts)
    )


def _line_of(file: Path, path: list[str]) -> int | None:
    """The line (1-based) of the key at ``path`` in a YAML file, or None where the file does not set it."""
    import yaml

    try:
        node = yaml.compose(file.read_text())
    except (OSError, yaml.YAMLError):
        return None
    line = None
    for part in path:
        if not isinstance(node, yaml.MappingNode):
            return None
        found = next(((k, v) for k, v in node.value if getattr(k, "value", None) == part), None)
        if found is None:
            return None
        line, node = found[0].start_mark.line + 1, found[1]
    return line
