"""The data stages' params (tokenize, shard), mirroring ``conf/base/parameters_{tokenize,shard}.yml``.

Validated like the training params (``lehr.config_parts``) without importing the engine, so a
change to the training code never makes DVC re-run tokenize or shard.
"""

from __future__ import annotations

import dataclasses
import typing

from lehr.config_parts import Section, require, require_positive, setting
from lehr.dataprep.token_index import parse_slice
from lehr.tokens import ENDOFTEXT


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenizeParams(Section):
    vocab_size: int  # tokens in the BPE vocabulary, special tokens included
    special_tokens: list[str]  # the first must be <|endoftext|>, the document separator
    train_sample_bytes: int  # UTF-8 bytes of training text used to fit BPE; 0 = all
    min_frequency: int  # a pair merges only if it occurs at least this often
    batch_size: int  # documents per encode_batch call
    max_bytes_per_stream: int  # cap per stream for quick runs (smoke); 0 = no cap
    on_decode_error: typing.Literal["error", "replace"]  # non-UTF-8 input: stop, or U+FFFD
    text_field: str = "text"  # the JSONL field / parquet column that holds a document's text
    workers: int = 0  # encoding processes; 0 = one per core
    slice: str = "1/1"  # i/N: encode every N-th file from the i-th (one machine of N); the shard stage merges
    # A finished part encoded under other versions (lehr.versions) is refused; true reuses it, and
    # the index names the versions it was made under.
    reuse_under_new_versions: bool = False
    SECTION: typing.ClassVar[str] = "tokenize"

    def check(self) -> None:
        floor = 256 + len(self.special_tokens)
        require(
            floor < self.vocab_size <= 1_000_000,
            "vocab_size",
            self.vocab_size,
            f"is out of range: it must exceed the 256 byte tokens plus {len(self.special_tokens)} special "
            f"tokens ({floor}) and be at most 1000000",
        )
        require(
            self.special_tokens[:1] == [ENDOFTEXT],
            "special_tokens",
            self.special_tokens,
            f"must start with {ENDOFTEXT}, the document separator",
        )
        require_positive(self, "batch_size")
        require(self.workers >= 0, "workers", self.workers, "must be >= 0 (0 = one per core)")
        require(bool(self.text_field), "text_field", self.text_field, "must name a field")
        parse_slice(self.slice)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardParams(Section):
    shard_tokens: int  # tokens per shard file (the last shard of a stream may be shorter)
    # built-in held-out tasks: examples per source and task; 0 = none
    builtin_task_examples: int = setting(200, renamed_from="task_examples")
    task_seed: int = 0  # the built-in tasks' distractors and answer positions
    SECTION: typing.ClassVar[str] = "shard"

    def check(self) -> None:
        require_positive(self, "shard_tokens")
        require(
            self.builtin_task_examples >= 0,
            "builtin_task_examples",
            self.builtin_task_examples,
            "must be >= 0 (0 = no built-in tasks)",
        )
