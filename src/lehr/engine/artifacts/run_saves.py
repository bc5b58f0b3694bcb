"""A run's checkpoints as the loop takes them: rolling ones (one file set, or every rank's DCP
shards under FSDP), the named ones (``pre_anneal``, ``final``, ``best``, branch points), and
what each records of the run in its ``state.json``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lehr import versions
from lehr.engine.artifacts import checkpoint, code_identity
from lehr.engine.artifacts.sharded_checkpoint import ShardedSaves
from lehr.engine.batches import ShardSet, manifest_sha256
from lehr.engine.config import TrainConfig
from lehr.engine.hardware import Hardware
from lehr.engine.model import Transformer
from lehr.engine.processes import distributed, parallel

if TYPE_CHECKING:  # the run's parts, as the loop hands them in
    from lehr.engine.run.guard import StepGuard
    from lehr.engine.run.start import Trainee
    from lehr.engine.run.stopping import Progress


def code_record() -> dict[str, Any]:
    """The identity of the engine code that runs here, as a checkpoint records it."""
    return code_identity.of_training().as_record()


class RunSaves:
    def __init__(
        self,
        cfg: TrainConfig,
        dist: distributed.Dist,
        hw: Hardware,
        trainee: Trainee,
        shards: ShardSet,
        out_dir: Path,
    ):
        self.cfg, self.dist, self.hw, self.trainee, self.shards = cfg, dist, hw, trainee, shards
        self.data_hash = manifest_sha256(cfg.shards)
        self.rolling = checkpoint.Rolling(out_dir / "checkpoints", cfg.keep_last)
        self.sharded = ShardedSaves(self.rolling, dist, cfg.async_save)
        self.whole: Transformer | None = None  # under FSDP, rank 0's unsharded copy (evals, saves)

    def save(self, prog: Progress, guard: StepGuard, target: Path | None = None) -> Path | None:
        """A rolling checkpoint (or one at ``target``); every rank hands its RNG state to rank 0.

        Under FSDP a rolling checkpoint is DCP shards written by every rank; a ``target``
        (``pre_anneal``, ``final``, ``best``) is consolidated into the single-file form, so that
        evaluate, soup, export and ``lehr info`` read it as any other."""
        trainee, dist = self.trainee, self.dist
        rngs = distributed.gather_to_main(checkpoint.rng_state(), dist)
        state = self.state(prog, guard) if dist.is_main else None
        if target is None and parallel.is_sharded(trainee.model):
            shards = parallel.sharded_state(trainee.model, trainee.optimizer)
            return self.sharded.save(prog.step, shards, trainee.scaler.state_dict(), state, rngs)
        # Keyed by parameter name, so that it loads under DDP or FSDP and any process count.
        optimizer = parallel.full_optimizer_state(trainee.model, trainee.optimizer)
        model = self.whole_model(for_save=True)
        saved = None
        if dist.is_main:
            kw: dict[str, Any] = dict(
                model=model,
                state=state,
                rng_per_rank=rngs,
                optimizer_state={"optimizer": optimizer, "scaler": trainee.scaler.state_dict()},
            )
            saved = checkpoint.write(target, **kw) if target else self.rolling.save(prog.step, **kw)
        distributed.barrier(dist)
        return saved

    def wait(self) -> None:
        """An async save still in flight completes (before the run returns)."""
        self.sharded.wait()

    def state(self, prog: Progress, guard: StepGuard) -> dict[str, Any]:
        """Everything but tensors, as of now (an async save commits it later)."""
        cfg = self.cfg
        if cfg.spike_sigma:
            prog.loss_window = guard.state_dict()
        return {
            "progress": copy.deepcopy(vars(prog)),
            "data": self.trainee.stream.state_dict(),
            "config": cfg.to_dict(),
            "config_math": cfg.math_fields(),
            "math_hash": cfg.math_hash(),
            "manifest_sha256": self.data_hash,
            "tokenizer_sha256": self.shards.manifest["tokenizer"]["sha256"],
            "world_size": self.dist.world,
            "parallel": cfg.parallel,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "versions": versions.deciding(),
            "device": self.hw.name,
            "provenance": cfg.provenance,
            "code": code_record(),
        }

    def whole_model(self, for_save: bool = False) -> Transformer | None:
        """The model whole: the model itself under DDP; under FSDP every rank takes part in gathering
        the shards and rank 0 gets a plain copy (on the CPU for a save, on the device for evals)."""
        model = self.trainee.model
        if not parallel.is_sharded(model):
            return model
        weights = parallel.full_model_state(model)
        if not self.dist.is_main:
            return None
        device = torch.device("cpu") if for_save else self.hw.device
        if self.whole is None:
            self.whole = Transformer(self.cfg.model)
        self.whole.load_state_dict(weights)
        return self.whole.to(device).eval()
