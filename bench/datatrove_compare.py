"""Benchmark: lehr's tokenize stage vs HF datatrove's local executor on the same corpus and cores.

The measurement behind lehr's choice of `tokenize.slice` + worker processes over datatrove's
executors (docs/large_corpora.md). Builds a synthetic corpus as `bench/scale.py` does, runs the
real tokenize stage, then datatrove's `JsonlReader` + `DocumentTokenizer` with the tokenizer the
stage trained, one task per file, the same number of worker processes. datatrove is not a lehr
dependency: give a Python that has it (`--datatrove-python`, e.g. a venv with
`pip install datatrove`).

    python bench/datatrove_compare.py --datatrove-python /tmp/dt/bin/python [--size-mb 250] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from scale import PARAMS, bundled_texts, make_corpus, project, run_stage, timed

DATATROVE_JOB = """
import sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import DocumentTokenizer

corpus, tokenizer, out = sys.argv[1:4]
workers, tasks = int(sys.argv[4]), int(sys.argv[5])
LocalPipelineExecutor(
    pipeline=[JsonlReader(corpus, text_key="text", recursive=True),
              DocumentTokenizer(out + "/tokens", tokenizer_name_or_path=tokenizer, eos_token="<|endoftext|>",
                                shuffle_documents=False, shuffle_chunk_size=None)],
    tasks=tasks, workers=workers, logging_dir=out + "/logs").run()
"""


def run_datatrove(
    python: str, corpus: Path, tokenizer: Path, out: Path, workers: int, tasks: int
) -> tuple[float, int]:
    return timed(
        [python, "-c", DATATROVE_JOB, str(corpus), str(tokenizer), str(out), str(workers), str(tasks)]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datatrove-python", required=True)
    p.add_argument("--size-mb", type=int, default=250)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lehr-dt-"))
    try:
        train, held = bundled_texts(tmp)
        corpus = tmp / "corpus"
        size = make_corpus(corpus, train, held, args.size_mb)
        repo = project(tmp / "repo", corpus)
        lehr_s, lehr_peak = run_stage(repo, "tokenize", PARAMS["tokenize"], args.workers)
        tokenizer = repo / "data" / "02_intermediate" / "tokenizer.json"
        n_files = len(list(corpus.rglob("*.jsonl")))
        dt_s, dt_peak = run_datatrove(
            args.datatrove_python, corpus, tokenizer, tmp / "datatrove", args.workers, n_files
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"corpus {size / 1e6:.0f} MB in {n_files} files, {args.workers} worker process(es), "
        f"{os.cpu_count()} cores"
    )
    print(
        f"lehr tokenize stage (BPE fit included)  {lehr_s:7.1f} s  {size / 1e6 / lehr_s:6.2f} MB/s  peak "
        f"PSS {lehr_peak / 2**20:6.0f} MiB"
    )
    print(
        f"datatrove DocumentTokenizer (no fit)    {dt_s:7.1f} s  {size / 1e6 / dt_s:6.2f} MB/s  peak PSS "
        f"{dt_peak / 2**20:6.0f} MiB"
    )
    print(f"ratio lehr / datatrove: {dt_s / lehr_s:.2f}x throughput")


if __name__ == "__main__":
    main()
