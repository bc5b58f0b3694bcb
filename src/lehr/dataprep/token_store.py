"""Token streams on disk, written as they are encoded, by any number of worker processes.

Layout of the tokenize stage's output folder::

    parts/<key>.bin             the tokens of one task (a corpus file; or, under a per-stream
                                cap, all files of a stream), appended as they are encoded
    parts/.<key>.resume         that part's record, written after its .bin is complete, with the
                                sha256 of each file it encoded and of the .bin (DVC ignores it)
    streams.json                the index of a whole run
    streams-<i>-of-<N>.json     the index of slice i of N (``tokenize.slice``), for runs split
                                across machines; the shard stage merges the N of them

A part's key hashes what makes its bytes (the tokenizer, the stream, the files' paths, the
reading settings); its record adds the sha256 of every file it read, so a rerun after a kill
reuses every finished part whose files hold the same bytes and encodes only the rest (a file's
size and time prove nothing: ``cp -p``, ``rsync -a`` and ``tar x`` keep them over new content).
Each index records the plan it was cut from (every task's files, the tokenizer, the settings),
and slices are merged only when their plans agree. Names and
bytes depend on the task alone, never on the number of workers or slices or on when the corpus
was laid out, so every split of the work gives the same folder, and DVC the same hash.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm.auto import tqdm

from lehr import versions
from lehr.dataprep.corpus import Corpus, Document, read_file, stream_of
from lehr.dataprep.tokenization import SampleHeap, encode_documents, token_dtype, tokenizer_sha256
from lehr.files import locks
from lehr.files.atomic import fsync_dir, recover, sha256_file, sibling, write_text_atomic

FORMAT = 2
READ_TOKENS = 4 << 20  # tokens read at once by ``TokenStreams.chunks``
log = logging.getLogger(__name__)
_SLICE_INDEX = re.compile(r"^streams-(\d+)-of-(\d+)\.json$")


class TokenStoreError(ValueError):
    """Token streams that cannot be used; the message names the file and the fix."""


@dataclasses.dataclass(frozen=True)
class EncodeJob:
    """One part to encode: a corpus file, or under a per-stream cap all files of a stream (not an
    eval task: those are ``lehr.engine.evals.tasks.Task``)."""

    index: int
    stream: str
    files: tuple[str, ...]  # relative to the corpus root, in read order


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything besides the tokenizer and the files that changes a part's bytes."""

    errors: str  # strict | replace
    text_field: str
    cap: int  # max_bytes_per_stream; 0 = none
    batch_size: int


def plan(corpus: Corpus, cap: int) -> list[EncodeJob]:
    """One task per file; under a per-stream cap one per stream (the cap runs across its files)."""
    files = corpus.files()
    if not cap:
        return [
            EncodeJob(i, stream_of(corpus.root, f), (str(f.relative_to(corpus.root)),))
            for i, f in enumerate(files)
        ]
    by_stream: dict[str, list[str]] = {}
    for f in files:
        by_stream.setdefault(stream_of(corpus.root, f), []).append(str(f.relative_to(corpus.root)))
    return [EncodeJob(i, s, tuple(fs)) for i, (s, fs) in enumerate(by_stream.items())]


def parse_slice(spec: str) -> tuple[int, int]:
    """``"i/N"`` (1-based) -> (i, N)."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", spec)
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise ValueError(f"parameter tokenize.slice = {spec!r} must be i/N with 1 <= i <= N, e.g. 1/1 or 2/4")
    return int(m[1]), int(m[2])


def _key(task: EncodeJob, tokenizer_sha: str, settings: Settings) -> str:
    blob = json.dumps(
        {
            "format": FORMAT,
            "tokenizer": tokenizer_sha,
            "stream": task.stream,
            "files": task.files,
            "settings": dataclasses.asdict(settings),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _contents(task: EncodeJob, root: Path) -> list:
    """[file, sha256] of each file the task reads: what a finished part is reused on."""
    return [[rel, sha256_file(root / rel)] for rel in task.files]


def plan_record(tasks: list[EncodeJob], tokenizer_sha: str, settings: Settings) -> dict:
    """What a run's (or slice's) tasks were cut from; two slices merge only under equal plans."""
    files = [[t.stream, list(t.files)] for t in tasks]
    blob = json.dumps([files, tokenizer_sha, dataclasses.asdict(settings)], sort_keys=True)
    return {
        "sha256": hashlib.sha256(blob.encode()).hexdigest(),
        "tokenizer_sha256": tokenizer_sha,
        "settings": dataclasses.asdict(settings),
        "tasks": files,
    }


RESUME = ".resume"  # suffix of a part's record (``.<key>.resume``), which .dvcignore names


def _capped(docs: Iterator[Document], cap: int) -> Iterator[Document]:
    """The first documents of a stream up to ``cap`` bytes; a document is kept or dropped whole."""
    used, keep, starting = 0, True, True
    for doc in docs:
        if starting:
            keep = not cap or used < cap
        if keep:
            used += len(doc.text.encode("utf-8"))
            yield doc
        starting = doc.last


def task_documents(task: EncodeJob, root: Path, settings: Settings) -> Iterator[Document]:
    docs = (
        d for rel in task.files for d in read_file(root, root / rel, settings.errors, settings.text_field)
    )
    return _capped(docs, settings.cap)


def sample_task(task: EncodeJob, corpus_root: str, settings: Settings, max_bytes: int) -> list:
    """One task's own BPE sample, as heap items (a worker's share of ``training_sample``)."""
    heap = SampleHeap(max_bytes)
    for doc in task_documents(task, Path(corpus_root), settings):
        heap.add(doc.text)
    return heap.heap


def bpe_sample(corpus: Corpus, settings: Settings, max_bytes: int, workers: int) -> list[str]:
    """The BPE sample of the corpus' training files, read by ``workers`` processes; the same
    documents for any number of workers (heaps of parts merge into the heap of the whole)."""
    tasks = [t for t in plan(corpus, settings.cap) if t.stream.startswith("train/")]
    heap = SampleHeap(max_bytes)
    workers = min(workers or os.cpu_count() or 1, len(tasks))
    with tqdm(total=len(tasks), unit="file", desc="BPE sample", mininterval=1.0) as bar:
        if workers <= 1:
            for t in tasks:
                heap.merge(sample_task(t, str(corpus.root), settings, max_bytes))
                bar.update(1)
        else:
            job = functools.partial(
                sample_task, corpus_root=str(corpus.root), settings=settings, max_bytes=max_bytes
            )
            with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
                for items in pool.map(job, tasks):
                    heap.merge(items)
                    bar.update(1)
    return heap.texts()


_WORKER_TOKENIZER: dict[str, Tokenizer] = {}


def _worker_init() -> None:
    # Each worker process encodes on one core; the processes are the parallelism.
    os.environ["RAYON_NUM_THREADS"] = "1"


def encode_task(
    task: EncodeJob,
    corpus_root: str,
    out_dir: str,
    tokenizer_json: str,
    tokenizer_sha: str,
    settings: Settings,
    reuse_under_new_versions: bool = False,
) -> dict:
    """Encode one task into ``parts/<key>.bin`` (or reuse a finished part); returns its record."""
    root, parts = Path(corpus_root), Path(out_dir)
    key, contents = _key(task, tokenizer_sha, settings), _contents(task, root)
    record_path = parts / f".{key}{RESUME}"
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        done = parts / record["file"]
        if (
            record.get("contents") == contents
            and done.is_file()
            and done.stat().st_size == record["n_bytes_on_disk"]  # the cheap check first
            and sha256_file(done) == record["sha256"]
        ):
            other = versions.differing(record.get("versions"), versions.DATA)
            if other and not reuse_under_new_versions:
                raise TokenStoreError(
                    f"{done} was encoded under other versions ({', '.join(other)}), which can encode "
                    f"other tokens. Delete {parts.parent} to encode again, install those versions, or "
                    "set tokenize.reuse_under_new_versions: true to reuse it (the index then says so)."
                )
            return {**record, "reused": True}
    tok = _WORKER_TOKENIZER.get(tokenizer_sha)
    if tok is None:
        tok = _WORKER_TOKENIZER[tokenizer_sha] = Tokenizer.from_str(tokenizer_json)
    parts.mkdir(parents=True, exist_ok=True)
    final = parts / f"{key}.bin"
    tmp = sibling(final, "tmp")
    n_docs = n_bytes = n_tokens = 0
    try:
        with open(tmp, "wb") as f:
            for doc, ids in encode_documents(tok, task_documents(task, root, settings), settings.batch_size):
                f.write(ids.tobytes())
                n_docs += doc.last
                n_bytes += len(doc.text.encode("utf-8"))
                n_tokens += len(ids)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    record = {
        "task": task.index,
        "stream": task.stream,
        "sources": list(task.files),
        "file": final.name,
        "n_docs": n_docs,
        "n_bytes": n_bytes,
        "n_tokens": n_tokens,
        "n_bytes_on_disk": final.stat().st_size,
        "sha256": sha256_file(final),
        "contents": contents,
        "versions": versions.deciding(versions.DATA),
    }
    write_text_atomic(record_path, json.dumps(record))
    return {**record, "reused": False}


def _run(tasks: list[EncodeJob], workers: int, args: tuple) -> Iterator[dict]:
    if workers <= 1 or len(tasks) <= 1:
        for t in tasks:
            yield encode_task(t, *args)
        return
    # spawn, not fork: the parent's tokenizer may already run Rust threads, which fork breaks.
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_worker_init) as pool:
        futures = [pool.submit(encode_task, t, *args) for t in tasks]
        try:
            for fut in futures:  # in task order, so progress and errors are reported in file order
                yield fut.result()
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise


def writer_lock(root: Path, slice_: tuple[int, int] | list[int]) -> Path:
    """The folder whose lock a writer of ``root`` holds: the whole folder, or its own slice of it
    (the slices of one run write the same folder at once, each its own parts and index)."""
    i, n = slice_
    return root if n == 1 else root / f"slice-{i}-of-{n}"


def encode_corpus_to_parts(
    corpus: Corpus,
    tokenizer,
    parts_dir: Path,
    settings: Settings,
    workers: int,
    slice_spec: str,
    reuse_under_new_versions: bool = False,
) -> dict:
    """Encode this slice's tasks into ``parts_dir``; returns the slice's index (see the module doc)."""
    i, n = parse_slice(slice_spec)
    with locks.hold(writer_lock(parts_dir.parent, (i, n)), "tokenizing"):
        return _encode(corpus, tokenizer, parts_dir, settings, workers, i, n, reuse_under_new_versions)


def _encode(
    corpus: Corpus,
    tokenizer,
    parts_dir: Path,
    settings: Settings,
    workers: int,
    i: int,
    n: int,
    reuse_under_new_versions: bool,
) -> dict:
    if n == 1:
        # What a killed run was writing goes. Not under slices: the folder may be shared with other
        # machines, whose writers' pids mean nothing here.
        recover(parts_dir)
    tasks = plan(corpus, settings.cap)
    mine = [t for t in tasks if t.index % n == i - 1]
    workers = workers or os.cpu_count() or 1
    sha = tokenizer_sha256(tokenizer)
    args = (str(corpus.root), str(parts_dir), tokenizer.to_str(), sha, settings, reuse_under_new_versions)
    t0, done_bytes, reused = time.perf_counter(), 0, 0
    records = []
    with tqdm(total=len(mine), unit="file", desc=f"encode {i}/{n}", mininterval=1.0) as bar:
        for rec in _run(mine, min(workers, len(mine)), args):
            records.append(rec)
            reused += rec["reused"]
            done_bytes += 0 if rec["reused"] else rec["n_bytes"]
            bar.update(1)
            bar.set_postfix_str(
                f"{done_bytes / 1e6 / max(time.perf_counter() - t0, 1e-9):.2f} MB/s", refresh=False
            )
    seconds = max(time.perf_counter() - t0, 1e-9)
    log.info(
        "encoded %.1f MB in %.1f s (%.2f MB/s) with %d worker(s); %d of %d task(s) reused from an "
        "earlier run",
        done_bytes / 1e6,
        seconds,
        done_bytes / 1e6 / seconds,
        workers,
        reused,
        len(mine),
    )
    streams: dict[str, dict] = {}
    for rec in records:
        s = streams.setdefault(rec["stream"], {"n_docs": 0, "n_bytes": 0, "n_tokens": 0, "parts": []})
        for k in ("n_docs", "n_bytes", "n_tokens"):
            s[k] += rec[k]
        s["parts"].append({"task": rec["task"], "file": f"parts/{rec['file']}", "n_tokens": rec["n_tokens"]})
    total = sum(s["n_tokens"] for s in streams.values())
    if n == 1 and total:
        log.info("%.3f tokens per byte", total / max(sum(s["n_bytes"] for s in streams.values()), 1))
    return {
        "format": FORMAT,
        "dtype": str(token_dtype(tokenizer.get_vocab_size())),
        "tokenizer_sha256": sha,
        "slice": [i, n],
        "n_tasks": len(tasks),
        "plan": plan_record(tasks, sha, settings),
        "versions": versions.deciding(versions.DATA),
        # Parts reused from a run under other versions (tokenize.reuse_under_new_versions): each
        # part's file and the versions it was encoded under.
        "reused_under_other_versions": {
            r["file"]: r.get("versions")
            for r in records
            if r["reused"] and versions.differing(r.get("versions"), versions.DATA)
        },
        "streams": dict(sorted(streams.items())),
    }


def index_name(index: dict) -> str:
    i, n = index["slice"]
    return "streams.json" if n == 1 else f"streams-{i}-of-{n}.json"


def save_index(root: Path, index: dict) -> None:
    """Write a run's index; a whole run then clears the slice indexes and parts it does not use.

    Only lehr's own files in its own output folder go. A slice leaves the others' files alone
    (they may be writing now) and retires a whole run's index, which would hide the slices.
    """
    root.mkdir(parents=True, exist_ok=True)
    write_text_atomic(root / index_name(index), json.dumps(index, indent=1))
    if index["slice"][1] != 1:
        (root / "streams.json").unlink(missing_ok=True)
        return
    for old in root.glob("streams-*-of-*.json"):
        old.unlink()
    used = {Path(p["file"]).stem for s in index["streams"].values() for p in s["parts"]}
    for path in (root / "parts").glob("*") if (root / "parts").is_dir() else []:
        if path.suffix == ".bin" and path.stem not in used:
            path.unlink()
        elif (
            path.name.startswith(".")
            and path.name.endswith(RESUME)
            and path.name[1 : -len(RESUME)] not in used
        ):
            path.unlink()
    fsync_dir(root)


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
    for ix, under in zip(indexes[1:], made_under[1:]):
        if under != made_under[0]:
            n = ix["slice"][1]
            raise TokenStoreError(
                f"tokenize slices {indexes[0]['slice'][0]}/{n} and {ix['slice'][0]}/{n} in {root} were "
                f"encoded under other versions ({made_under[0]} and {under}), which can encode other "
                "tokens. Re-run the slices under one environment (make setup installs requirements.lock)."
            )
    plans = [ix.get("plan") for ix in indexes]
    if len(indexes) == 1 or all(p and p["sha256"] == plans[0]["sha256"] for p in plans):
        return
    first, n = indexes[0], indexes[0]["slice"][1]
    for ix, plan in zip(indexes[1:], plans[1:]):
        if plan and plans[0] and plan["sha256"] == plans[0]["sha256"]:
            continue
        what = _plan_difference(plans[0], plan)
        raise TokenStoreError(
            f"tokenize slices {first['slice'][0]}/{n} and {ix['slice'][0]}/{n} in {root} were cut from "
            f"different plans ({what}): the corpus, tokenizer or settings changed between them, and "
            f"merged they would drop some files and repeat others. Re-run every slice on the same corpus "
            f"(`kedro run --pipelines tokenize --params tokenize.slice=I/{n}` for each I)."
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
        found = {}
        for p in root.glob("streams-*-of-*.json"):
            m = _SLICE_INDEX.match(p.name)
            found.setdefault(int(m[2]), {})[int(m[1])] = json.loads(p.read_text())
        if not found:
            raise TokenStoreError(f"{whole} is missing: run the tokenize stage first (`dvc repro tokenize`)")
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
                f"not finished: run `kedro run --pipelines tokenize --params tokenize.slice=I/{n}` for each"
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
            m = streams.setdefault(name, {"n_docs": 0, "n_bytes": 0, "n_tokens": 0, "parts": []})
            for k in ("n_docs", "n_bytes", "n_tokens"):
                m[k] += s[k]
            m["parts"].extend(s["parts"])
    for s in streams.values():
        s["parts"].sort(key=lambda p: p["task"])
    return TokenStreams(root, np.dtype(indexes[0]["dtype"]), shas.pop(), dict(sorted(streams.items())))
