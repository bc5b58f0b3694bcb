"""Commands on checkpoints: what made one (``info``), ``export`` it, score it (``eval``, ``lm-eval``),
sample from it (``generate``), and ``compare`` two."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lehr.commands.arguments import (
    batch_size_argument,
    catalog,
    checkpoint_argument,
    env_argument,
    tokenizer_argument,
)


def info_arguments(p: argparse.ArgumentParser) -> None:
    checkpoint_argument(p, exports_too=False)
    p.add_argument("--config", action="store_true", help="also print the full resolved config")


def info(args: argparse.Namespace) -> int:
    from lehr.engine.artifacts.checkpoint import verify
    from lehr.engine.artifacts.state import State
    from lehr.reports import checkpoint_info

    State.read(Path(args.checkpoint))  # a folder that is no checkpoint at all is named as such first
    state = verify(Path(args.checkpoint))  # what it prints is of these very files
    print(checkpoint_info.table(state, args.checkpoint))
    if args.config:
        print(json.dumps(state["config"], indent=1))
    return 0


INFO = ("provenance, progress and metrics of a checkpoint", info_arguments, info)


def export_arguments(p: argparse.ArgumentParser) -> None:
    checkpoint_argument(p, exports_too=False)
    p.add_argument("out")
    p.add_argument(
        "--hf",
        action="store_true",
        help="a Hugging Face folder: LlamaForCausalLM, or Qwen3ForCausalLM with qk_norm (needs transformers)",
    )
    tokenizer_argument(p, "; either way it must be the one the checkpoint recorded (sha256)")


def export(args: argparse.Namespace) -> int:
    from lehr.engine.artifacts.export import export_hf, export_plain

    tokenizer = Path(args.tokenizer) if args.tokenizer else None
    out = (export_hf if args.hf else export_plain)(Path(args.checkpoint), Path(args.out), tokenizer)
    print(
        f"exported {args.checkpoint} to {out}"
        + (" (load it with transformers' from_pretrained)" if args.hf else "")
    )
    return 0


EXPORT = ("export a checkpoint for use outside lehr", export_arguments, export)


def _model_and_tokenizer(args: argparse.Namespace):
    from lehr.engine.artifacts.export import load_for_inference
    from lehr.engine.hardware import resolve

    device = resolve("auto", "fp32", None).device  # the device a run would pick, in full precision
    model, tokenizer = load_for_inference(
        Path(args.checkpoint), Path(args.tokenizer) if args.tokenizer else None, device
    )
    return model, tokenizer, device


def eval_arguments(p: argparse.ArgumentParser) -> None:
    checkpoint_argument(p)
    p.add_argument(
        "--task", required=True, help='{"context", "choices", "label"} or {"context", "target"} lines'
    )
    p.add_argument("--limit", type=int, help="the first N examples only")
    batch_size_argument(p)
    tokenizer_argument(p)


def eval_task(args: argparse.Namespace) -> int:
    from lehr.engine.evals.tasks import Scorer, evaluate_task, read_task

    task = read_task(Path(args.task))
    model, tokenizer, device = _model_and_tokenizer(args)
    result = evaluate_task(Scorer(model, tokenizer, device, args.batch_size), task, args.limit)
    print(json.dumps({"task": task.name, "kind": task.kind, **result}, indent=1))
    return 0


EVAL = ("score a checkpoint on a task file (JSONL: multiple choice or cloze)", eval_arguments, eval_task)


def lm_eval_arguments(p: argparse.ArgumentParser) -> None:
    checkpoint_argument(p)
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task names, e.g. hellaswag,piqa")
    p.add_argument("--include-path", help="a folder of lm-eval task YAML files (your own, local data)")
    p.add_argument("--limit", type=int, help="the first N examples of each task only")
    p.add_argument("--num-fewshot", type=int)
    batch_size_argument(p)
    p.add_argument("--output", help="write lm-eval's results JSON here")
    p.add_argument("--log-samples", help="write each example's requests and responses here (JSONL)")
    tokenizer_argument(p)


def lm_eval(args: argparse.Namespace) -> int:
    try:
        from lehr.reports import lm_eval_harness
    except ImportError as e:
        print(f"lehr: error: {e}", file=sys.stderr)
        return 2
    results = lm_eval_harness.run(
        Path(args.checkpoint),
        [t for t in args.tasks.split(",") if t],
        include_path=Path(args.include_path) if args.include_path else None,
        limit=args.limit,
        num_fewshot=args.num_fewshot,
        batch_size=args.batch_size,
        tokenizer=Path(args.tokenizer) if args.tokenizer else None,
        output=Path(args.output) if args.output else None,
        samples=Path(args.log_samples) if args.log_samples else None,
    )
    print(lm_eval_harness.table(results))
    return 0


LM_EVAL = (
    'lm-evaluation-harness tasks on a checkpoint (pip install -e ".[lm-eval]")',
    lm_eval_arguments,
    lm_eval,
)


def generate_arguments(p: argparse.ArgumentParser) -> None:
    checkpoint_argument(p)
    p.add_argument("--prompt", default="The", help="the text the sample continues")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to sample")
    p.add_argument("--temperature", type=float, default=0.8, help="below 1 sharper, above 1 more varied")
    p.add_argument("--top-k", type=int, default=40, help="sample among the k likeliest tokens only")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed (the same seed, the same text)")
    tokenizer_argument(p)


def generate(args: argparse.Namespace) -> int:
    from lehr.engine.evals.evaluation import prompt_ids, sample

    model, tokenizer, device = _model_and_tokenizer(args)
    ids = prompt_ids(tokenizer, args.prompt)
    tokens = sample(
        model, ids, args.max_tokens, device, temperature=args.temperature, top_k=args.top_k, seed=args.seed
    )
    new, shown = [], ""
    print(args.prompt, end="", flush=True)
    for token in tokens:  # printed as they come
        new.append(token.item())
        text = tokenizer.decode(new)
        if text.startswith(shown) and not text.endswith("\ufffd"):  # wait out a split UTF-8 character
            print(text[len(shown) :], end="", flush=True)
            shown = text
    print(tokenizer.decode(new)[len(shown) :])
    return 0


GENERATE = ("sample text from a checkpoint, streamed to stdout", generate_arguments, generate)


def compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="the baseline checkpoint")
    p.add_argument("b", help="the checkpoint compared with it")
    p.add_argument("--windows", type=int, default=64, help="held-out windows per source")
    p.add_argument(
        "--task", action="append", help="a task file (repeat for more); default: the built-in held-out tasks"
    )
    batch_size_argument(p)
    env_argument(p)


def compare(args: argparse.Namespace) -> int:
    from lehr.reports import comparison

    if args.task:
        tasks = [Path(t) for t in args.task]
    else:
        tasks = sorted(catalog(args)["heldout_tasks"].glob("*.jsonl"))
    difference = comparison.checkpoints_difference(args.a, args.b, tasks, args.windows, args.batch_size)
    print(comparison.table(difference, args.a, args.b))
    return 0


COMPARE = (
    "the difference of two checkpoints per source and task, with paired 95% intervals",
    compare_arguments,
    compare,
)
