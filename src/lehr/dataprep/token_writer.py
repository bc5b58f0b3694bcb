"""Writing token streams: the corpus encoded into parts by any number of worker processes, a
finished part reused after a kill, and the index of a run or of one slice of it (the layout:
``lehr.dataprep.token_index``)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from tokenizers import Tokenizer
from tqdm.auto import tqdm

from lehr import versions
from lehr.dataprep.corpus import Corpus, Document, read_file, stream_of
from lehr.dataprep.token_index import FORMAT, RESUME, TokenStoreError, add_to_stream, index_name, parse_slice
from lehr.dataprep.tokenization import SampleHeap, encode_documents, token_dtype, tokenizer_sha256
from lehr.files import locks
from lehr.files.atomic import fsync_dir, recover, sha256_file, sibling, write_text_atomic

log = logging.getLogger(__name__)


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


def _key(task: EncodeJob, tokenizer_sha: str, settings: Settings) -> str:
    blob = json.dumps(
        {
            "format": FORMAT,
            "tokenizer": tokenizer_sha,
            "stream": task.stream,
            "files": task.files,
            "settings": dataclasses.asdict(settings),
            # Parts capped before a cap ended a long document at the piece that reaches it kept it
            # whole: they are not reused under today's rule.
            **({"cap_rule": "ends a long document"} if settings.cap else {}),
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


def _capped(docs: Iterator[Document], cap: int) -> Iterator[Document]:
    """The first documents of a stream up to ``cap`` bytes. A document is kept or dropped whole,
    except one long enough to come in pieces: it ends, with its end-of-text, at the piece that
    reaches the cap (a 40 MB text file under a 120 KB cap was otherwise kept whole)."""
    used, keep, starting = 0, True, True
    for doc in docs:
        if starting:
            keep = not cap or used < cap
        starting = doc.last
        if not keep:
            continue
        used += len(doc.text.encode("utf-8"))
        if cap and used >= cap and not doc.last:
            keep = False
            doc = dataclasses.replace(doc, last=True)
        yield doc


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
    if record_path.is_file() and (done := _finished(record_path, contents, reuse_under_new_versions)):
        return {**done, "reused": True}
    tok = _WORKER_TOKENIZER.get(tokenizer_sha)
    if tok is None:
        tok = _WORKER_TOKENIZER[tokenizer_sha] = Tokenizer.from_str(tokenizer_json)
    parts.mkdir(parents=True, exist_ok=True)
    final = parts / f"{key}.bin"
    n_docs, n_bytes, n_tokens = _write_part(
        final, encode_documents(tok, task_documents(task, root, settings), settings.batch_size)
    )
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


def _finished(record_path: Path, contents: list, reuse_under_new_versions: bool) -> dict | None:
    """The record of a part a run finished, if its file is whole and of these contents."""
    record = json.loads(record_path.read_text())
    done = record_path.parent / record["file"]
    if not (
        record.get("contents") == contents
        and done.is_file()
        and done.stat().st_size == record["n_bytes_on_disk"]  # the cheap check first
        and sha256_file(done) == record["sha256"]
    ):
        return None
    other = versions.differing(record.get("versions"), versions.DATA)
    if other and not reuse_under_new_versions:
        raise TokenStoreError(
            f"{done} was encoded under other versions ({', '.join(other)}), which can encode "
            f"other tokens. Delete {record_path.parent.parent} to encode again, install those versions, or "
            "set tokenize.reuse_under_new_versions: true to reuse it (the index then says so)."
        )
    return record


def _write_part(final: Path, encoded: Iterator) -> tuple[int, int, int]:
    """The encoded documents' tokens written whole to ``final`` (never a part-written file there);
    returns its documents, bytes of text and tokens."""
    tmp = sibling(final, "tmp")
    n_docs = n_bytes = n_tokens = 0
    try:
        with open(tmp, "wb") as f:
            for doc, ids in encoded:
                f.write(ids.tobytes())
                n_docs += doc.last
                n_bytes += len(doc.text.encode("utf-8"))
                n_tokens += len(ids)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return n_docs, n_bytes, n_tokens


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
    records = _encode_tasks(mine, workers, args, f"encode {i}/{n}")
    streams: dict[str, dict] = {}
    for rec in records:
        part = {"task": rec["task"], "file": f"parts/{rec['file']}", "n_tokens": rec["n_tokens"]}
        add_to_stream(streams, rec["stream"], rec, [part])
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


def _encode_tasks(tasks: list[EncodeJob], workers: int, args: tuple, desc: str) -> list[dict]:
    """Each task's record, encoded by ``workers`` processes, with a progress bar and a closing line."""
    t0, done_bytes, reused = time.perf_counter(), 0, 0
    records = []
    with tqdm(total=len(tasks), unit="file", desc=desc, mininterval=1.0) as bar:
        for rec in _run(tasks, min(workers, len(tasks)), args):
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
        len(tasks),
    )
    return records


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
        if (path.suffix == ".bin" and path.stem not in used) or (
            path.name.startswith(".")
            and path.name.endswith(RESUME)
            and path.name[1 : -len(RESUME)] not in used
        ):
            path.unlink()
    fsync_dir(root)
