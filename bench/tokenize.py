"""Benchmark: the tokenize stage's encoder vs raw HF ``tokenizers`` on the same text, side by side.

Prints MB/s of lehr's ``encode_streams`` (batched ``encode_batch_fast``, numpy arrays, per-stream
stats, end-of-text tokens) and of bare ``encode_batch`` / ``encode_batch_fast`` over the same
documents, the ratio (goal >= 0.9x), and the shard stage's write MB/s.

    python bench/tokenize.py [--corpus data/01_raw/corpus] [--vocab 4096]
"""

from __future__ import annotations

import sys

# bench/tokenize.py is named like the stdlib module: search this folder last, so that
# `import logging` (which imports tokenize) finds the real one.
sys.path.append(sys.path.pop(0))

import argparse  # noqa: E402
import logging  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from lehr.bundled_corpus import build  # noqa: E402
from lehr.corpus import Corpus  # noqa: E402
from lehr.sharding import cut_shards, write_shard_set  # noqa: E402
from lehr.tokenization import encode_streams, tokenizer_sha256, train_bpe, training_sample  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default="data/01_raw/corpus")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.corpus)
        if not root.is_dir():
            root = Path(tmp) / "corpus"
            build(root)
        docs = list(Corpus(root).documents())
        texts = [d.text for d in docs]
        mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
        tok = train_bpe(training_sample(docs, 8_000_000), args.vocab, ["<|endoftext|>"], 2)

        def raw(method: str) -> float:
            t0 = time.perf_counter()
            encode = getattr(tok, method)
            for i in range(0, len(texts), args.batch):
                encode(texts[i:i + args.batch], add_special_tokens=False)
            return mb / (time.perf_counter() - t0)

        def lehr() -> tuple[float, tuple]:
            t0 = time.perf_counter()
            out = encode_streams(tok, iter(docs), args.batch, total_docs=len(docs))
            return mb / (time.perf_counter() - t0), out

        rows = {"lehr encode_streams": [], "raw encode_batch": [], "raw encode_batch_fast": []}
        for _ in range(args.rounds):  # interleaved rounds
            speed, (streams, stats) = lehr()
            rows["lehr encode_streams"].append(speed)
            rows["raw encode_batch"].append(raw("encode_batch"))
            rows["raw encode_batch_fast"].append(raw("encode_batch_fast"))
        med = {k: statistics.median(v) for k, v in rows.items()}
        print(f"corpus {mb:.1f} MB in {len(texts)} documents, vocab {args.vocab}, batch {args.batch} documents")
        for name, speed in med.items():
            print(f"{name:24s} {speed:7.2f} MB/s   (rounds: {', '.join(f'{x:.2f}' for x in rows[name])})")
        print(f"ratio lehr / raw encode_batch       {med['lehr encode_streams'] / med['raw encode_batch']:.2f}x   (goal >= 0.9x)")
        print(f"ratio lehr / raw encode_batch_fast  {med['lehr encode_streams'] / med['raw encode_batch_fast']:.2f}x")

        info = {"sha256": tokenizer_sha256(tok), "vocab_size": tok.get_vocab_size(), "eot_id": 0}
        shards, manifest = cut_shards(streams, stats, 32768, info)
        shard_mb = sum(a.nbytes for a in shards.values()) / 1e6
        t0 = time.perf_counter()
        write_shard_set(Path(tmp) / "shards", shards, manifest, tok.to_str())
        print(f"shard write  {shard_mb:.1f} MB in {len(shards)} files: {shard_mb / (time.perf_counter() - t0):.1f} MB/s "
              f"(each file fsynced and renamed)")


if __name__ == "__main__":
    main()
