"""Benchmark: the real tokenize and shard stages on synthetic corpora of two sizes, side by side.

Builds two corpora from the bundled text (every copy's documents made unique by a prefix), by
default about 250 MB and 2 GB of `.jsonl` files, runs `kedro run --pipelines tokenize` and
`shard` on each as subprocesses in a throwaway copy of the project, and prints per size: the
peak memory of the stage's whole process tree (PSS summed over its processes, so forked or
spawned workers count once), MB/s, and the ratio of the two peaks; then raw `tokenizers`
`encode_batch_fast` MB/s on the same text with the same cores.

Goals: each stage's peak at the large size <= 1.1x its peak at the small size, and <= 1 GB;
tokenize throughput >= 0.9x raw `encode_batch_fast`.

With ``--one-file-mb SMALL LARGE`` it measures instead the case that once grew with the file: a
corpus of one `.txt` file of words on a single line (one document), tokenized with the smoke
profile's vocabulary and sample, the stream cap off. Goal: the peak at LARGE <= 1.1x the peak at
SMALL, and <= 1 GB.

    python bench/scale.py [--sizes-mb 250 2000] [--workers 0]
    python bench/scale.py --one-file-mb 100 1000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
PARAMS = {
    "tokenize": {"vocab_size": 4096, "train_sample_bytes": 8_000_000, "max_bytes_per_stream": 0},
    "shard": {"shard_tokens": 16 << 20},
}
ONE_FILE_PARAMS = {"vocab_size": 512, "train_sample_bytes": 200_000, "max_bytes_per_stream": 0}  # smoke's


def bundled_texts(tmp: Path) -> tuple[list[str], list[str]]:
    sys.path.insert(0, str(ROOT / "src"))
    from lehr.dataprep.bundled_corpus import build
    from lehr.dataprep.corpus import Corpus

    build(tmp / "bundled")
    train, held = [], []
    for d in Corpus(tmp / "bundled").documents():
        (train if d.stream.startswith("train/") else held).append(d.text)
    return train, held


def make_corpus(dest: Path, train: list[str], held: list[str], megabytes: int) -> int:
    """``megabytes`` of training text in ~64 MB `.jsonl` files, plus the bundled held-out text."""
    target, written, copy, part = megabytes * 1_000_000, 0, 0, 0
    (dest / "web").mkdir(parents=True)
    (dest / "heldout").mkdir()
    (dest / "heldout" / "bundled.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in held))
    f, in_file = None, 0
    while written < target:
        for text in train:
            if f is None or in_file >= 64_000_000:
                if f:
                    f.close()
                # One part after another, each closed as the next opens: no `with` spans them.
                f, in_file, part = open(dest / "web" / f"part-{part:05d}.jsonl", "w"), 0, part + 1  # noqa: SIM115
            line = json.dumps({"text": f"[copy {copy}] {text}"}) + "\n"
            f.write(line)
            in_file += len(line)
            written += len(text.encode()) + 12
            if written >= target:
                break
        copy += 1
    f.close()
    return sum(p.stat().st_size for p in dest.rglob("*.jsonl"))


def make_one_line_corpus(dest: Path, train: list[str], held: list[str], megabytes: int) -> int:
    """One ``.txt`` of ``megabytes`` of the bundled text's words on a single line, and the held-out text."""
    words = " ".join(train).split()
    (dest / "web").mkdir(parents=True)
    (dest / "heldout").mkdir()
    (dest / "heldout" / "bundled.txt").write_text("\n\n".join(held))
    target, written, copy = megabytes * 1_000_000, 0, 0
    with open(dest / "web" / "one-line.txt", "w") as f:
        while written < target:
            chunk = " ".join(f"{w}{copy}" for w in words) + " "  # every copy's words its own
            f.write(chunk)
            written, copy = written + len(chunk.encode()), copy + 1
    return (dest / "web" / "one-line.txt").stat().st_size


def one_file(tmp: Path, train: list[str], held: list[str], sizes_mb: list[int]) -> None:
    peaks = []
    for mb in sizes_mb:
        corpus = tmp / f"one-line-{mb}"
        size = make_one_line_corpus(corpus, train, held, mb)
        repo = project(tmp / f"repo-one-line-{mb}", corpus)
        seconds, peak = run_stage(repo, "tokenize", ONE_FILE_PARAMS, workers=0)
        peaks.append(peak)
        print(
            f"one .txt line of {size / 1e6:6.0f} MB  tokenize  {seconds:7.1f} s  "
            f"{size / 1e6 / seconds:6.2f} MB/s  peak PSS {peak / 2**20:6.0f} MiB",
            flush=True,
        )
        shutil.rmtree(repo)
        shutil.rmtree(corpus)
    print(
        f"\ntokenize peak, one line of {sizes_mb[1]} MB / {sizes_mb[0]} MB: {peaks[1] / peaks[0]:.2f}x "
        f"(goal <= 1.1x), largest {peaks[1] / 2**20:.0f} MiB (goal <= 1024)"
    )


def project(dest: Path, corpus: Path) -> Path:
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "conf", "src", ".telemetry"):
        src = ROOT / name
        if src.is_dir():  # not conf/local: your own overrides would change what is measured
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("local", "__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    (dest / "conf" / "local").mkdir()
    import yaml

    where = dest / yaml.safe_load((dest / "conf/base/globals.yml").read_text())["corpus"]
    where.parent.mkdir(parents=True)
    where.symlink_to(corpus)
    return dest


def run_stage(repo: Path, pipeline: str, params: dict, workers: int) -> tuple[float, float]:
    """(seconds, peak PSS in bytes of the whole process tree) of one `kedro run`."""
    flat = [f"{pipeline}.{k}={v}" for k, v in params.items()]
    if pipeline == "tokenize":
        flat.append(f"tokenize.workers={workers}")
    cmd = [
        str(Path(sys.executable).parent / "kedro"),
        "run",
        "--pipelines",
        pipeline,
        "--params",
        ",".join(flat),
    ]
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "1", "LEHR_MLFLOW": "0"}
    return timed(cmd, repo, env)


def timed(cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> tuple[float, int]:
    """Run ``cmd``; (seconds, peak PSS in bytes of its whole process tree, sampled every 0.2 s)."""
    t0 = time.perf_counter()
    proc = psutil.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        total = 0
        for p in [proc, *proc.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                total += p.memory_full_info().pss
        peak = max(peak, total)
        time.sleep(0.2)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr.read()[-3000:]}")
    return seconds, peak


def raw_encode_mb_s(repo: Path, corpus: Path, limit_mb: int = 100) -> tuple[float, float]:
    """(MB encoded, MB/s) of raw ``encode_batch_fast`` on up to ``limit_mb`` of the corpus' text."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(repo / "data" / "02_intermediate" / "tokenizer.json"))
    texts, size = [], 0
    for path in sorted((corpus / "web").glob("*.jsonl")):
        with open(path) as lines:
            for line in lines:
                texts.append(json.loads(line)["text"])
                size += len(texts[-1].encode())
                if size >= limit_mb * 1_000_000:
                    break
        if size >= limit_mb * 1_000_000:
            break
    t0 = time.perf_counter()
    for i in range(0, len(texts), 512):
        tok.encode_batch_fast(texts[i : i + 512], add_special_tokens=False)
    return size / 1e6, size / 1e6 / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes-mb", type=int, nargs=2, default=[250, 2000])
    p.add_argument("--workers", type=int, default=0, help="tokenize.workers (0 = one per core)")
    p.add_argument("--keep", help="build in this folder and keep it (default: a temporary folder)")
    p.add_argument(
        "--one-file-mb", type=int, nargs=2, metavar=("SMALL", "LARGE"),
        help="measure one .txt file of one line at these two sizes instead",
    )  # fmt: skip
    args = p.parse_args()
    tmp = Path(args.keep or tempfile.mkdtemp(prefix="lehr-scale-"))
    tmp.mkdir(parents=True, exist_ok=True)
    print(
        f"machine: {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB; folder {tmp}",
        flush=True,
    )
    train, held = bundled_texts(tmp)
    if args.one_file_mb:
        try:
            one_file(tmp, train, held, args.one_file_mb)
        finally:
            if not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)
        return
    rows, raw = {}, None
    try:
        for mb in args.sizes_mb:
            corpus = tmp / f"corpus-{mb}"
            size = make_corpus(corpus, train, held, mb)
            repo = project(tmp / f"repo-{mb}", corpus)
            for stage in ("tokenize", "shard"):
                seconds, peak = run_stage(repo, stage, PARAMS[stage], args.workers)
                rows[(mb, stage)] = (size, seconds, peak)
                print(
                    f"{size / 1e6:8.0f} MB  {stage:8s}  {seconds:7.1f} s  {size / 1e6 / seconds:7.2f} MB/s  "
                    f"peak PSS {peak / 2**20:7.0f} MiB",
                    flush=True,
                )
            if raw is None:
                raw = raw_encode_mb_s(repo, corpus)
            shutil.rmtree(repo / "data" / "03_primary")  # keep the disk footprint to one size at a time
            shutil.rmtree(repo / "data" / "04_feature")
            shutil.rmtree(corpus)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    small, large = args.sizes_mb
    print()
    for stage in ("tokenize", "shard"):
        a, b = rows[(small, stage)][2], rows[(large, stage)][2]
        print(
            f"{stage:8s} peak {large} MB / {small} MB: {b / a:.2f}x  (goal <= 1.1x), "
            f"largest {b / 2**20:.0f} MiB (goal <= 1024)"
        )
    tok_mb_s = rows[(large, "tokenize")][0] / 1e6 / rows[(large, "tokenize")][1]
    raw_mb, raw_mb_s = raw
    print(
        f"raw encode_batch_fast on {raw_mb:.0f} MB of the same text: {raw_mb_s:.2f} MB/s; "
        f"tokenize stage at {large} MB: {tok_mb_s:.2f} MB/s, ratio {tok_mb_s / raw_mb_s:.2f}x (goal >= 0.9x)"
    )


if __name__ == "__main__":
    main()
