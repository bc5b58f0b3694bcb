"""Typed config parts: a frozen dataclass per part whose fields declare each setting once, with
its type, default and check, and errors that name the setting and what to do.

The engine's run config (``lehr.engine.config``), the training stages' params and the data
stages' params are all built from these, so the data stages validate theirs the same way
without depending on the training engine.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
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
            parent = self.key.rsplit(".", 1)[0] if "." in self.key else "this config"
            return f"unknown {prefix}{self.key}; the keys of {parent} are: {', '.join(self.known)}"
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
    if dataclasses.is_dataclass(hint):
        return isinstance(value, (hint, dict))
    return isinstance(value, hint)


def _expected(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return f"must be one of {', '.join(map(str, typing.get_args(hint)))}"
    name = getattr(hint, "__name__", None) if not typing.get_args(hint) else None
    return f"has the wrong type: expected {name or hint}".replace("typing.", "")


def build(cls: type, mapping: dict) -> Any:
    """``cls(**mapping)``, refusing unknown keys by name (a typo must not fall back to a default)."""
    known = sorted(f.name for f in dataclasses.fields(cls))
    unknown = sorted(set(mapping) - set(known) - set(getattr(cls, "RENAMED", {})))
    if unknown:
        raise ConfigError(unknown[0], known=known)
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

    RESUMABLE: ClassVar[frozenset] = frozenset()  # fields a resumed run may change
    RENAMED: ClassVar[dict[str, str]] = {}  # an old key -> its new name; the old one is refused

    def __new__(cls, *args, **kwargs):
        # Before the dataclass's __init__, whose refusal would only say "unexpected keyword".
        for old in sorted(kwargs.keys() & cls.RENAMED.keys()):
            raise ConfigError(
                old, kwargs[old], f"was renamed: write {cls.RENAMED[old]} instead (the same setting)"
            )
        return super().__new__(cls)

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value, hint = getattr(self, f.name), hints[f.name]
            require(type_ok(value, hint), f.name, value, _expected(hint))
            if dataclasses.is_dataclass(hint) and isinstance(value, dict):
                try:
                    object.__setattr__(self, f.name, build(hint, value))
                except ConfigError as e:
                    raise e.within(f.name) from None
        for cls in reversed(type(self).__mro__):
            if "check" in vars(cls):
                vars(cls)["check"](self)

    @classmethod
    def resumable(cls) -> frozenset:
        return frozenset().union(*(getattr(c, "RESUMABLE", frozenset()) for c in cls.__mro__))

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
