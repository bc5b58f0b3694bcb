"""Typed config parts: a frozen dataclass per part whose fields declare each setting once, with
its type, default and check, and errors that name the setting and what to do.

The engine's run config (``lehr.engine.config``), the training stages' params and the data
stages' params are all built from these, so the data stages validate theirs the same way
without depending on the training engine.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass
from typing import Any, ClassVar, Literal, Union

SEED_LIMIT = 2**32  # numpy's generators take seeds below this


class ConfigError(ValueError):
    """A setting with a wrong type, out of range, or unknown. ``key`` is its name below the config
    that raised it, so a caller that knows where the setting came from can name it in full
    (``pretrain.launch.nnodes``): see ``within`` and ``from_mapping``."""

    def __init__(self, key: str, value: Any = None, problem: str = "", known: list[str] | None = None):
        self.key, self.value, self.problem, self.known = key, value, problem, known
        super().__init__(self.describe())

    def describe(self, prefix: str = "") -> str:
        if self.known is not None:
            parent, _, name = self.key.rpartition(".")
            close = difflib.get_close_matches(name, self.known, n=1, cutoff=0.75)  # typos, not guesses
            guess = f" (did you mean {close[0]}?)" if close else ""
            return (
                f"unknown {prefix}{self.key}{guess}; the keys of {parent or 'this config'} are: "
                f"{', '.join(self.known)}"
            )
        if self.value is MISSING:
            return f"{prefix}{self.key} {self.problem}"
        return f"{prefix}{self.key} = {self.value!r} {self.problem}"

    def within(self, section: str) -> ConfigError:
        return ConfigError(f"{section}.{self.key}", self.value, self.problem, self.known)


def require(ok: bool, key: str, value: Any, problem: str) -> None:
    if not ok:
        raise ConfigError(key, value, problem)


def require_positive(cfg: Any, *keys: str) -> None:
    for key in keys:
        require(getattr(cfg, key) > 0, key, getattr(cfg, key), "must be positive")


def require_seed(key: str, value: int) -> None:
    require(
        0 <= value < SEED_LIMIT, key, value, f"is out of range: use 0 <= {key.rsplit('.', 1)[-1]} < 2**32"
    )


def check_mix(mix: Any, key: str) -> None:
    """A data mix: a non-empty {tier: weight}, every weight a positive number (leave a tier out
    rather than give it 0)."""
    require(
        isinstance(mix, dict) and bool(mix), key, mix, "must be a mapping of tier: weight, e.g. {gold: 1.0}"
    )
    for tier, weight in mix.items():
        ok = (
            isinstance(weight, (int, float))
            and not isinstance(weight, bool)
            and weight > 0
            and weight == weight
        )
        require(ok, f"{key}.{tier}", weight, "must be a positive number (leave a tier out to not use it)")


def type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(type_ok(value, h) for h in typing.get_args(hint))
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, dict)
    if origin is Literal:
        return value in typing.get_args(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return isinstance(value, (hint, dict))
    return isinstance(value, hint)


def _expected(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return f"must be one of {', '.join(map(str, typing.get_args(hint)))}"
    name = getattr(hint, "__name__", None) if not typing.get_args(hint) else None
    return f"has the wrong type: expected {name or hint}".replace("typing.", "")


def refuse_keys(cls: type, given: dict) -> None:
    """A renamed key, naming its new name, then an unknown one, naming the known ones (a typo must
    not fall back to a default), then a missing one: before the dataclass's ``__init__``, whose
    refusal would only say "unexpected keyword argument"."""
    fields = [f for f in dataclasses.fields(cls) if f.init]
    renamed = renames(cls)
    for old in sorted(given.keys() & renamed.keys()):
        raise ConfigError(old, given[old], f"was renamed: write {renamed[old]} instead (the same setting)")
    known = sorted(f.name for f in fields)
    unknown = sorted(given.keys() - set(known))
    if unknown:
        raise ConfigError(unknown[0], known=known)
    for f in fields:
        if f.name not in given and f.default is MISSING and f.default_factory is MISSING:
            raise ConfigError(f.name, MISSING, "is missing: give it a value (it has no default)")


def renames(cls: type) -> dict[str, str]:
    """Each field's ``renamed_from`` (``setting``) -> the field: a part's renamed key is refused in
    every config composed of it, unless a field has taken the old name again."""
    fields = dataclasses.fields(cls)
    names = {f.name for f in fields}
    return {
        f.metadata["renamed_from"]: f.name
        for f in fields
        if "renamed_from" in f.metadata and f.metadata["renamed_from"] not in names
    }


def setting(
    default: Any = MISSING,
    *,
    factory: Callable[[], Any] | None = None,
    resumable: bool = False,
    off: Any = MISSING,
    used_if: Callable[[Any], bool] | None = None,
    renamed_from: str | None = None,
) -> Any:
    """A field that declares, beside its default, what the config's rules must know of it:

    - ``resumable``: a resumed run may change it; it is left out of the math hash that an exact
      resume must match.
    - ``off``: its value that means "not in use". At that value the field is left out of the math
      hash and of a branch name's digest, as it was in the runs made before the field existed, so
      their checkpoints still resume and their folders keep their names.
    - ``used_if``: the field is in use only when this holds of the config (Muon's settings under
      Muon); otherwise it is left out as if off.
    - ``renamed_from``: the key it had before; that key is refused, naming this one.
    """
    meta: dict[str, Any] = {}
    if resumable:
        meta["resumable"] = True
    if off is not MISSING:
        meta["off"] = off
    if used_if is not None:
        meta["used_if"] = used_if
    if renamed_from is not None:
        meta["renamed_from"] = renamed_from
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def resumable(cls: type) -> frozenset[str]:
    """The fields of a config dataclass that a resumed run may change (``setting(resumable=True)``)."""
    return frozenset(f.name for f in dataclasses.fields(cls) if f.metadata.get("resumable"))


def not_in_use(cfg: Any) -> set[str]:
    """The fields of a config dataclass at their "not in use" value, or unused under the rest of
    the config (``setting``'s ``off`` and ``used_if``)."""
    out = set()
    for f in dataclasses.fields(cfg):
        meta = f.metadata
        if ("off" in meta and getattr(cfg, f.name) == meta["off"]) or (
            "used_if" in meta and not meta["used_if"](cfg)
        ):
            out.add(f.name)
    return out


def build(cls: type, mapping: dict) -> Any:
    """``cls(**mapping)``, refusing unknown, renamed and missing keys by name (a ``Part`` does that
    itself, whichever way it is constructed; any other dataclass here)."""
    refuse_keys(cls, mapping)
    return cls(**mapping)


def from_mapping(cls: type, mapping: dict, section: str) -> Any:
    """``build`` for a section of the stage params: every error names the full key and what to do."""
    try:
        return build(cls, mapping)
    except ConfigError as e:
        raise ValueError(e.within(section).describe("parameter ")) from None


@dataclass(frozen=True, kw_only=True)
class Part:
    """Base of every config part: types checked, nested mappings made dataclasses, then the
    ``check`` of each class along the inheritance chain (so a composed config checks every part)."""

    def __new__(cls, *args, **kwargs):
        # Kedro builds a stage's params as cls(**mapping): the keys are refused here, by name. Without
        # keywords (copy and pickle make the object first, then its fields) there is nothing to check.
        if kwargs and not args:
            refuse_keys(cls, kwargs)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value, hint = getattr(self, f.name), hints[f.name]
            require(type_ok(value, hint), f.name, value, _expected(hint))
            if isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, dict):
                try:
                    object.__setattr__(self, f.name, build(hint, value))
                except ConfigError as e:
                    raise e.within(f.name) from None
        for cls in reversed(type(self).__mro__):
            if "check" in vars(cls):
                vars(cls)["check"](self)

    def part(self, cls: type) -> dict:
        """The values of ``cls``'s fields: how a composed config hands a part on."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(cls)}


@dataclass(frozen=True, kw_only=True)
class Section(Part):
    """The params under one top-level key of the YAML: errors name the key in full
    (``parameter pretrain.lr = 0 must be positive``)."""

    SECTION: ClassVar[str]

    def __new__(cls, *args, **kwargs):
        try:
            return super().__new__(cls, *args, **kwargs)
        except ConfigError as e:
            raise ValueError(e.within(cls.SECTION).describe("parameter ")) from None

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ConfigError as e:
            raise ValueError(e.within(self.SECTION).describe("parameter ")) from None
