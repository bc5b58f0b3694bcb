"""Typed stage parameters. Each class mirrors one key of ``conf/base/parameters_<stage>.yml``.

Kedro turns the YAML mapping into these frozen dataclasses before any node runs (a node input
typed as a dataclass is validated by Kedro), so an unknown key, a wrong type or an out-of-range
value stops the run with the key named and nothing written.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union


def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
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
    if dataclasses.is_dataclass(hint):
        return isinstance(value, (hint, dict))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    return isinstance(value, hint)


def check_fields(obj: Any, section: str) -> None:
    """Type-check every field of a params dataclass; nested dicts become their dataclasses."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, hint = getattr(obj, f.name), hints[f.name]
        if not _type_ok(value, hint):
            raise ValueError(
                f"parameter {section}.{f.name} = {value!r} has the wrong type: expected {hint}"
                .replace("typing.", "")
            )
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            object.__setattr__(obj, f.name, from_mapping(hint, value, f"{section}.{f.name}"))


def from_mapping(cls: type, mapping: dict, section: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(mapping) - known)
    if unknown:
        raise ValueError(
            f"unknown parameter {section}.{unknown[0]}; the keys of {section} are: {', '.join(sorted(known))}"
        )
    return cls(**mapping)


def require(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


@dataclasses.dataclass(frozen=True)
class TokenizeParams:
    vocab_size: int  # tokens in the BPE vocabulary, special tokens included
    special_tokens: list[str]  # the first must be <|endoftext|>, the document separator
    train_sample_bytes: int  # UTF-8 bytes of training text used to fit BPE; 0 = all
    min_frequency: int  # a pair merges only if it occurs at least this often
    batch_size: int  # documents per encode_batch call
    max_bytes_per_stream: int  # cap per stream for quick runs (smoke); 0 = no cap
    on_decode_error: typing.Literal["error", "replace"]  # non-UTF-8 input: stop, or U+FFFD

    def __post_init__(self) -> None:
        check_fields(self, "tokenize")
        floor = 256 + len(self.special_tokens)
        require(
            floor < self.vocab_size <= 1_000_000,
            f"parameter tokenize.vocab_size = {self.vocab_size} is out of range: it must exceed the "
            f"256 byte tokens plus {len(self.special_tokens)} special tokens ({floor}) and be at most 1000000",
        )
        require(self.special_tokens[:1] == ["<|endoftext|>"],
                "parameter tokenize.special_tokens must start with <|endoftext|>")
        require(self.batch_size > 0, "parameter tokenize.batch_size must be positive")


@dataclasses.dataclass(frozen=True)
class ShardParams:
    shard_tokens: int  # tokens per shard file (the last shard of a stream may be shorter)

    def __post_init__(self) -> None:
        check_fields(self, "shard")
        require(self.shard_tokens > 0, "parameter shard.shard_tokens must be positive")
