"""lm-evaluation-harness on lehr models: ``python -m lehr lm-eval CHECKPOINT --tasks ...``.

``LehrLM`` is an lm-eval model class over a checkpoint or an export folder. Log-likelihoods come
from the engine's task scorer (``lehr.engine.evals.tasks.Scorer``), so lm-eval and lehr's own task evals score
a (context, continuation) pair the same way; rolling log-likelihoods (perplexity tasks) use
lm-eval's own token windows; generation is greedy, as lm-eval asks.

Needs the optional extra: ``pip install -e ".[lm-eval]"``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import torch

try:
    from lm_eval import simple_evaluate, utils
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
    from lm_eval.tasks import TaskManager
except ImportError as e:  # the CLI names the extra to install
    raise ImportError(
        'lm-evaluation-harness is not installed: pip install -e ".[lm-eval]" (the lm-eval package)'
    ) from e

from lehr.engine.artifacts.export import load_for_inference
from lehr.engine.evals.tasks import Scorer
from lehr.errors import Explained
from lehr.files.atomic import write_text_atomic
from lehr.tokens import ENDOFTEXT


@register_model("lehr")
class LehrLM(LM):
    """A lehr checkpoint (or ``lehr export`` folder) as an lm-eval model, on one process."""

    def __init__(
        self,
        checkpoint: str,
        tokenizer: str | None = None,
        batch_size: int | str = 16,
        device: str | None = None,
    ):
        super().__init__()
        self._device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model, self.tokenizer = load_for_inference(
            Path(checkpoint), Path(tokenizer) if tokenizer else None, self._device
        )
        self.scorer = Scorer(self.model, self.tokenizer, self._device, int(batch_size))
        self.seq_len = self.model.cfg.seq_len
        self.eot = cast(int, self.tokenizer.token_to_id(ENDOFTEXT))  # every lehr tokenizer carries it

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        scored = self.scorer.score([req.args for req in requests])
        return [(s.loglik, s.greedy) for s in scored]

    def loglikelihood_rolling(self, requests) -> list[float]:
        """Each text whole, in windows of the model's context, every token predicted once."""
        out = []
        for req in requests:
            ids = self.tokenizer.encode(req.args[0]).ids
            windows = [
                utils.make_disjoint_window(w)
                for w in utils.get_rolling_token_windows(ids, self.eot, self.seq_len, 1)
            ]
            out.append(sum(s.loglik for s in self.scorer.score_tokens(windows)))
        return out

    @torch.no_grad()
    def generate_until(self, requests) -> list[str]:
        out = []
        for req in requests:
            context, kwargs = req.args
            until = kwargs.get("until") or [ENDOFTEXT]
            until = [until] if isinstance(until, str) else list(until)
            out.append(self._greedy(context, until, int(kwargs.get("max_gen_toks", 256))))
        return out

    def _greedy(self, context: str, until: list[str], max_tokens: int) -> str:
        ids = self.tokenizer.encode(context).ids or [self.eot]
        x = torch.tensor([ids], device=self._device)
        new: list[int] = []
        text = ""
        for _ in range(max_tokens):
            logits, _ = self.model(x[:, -self.seq_len :])
            token = int(logits[0, -1].argmax())
            if token == self.eot:
                break
            new.append(token)
            x = torch.cat([x, torch.tensor([[token]], device=self._device)], dim=1)
            text = self.tokenizer.decode(new)
            if any(stop in text for stop in until):
                break
        for stop in until:  # lm-eval wants the text up to the first stop sequence
            text = text.split(stop)[0]
        return text


def run(
    checkpoint: Path,
    tasks: list[str],
    include_path: Path | None = None,
    limit: int | None = None,
    num_fewshot: int | None = None,
    batch_size: int = 16,
    tokenizer: Path | None = None,
    output: Path | None = None,
    samples: Path | None = None,
) -> dict:
    """``lm_eval.simple_evaluate`` on a lehr model; the results (and per-example responses) are
    written whole or not at all."""
    model = LehrLM(str(checkpoint), str(tokenizer) if tokenizer else None, batch_size)
    manager = TaskManager(include_path=str(include_path) if include_path else None)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ValueError(
            f"unknown lm-eval task(s) {', '.join(unknown)}: see `lm-eval ls tasks`, or give "
            f"--include-path with a folder of task YAML files"
        )
    try:
        results = simple_evaluate(
            model=model,
            tasks=tasks,
            task_manager=manager,
            limit=limit,
            num_fewshot=num_fewshot,
            log_samples=samples is not None,
        )
    except Exception as e:
        if not _unreachable(e):
            raise
        raise HarnessError(
            f"lm-eval could not fetch the data of {', '.join(tasks)} ({str(e).splitlines()[0][:160]}): its "
            "built-in tasks download their data sets from the Hugging Face Hub, which this machine cannot "
            "reach. Run where the Hub is reachable (once: datasets caches them, then HF_DATASETS_OFFLINE=1 "
            "works offline), or give --include-path with task YAML files over local data (docs/tasks.md)."
        ) from None
    if samples is not None:
        lines = [
            json.dumps(
                {"task": task, "doc_id": s["doc_id"], "arguments": s["arguments"], "resps": s["resps"]}
            )
            for task, rows in results.pop("samples").items()
            for s in rows
        ]
        write_text_atomic(samples, "\n".join(lines) + "\n")
    if output is not None:
        write_text_atomic(output, json.dumps(results, indent=1, default=str))
    return results


class HarnessError(RuntimeError, Explained):
    """lm-eval could not run its tasks here; the message says why and what to do."""


def _unreachable(error: BaseException | None) -> bool:
    """Whether an error from lm-eval comes of a network (the Hub) this machine cannot reach: an
    OSError in its chain (requests' and the Hub's connection errors are), or datasets' word for a
    data set it could neither fetch nor find cached."""
    while error is not None:
        if isinstance(error, OSError) or "not cached" in str(error) or "on the Hub" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def table(results: dict) -> str:
    return utils.make_table(results)
