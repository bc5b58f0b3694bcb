"""Reading token streams: a run's index, or its slices' indexes merged once they agree, and each
stream's tokens in order (the layout: ``lehr.dataprep.token_index``)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from lehr import fixes
from lehr.dataprep.token_index import FORMAT, TokenStoreError, add_to_stream

READ_TOKENS = 4 << 20  # tokens read at once by ``TokenStreams.chunks``

_SLICE_INDEX = re.compile(r"^streams-(\d+)-of-(\d+)\.json$")


@dataclasses.dataclass(frozen=True)
class TokenStreams:
    """The merged index of a token folder; ``chunks(stream)`` reads a stream's tokens in order."""

    root: Path
    dtype: np.dtype
    tokenizer_sha256: str
    streams: dict[str, dict]  # name -> {n_docs, n_bytes, n_tokens, parts: [{task, file, n_tokens}]}

    def stats(self, name: str) -> dict[str, int]:
        return {k: self.streams[name][k] for k in ("n_docs", "n_bytes", "n_tokens")}

    def _paths(self, name: str) -> list[Path]:
        paths = [self.root / part["file"] for part in self.streams[name]["parts"]]
        for path in paths:
            if not path.is_file():
                raise TokenStoreError(
                    f"{path}, listed in the index of {self.root}, is missing: re-run the tokenize stage"
                )
        return paths

    def chunks(self, name: str, tokens: int = READ_TOKENS) -> Iterator[np.ndarray]:
        """The stream's tokens in order, read ``tokens`` at a time."""
        for path in self._paths(name):
            with open(path, "rb") as f:
                while len(chunk := np.fromfile(f, dtype=self.dtype, count=tokens)):
                    yield chunk


def _check_one_plan(root: Path, indexes: list[dict]) -> None:
    """Slices merge into one corpus only if each was cut from the same plan: the same files in
    the same tasks, tokenizer and settings. Otherwise streams would lose or repeat files."""
    made_under = [ix.get("versions") for ix in indexes]
    for ix, under in zip(indexes[1:], made_under[1:], strict=True):
        if under != made_under[0]:
            n = ix["slice"][1]
            raise TokenStoreError(
                f"tokenize slices {indexes[0]['slice'][0]}/{n} and {ix['slice'][0]}/{n} in {root} were "
                f"encoded under other versions ({made_under[0]} and {under}), which can encode other "
                "tokens. Re-run the slices under one environment (make setup installs requirements.lock)."
            )
    plans = [ix.get("plan") for ix in indexes]
    first_plan = plans[0]
    if len(indexes) == 1 or (first_plan and all(p and p["sha256"] == first_plan["sha256"] for p in plans)):
        return
    first, n = indexes[0], indexes[0]["slice"][1]
    for ix, plan in zip(indexes[1:], plans[1:], strict=True):
        if plan and plans[0] and plan["sha256"] == plans[0]["sha256"]:
            continue
        what = _plan_difference(plans[0], plan)
        raise TokenStoreError(
            f"tokenize slices {first['slice'][0]}/{n} and {ix['slice'][0]}/{n} in {root} were cut from "
            f"different plans ({what}): the corpus, tokenizer or settings changed between them, and "
            f"merged they would drop some files and repeat others. Re-run every slice on the same corpus "
            f"(`{fixes.run_stage('tokenize', f'tokenize.slice=I/{n}')}` for each I)."
        )


def _plan_difference(a: dict | None, b: dict | None) -> str:
    if not a or not b:
        return "one of them records no plan: it was written by an earlier lehr"
    if a["tokenizer_sha256"] != b["tokenizer_sha256"]:
        return "other tokenizers"
    if a["settings"] != b["settings"]:
        keys = sorted(k for k in a["settings"] if a["settings"][k] != b["settings"].get(k))
        return f"other reading settings: {', '.join(keys)}"
    files_a = {f for _, fs in a["tasks"] for f in fs}
    files_b = {f for _, fs in b["tasks"] for f in fs}
    added, removed = sorted(files_b - files_a), sorted(files_a - files_b)
    parts = [f"{len(a['tasks'])} against {len(b['tasks'])} tasks"]
    if added:
        parts.append(f"only the second has {', '.join(added[:3])}{' ...' if len(added) > 3 else ''}")
    if removed:
        parts.append(f"only the first has {', '.join(removed[:3])}{' ...' if len(removed) > 3 else ''}")
    return "; ".join(parts)


def load(root: Path) -> TokenStreams:
    """The whole run's index, or the N slice indexes merged (all N must be there, from one tokenizer)."""
    whole = root / "streams.json"
    if whole.is_file():
        indexes = [json.loads(whole.read_text())]
    else:
        found: dict[int, dict[int, dict]] = {}
        for p in root.glob("streams-*-of-*.json"):
            if not (m := _SLICE_INDEX.match(p.name)):
                continue  # a name the glob takes that is no slice's index (streams-a-of-b.json)
            found.setdefault(int(m[2]), {})[int(m[1])] = json.loads(p.read_text())
        if not found:
            raise TokenStoreError(
                f"{whole} is missing: run the tokenize stage first (`{fixes.rebuild('tokenize')}`)"
            )
        if len(found) > 1:
            raise TokenStoreError(
                f"{root} holds slice indexes of different splits ({sorted(found)} slices): "
                f"remove the streams-*-of-*.json files of the split you no longer use"
            )
        ((n, slices),) = found.items()
        missing = sorted(set(range(1, n + 1)) - set(slices))
        if missing:
            raise TokenStoreError(
                f"{root}: slice(s) {', '.join(f'{i}/{n}' for i in missing)} of the tokenize run are "
                f"not finished: run `{fixes.run_stage('tokenize', f'tokenize.slice=I/{n}')}` for each"
            )
        indexes = [slices[i] for i in sorted(slices)]
    if any(ix.get("format") != FORMAT for ix in indexes):
        raise TokenStoreError(f"{root} was written by another version of lehr: re-run the tokenize stage")
    shas = {ix["tokenizer_sha256"] for ix in indexes}
    if len(shas) > 1:
        raise TokenStoreError(
            f"the tokenize slices in {root} were encoded with different tokenizers; re-run them all"
        )
    _check_one_plan(root, indexes)
    streams: dict[str, dict] = {}
    for ix in indexes:
        for name, s in ix["streams"].items():
            add_to_stream(streams, name, s, s["parts"])
    for s in streams.values():
        s["parts"].sort(key=lambda p: p["task"])
    return TokenStreams(root, np.dtype(indexes[0]["dtype"]), shas.pop(), dict(sorted(streams.items())))
