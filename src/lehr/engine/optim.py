"""The optimizers, and the one thing lehr asks of them: a step that skips itself on the device.

* ``adamw``: fused AdamW on every parameter (decay on matrices only).
* ``muon``: Muon (momentum, then Newton-Schulz orthogonalisation of the update) on the hidden
  matrices, the attention and MLP projections; AdamW on the embeddings, the output head and the
  norm gains, which Muon is not made for. Each group keeps its own LR and weight decay.

The non-finite guard and loss-spike skipping decide on the device (``run.guard``) and hand the
optimizer ``found_inf``; fused AdamW honours it inside its kernel. ``torch.optim.Muon`` has no
such input, so ``MuonAdamW`` applies Muon's step (torch's arithmetic and LR scaling, with the
orthogonalisation batched over matrices of one shape) with every change to a parameter or its
momentum selected on ``found_inf``: a skipped step leaves both untouched, a taken one is torch's
step (bit for bit where the batched matmuls round as torch's one-matrix ones do; on a CPU without
bf16 instructions its bf16 products run in fp32, rounded at the same points: ``_step_in_fp32``),
and no host sync decides it.

Newton-Schulz needs whole matrices, once per optimizer step. On one process it runs on each
matrix; under DDP (``muon_work: shared``) each rank runs it on the matrices it owns and one
all-to-all hands every rank the results; under FSDP each rank's shards of a matrix go to the
matrix's owner in one all-to-all and the shards of the result come back in another. Owners are balanced
by cost (``owners``), and ``muon_work: redundant`` (every rank does every matrix) is kept to
compare against.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.optim import adamw
from torch.optim._muon import _adjust_lr

from lehr.engine.hardware import cpu_has_bf16

OPTIMIZERS = ("adamw", "muon")
# Newton-Schulz quintic coefficients and steps of torch.optim.Muon (Keller Jordan's).
NS_COEFFICIENTS, NS_STEPS, NS_EPS = (3.4445, -4.775, 2.0315), 5, 1e-7


@dataclass(frozen=True)
class Orthogonaliser:
    """An odd quintic iteration X <- a X + (b A + c A^2) X, A = X X^T, from X / (norm_scale * ||X||_F)."""

    steps: tuple[tuple[float, float, float], ...]  # (a, b, c) of each iteration
    norm_scale: float  # above 1: a margin for the spectral norm to start below 1


ORTHOGONALISERS = {
    "newton_schulz": Orthogonaliser((NS_COEFFICIENTS,) * NS_STEPS, 1.0),  # torch.optim.Muon's
    # Polar Express (Amsel et al. 2025, arXiv 2505.16932): coefficients fitted for each of the 5
    # iterations, as nanochat computes them (safety factor 2e-2, cushion 2), and its 1.01 margin.
    "polar_express": Orthogonaliser(
        (
            (8.156554524902461, -22.48329292557795, 15.878769915207462),
            (4.042929935166739, -2.808917465908714, 0.5000178451051316),
            (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
            (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
            (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
        ),
        1.01,
    ),
}
# How Muon's orthogonalisation is spread over the processes (DDP or FSDP): shared = each matrix
# is orthogonalised once, by the rank that owns it; redundant = every rank orthogonalises every
# matrix (the same update, N times the work).
MUON_WORK = ("shared", "redundant")


def is_hidden_matrix(name: str, p: torch.Tensor) -> bool:
    """A 2-D weight inside a block (attention or MLP projection): Muon's share."""
    return p.dim() == 2 and name.startswith("blocks.")


def build(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    """The optimizer ``cfg.optimizer`` names, over the model's trainable parameters."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    # Decay matrices only: norm gains are not capacity, and decaying them distorts normalisation.
    matrices = [
        p for n, p in named if p.dim() >= 2 and not (cfg.optimizer == "muon" and is_hidden_matrix(n, p))
    ]
    gains = [p for _, p in named if p.dim() < 2]
    adam_groups = [
        {"params": matrices, "weight_decay": cfg.weight_decay},
        {"params": gains, "weight_decay": 0.0},
    ]
    if cfg.optimizer == "adamw":
        # Fused on every device: one kernel per step, and it honours ``found_inf`` (see run/guard.py).
        return torch.optim.AdamW(adam_groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=True)
    hidden = [p for n, p in named if is_hidden_matrix(n, p)]
    check_layout([(n, p) for n, p in named if is_hidden_matrix(n, p)], whole_rows=cfg.muon_normuon_beta2 > 0)
    muon_group = {
        "params": hidden,
        "algorithm": "muon",
        "lr": cfg.muon_lr,
        "weight_decay": cfg.muon_weight_decay,
        "lr_scale": cfg.muon_lr / cfg.lr,  # the schedule's LR times this (``set_lr``)
    }
    return MuonAdamW(
        [muon_group, *({**g, "algorithm": "adamw"} for g in adam_groups)],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        momentum=cfg.muon_momentum,
        shared=cfg.muon_work == "shared",
        orthogonaliser=ORTHOGONALISERS[cfg.muon_orthogonaliser],
        cautious_decay=cfg.muon_cautious_decay,
        normuon_beta2=cfg.muon_normuon_beta2,
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The schedule's LR for this step, scaled per group (Muon's peak is its own)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


class MuonAdamW(torch.optim.Optimizer):
    """Muon on the groups marked ``algorithm: muon``, fused AdamW on the others, in one optimizer:
    one state dict (keyed by parameter name in checkpoints, like AdamW's), one ``found_inf``."""

    # GradScaler hands a fp16 run's found_inf and scale to the step, as it does to fused AdamW.
    _step_supports_amp_scaling = True

    def __init__(
        self,
        groups: list[dict],
        *,
        lr: float,
        betas: tuple[float, float],
        momentum: float,
        shared: bool = True,
        orthogonaliser: Orthogonaliser = ORTHOGONALISERS["newton_schulz"],
        cautious_decay: bool = False,
        normuon_beta2: float = 0.0,
    ):
        defaults = {"lr": lr, "betas": betas, "eps": 1e-8, "momentum": momentum, "lr_scale": 1.0}
        super().__init__(groups, defaults)
        # Attributes, not group entries: the config that built the optimizer holds them, and a
        # state dict without them is the same file whether they exist or not.
        self.shared, self.orthogonaliser, self.cautious_decay = shared, orthogonaliser, cautious_decay
        self.normuon_beta2 = normuon_beta2
        for group in self.param_groups:
            if group["algorithm"] == "muon" and any(p.dim() != 2 for p in group["params"]):
                raise ValueError("Muon takes 2-D matrices only")

    @torch.no_grad()
    def step(self, closure=None):
        found_inf = getattr(self, "found_inf", None)
        grad_scale = getattr(self, "grad_scale", None)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if group["algorithm"] == "muon":
                self._muon(group, params, found_inf, grad_scale)
            else:
                self._adamw(group, params, found_inf, grad_scale)

    def _adamw(self, group: dict, params: list, found_inf, grad_scale) -> None:
        states = [self.state[p] for p in params]
        for p, s in zip(params, states, strict=True):
            if not s:
                s["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                s["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                s["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        beta1, beta2 = group["betas"]
        adamw.adamw(
            params,
            [p.grad for p in params],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            [s["step"] for s in states],
            fused=True,
            grad_scale=grad_scale,
            found_inf=found_inf,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )

    def _muon(self, group: dict, params: list, found_inf, grad_scale) -> None:
        lr, decay, momentum = group["lr"], group["weight_decay"], group["momentum"]
        # On a skipped step (found_inf = 1) every factor below is the identity; otherwise each is
        # the very scalar torch.optim.Muon uses, so the two step alike bit for bit.
        take = None if found_inf is None else found_inf == 0  # False on a skipped step
        for p in params:  # a DTensor under FSDP, so that the state dict shards it like the weights
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(
                    p.grad, memory_format=torch.preserve_format
                )
        # The arithmetic runs on this rank's shards (the whole tensors outside FSDP).
        grads = [
            local_shard(p.grad) if grad_scale is None else local_shard(p.grad) / grad_scale for p in params
        ]
        bufs = [local_shard(self.state[p]["momentum_buffer"]) for p in params]
        if take is None:
            torch._foreach_lerp_(bufs, grads, 1 - momentum)
        else:  # a non-finite gradient must not reach the momentum, even times 0
            grads = [torch.where(take, g, torch.zeros_like(g)) for g in grads]
            for buf, new in zip(bufs, torch._foreach_lerp(bufs, grads, 1 - momentum), strict=True):
                buf.copy_(torch.where(take, new, buf))
        nesterov = torch._foreach_lerp(grads, bufs, momentum)
        method = self.orthogonaliser
        if _is_dtensor(params[0]):
            world = params[0].device_mesh.size()
            owner = owners([p.shape for p in params], world) if self.shared else None
            updates = orthogonalise_sharded(nesterov, params, owner, method)
        else:
            updates = (
                orthogonalise_shared(nesterov, method) if self.shared else orthogonalise(nesterov, method)
            )
        if self.normuon_beta2:
            updates = self._even_out_neurons(params, updates, take)
        for p, update in zip(params, updates, strict=True):
            if take is not None:
                update = torch.where(take, update, torch.zeros_like(update))
            weight = local_shard(p)
            if self.cautious_decay:
                # Cautious weight decay (Chen et al. 2025, arXiv 2510.12402; nanochat): decay only
                # where the update moves the weight toward zero too, never against the update.
                agree = (update * weight) >= 0
                weight.sub_(weight * (agree if take is None else agree & take), alpha=lr * decay)
            else:
                weight.mul_(torch.where(take, 1 - lr * decay, 1.0) if take is not None else 1 - lr * decay)
            # Keller's sqrt(max(1, rows / cols)), of the whole matrix (a DTensor's shape is global)
            weight.add_(update, alpha=-_adjust_lr(lr, None, p.shape))

    def _even_out_neurons(self, params: list, updates: list, take) -> list[torch.Tensor]:
        """NorMuon (Li et al. 2025, arXiv 2510.05491; nanochat): each neuron's row of the
        orthogonalised update divided by the root of a running mean (``normuon_beta2``) of its
        mean square, then the whole update scaled back to its norm before, so that Muon's step
        keeps its size while no neuron's share of it stays out of proportion. A row is an output
        neuron of an ``nn.Linear`` weight (out x in). Under FSDP a rank holds whole rows
        (``check_layout``), so only the two norms of each matrix cross processes, in one all-reduce."""
        beta2, evened, norms = self.normuon_beta2, [], []
        for p, update in zip(params, updates, strict=True):
            state = self.state[p]
            if "neuron_second_moment" not in state:
                state["neuron_second_moment"] = _rows_like(p)
            moment, update = local_shard(state["neuron_second_moment"]), update.float()
            new = torch.lerp(moment, update.square().mean(dim=-1, keepdim=True), 1 - beta2)
            moment.copy_(new if take is None else torch.where(take, new, moment))
            scaled = update / (moment.sqrt() + 1e-10)
            evened.append(scaled)
            norms.append(torch.stack([update.square().sum(), scaled.square().sum()]))
        sums = torch.stack(norms)
        if _is_dtensor(params[0]) and params[0].device_mesh.size() > 1:
            dist.all_reduce(sums, group=params[0].device_mesh.get_group())
        ratios = sums[:, 0].sqrt() / (sums[:, 1].sqrt() + 1e-10)
        return [scaled * ratio for scaled, ratio in zip(evened, ratios.unbind(), strict=True)]


def _rows_like(p: torch.Tensor) -> torch.Tensor:
    """Zeros of one value per row of ``p``: (rows, 1), laid out over the processes as ``p``'s rows are."""
    if not _is_dtensor(p):
        return torch.zeros(p.shape[0], 1, dtype=torch.float32, device=p.device)
    from torch.distributed.tensor import DTensor

    local = torch.zeros(p.to_local().shape[0], 1, dtype=torch.float32, device=p.device)
    shape = torch.Size((p.shape[0], 1))
    return DTensor.from_local(local, p.device_mesh, p.placements, shape=shape, stride=(1, 1))


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a view: writing it writes the parameter); a tensor itself."""
    return t.to_local() if _is_dtensor(t) else t


def _is_dtensor(t: torch.Tensor) -> bool:
    """Whether ``t`` is a DTensor, without importing ``torch.distributed.tensor`` (half a second,
    sympy included): a process that has not imported it (FSDP does) holds none, and the processes
    that only read a config (a stage's launcher, evaluate) never pay for it."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def owners(shapes: list[torch.Size], world: int) -> list[int]:
    """The rank that orthogonalises each matrix: the largest first, each to the least loaded rank
    (Newton-Schulz costs about rows x cols x min(rows, cols) per iteration); the same on every rank."""
    load, out = [0] * world, [0] * len(shapes)
    for i in sorted(range(len(shapes)), key=lambda i: (-shapes[i].numel() * min(shapes[i]), i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        out[i], load[rank] = rank, load[rank] + shapes[i].numel() * min(shapes[i])
    return out


def orthogonalise_shared(
    matrices: list[torch.Tensor], method: Orthogonaliser = ORTHOGONALISERS["newton_schulz"]
) -> list[torch.Tensor]:
    """``orthogonalise`` with the work split over the processes of a DDP run. Under DDP every rank
    holds the same momentum-updated gradients, so a result computed by its owner is the one every
    rank would have computed, bit for bit where a batched matmul does not depend on the batch's
    other members (the CPU's; a test compares); one all-to-all hands each owner's bf16 results to
    every other rank (gloo moves an all-to-all several times faster than an all-gather of the
    same bytes: ``bench/newton_schulz.py`` measures this scheme)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return orthogonalise(matrices, method)
    world, rank = dist.get_world_size(), dist.get_rank()
    owner = owners([m.shape for m in matrices], world)
    computes = [[i for i, o in enumerate(owner) if o == k] for k in range(world)]
    done = orthogonalise([matrices[i] for i in computes[rank]], method) if computes[rank] else []
    got = _exchange(
        [[] if k == rank else done for k in range(world)],
        [[] if k == rank else [matrices[i].shape for i in computes[k]] for k in range(world)],
        None,
        matrices[0].device,
    )
    got[rank] = done
    out: list[torch.Tensor] = [None] * len(matrices)  # type: ignore[list-item]
    for k in range(world):
        for i, y in zip(computes[k], got[k], strict=True):
            out[i] = y
    return out


def check_layout(named: list[tuple[str, torch.Tensor]], whole_rows: bool = False) -> None:
    """Muon under FSDP gathers matrices sharded along one of their dimensions over a 1-D mesh
    (``fully_shard``'s layout, on any dimension; NorMuon's, ``whole_rows``, along the rows only, so
    that each rank holds its neurons' whole rows); refuses every other layout before any work."""
    sharded = [(name, p) for name, p in named if _is_dtensor(p)]
    if not sharded:
        return
    from torch.distributed.tensor import Shard

    meshes = {p.device_mesh for _, p in sharded}
    for name, p in sharded:
        if len(meshes) > 1 or p.device_mesh.ndim != 1 or type(p.placements[0]) is not Shard:
            raise ValueError(
                f"Muon cannot gather {name}: it is laid out as {p.placements} over a "
                f"{p.device_mesh.ndim}-D process mesh, and Muon under FSDP takes the hidden matrices "
                "sharded along one dimension over one 1-D mesh (fully_shard's layout). Shard them so, "
                "or set pretrain.optimizer: adamw for this layout."
            )
        if whole_rows and p.placements[0].dim != 0:
            raise ValueError(
                f"pretrain.muon_normuon_beta2 needs each process to hold whole rows of {name}, which is "
                f"sharded along dimension {p.placements[0].dim}: shard it along its rows (fully_shard's "
                "default), or set pretrain.muon_normuon_beta2: 0"
            )


def orthogonalise_sharded(
    parts: list[torch.Tensor],
    params: list[torch.Tensor],
    owner: list[int] | None,
    method: Orthogonaliser = ORTHOGONALISERS["newton_schulz"],
) -> list[torch.Tensor]:
    """``orthogonalise`` of matrices FSDP shards (checked by ``check_layout``). ``parts`` are this
    rank's shards of ``params``' momentum-updated gradients; returns this rank's shards of their
    updates. With ``owner`` (each matrix's rank, e.g. ``owners``) one all-to-all hands every shard
    of a matrix to its owner, which orthogonalises it whole, once, and a second hands each rank
    its shard of the result; without, one all-to-all hands every rank every shard and each
    orthogonalises everything. Both send bf16, the precision Newton-Schulz starts from, so
    neither rounds anything twice."""
    mesh = params[0].device_mesh
    world, rank, group = mesh.size(), mesh.get_local_rank(), mesh.get_group()
    if world == 1:
        return orthogonalise(parts, method)
    dims = [p.placements[0].dim for p in params]
    spans = [_spans(p.shape[d], world) for p, d in zip(params, dims, strict=True)]

    def shard(i: int, k: int) -> torch.Size:  # the shape of rank k's shard of matrix i
        return torch.Size(n if d != dims[i] else spans[i][k][1] for d, n in enumerate(params[i].shape))

    for i, part in enumerate(parts):
        if part.shape != shard(i, rank):
            raise RuntimeError(
                f"a shard of shape {tuple(part.shape)}, not torch.chunk's {tuple(shard(i, rank))}"
            )
    computes = [[i for i in range(len(params)) if owner is None or owner[i] == k] for k in range(world)]
    mine = computes[rank]
    got = _exchange(
        [[parts[i] for i in computes[k]] for k in range(world)],
        [[shard(i, k) for i in mine] for k in range(world)],
        group,
        parts[0].device,
    )
    whole = orthogonalise(
        [torch.cat([got[k][j] for k in range(world)], dims[i]) for j, i in enumerate(mine)], method
    )
    if owner is None:
        return [y.narrow(dims[i], *spans[i][rank]) for i, y in enumerate(whole)]
    back = _exchange(
        [[y.narrow(dims[i], *spans[i][k]) for i, y in zip(mine, whole, strict=True)] for k in range(world)],
        [[shard(i, rank) for i in computes[k]] for k in range(world)],
        group,
        parts[0].device,
    )
    out: list[torch.Tensor] = [None] * len(params)  # type: ignore[list-item]
    for k in range(world):
        for i, y in zip(computes[k], back[k], strict=True):
            out[i] = y
    return out


def _step(x: torch.Tensor, a: float, b: float, c: float) -> torch.Tensor:
    """One iteration in bf16, as torch.optim.Muon computes it."""
    gram = x @ x.mT
    return torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)


def _step_in_fp32(x: torch.Tensor, a: float, b: float, c: float) -> torch.Tensor:
    """``_step`` on a CPU without bf16 instructions, where torch multiplies bf16 matrices in scalar
    loops ten times slower than fp32 ones (a 2-core AVX2 EPYC; ``bench/newton_schulz.py``): the
    same products in fp32, each result rounded to bf16 where the bf16 kernels round theirs (a
    matmul's sum in fp32, then ``beta * C + alpha * sum`` in fp32, then bf16), so the iterate stays
    bf16's. Only the fp32 sums' order is the fp32 kernel's: on that CPU about one element in 10^4
    rounds one bf16 step apart from the bf16 kernel's, as two CPUs' kernels do."""
    xf = x.float()
    gram = (xf @ xf.mT).bfloat16().float()
    inner = (b * gram + c * (gram @ gram)).bfloat16().float()
    return (a * xf + inner @ xf).bfloat16()


def _spans(n: int, world: int) -> list[tuple[int, int]]:
    """(start, length) of each rank's shard of a dimension of n, as torch.chunk (and FSDP2) splits it."""
    step = -(-n // world)
    return [(min(n, k * step), max(0, min(n, (k + 1) * step) - k * step)) for k in range(world)]


def _exchange(
    send: list[list[torch.Tensor]], shapes: list[list[torch.Size]], group, device
) -> list[list[torch.Tensor]]:
    """One all-to-all in bf16: ``send[k]`` goes to rank k; returns, for each rank k, the tensors
    it sent this one, in the ``shapes[k]`` this rank expects."""
    flat = [t.bfloat16().reshape(-1) for ts in send for t in ts]
    outgoing = torch.cat(flat) if flat else torch.empty(0, dtype=torch.bfloat16, device=device)
    incoming = torch.empty(sum(s.numel() for ss in shapes for s in ss), dtype=torch.bfloat16, device=device)
    dist.all_to_all_single(
        incoming,
        outgoing,
        [sum(s.numel() for s in ss) for ss in shapes],
        [sum(t.numel() for t in ts) for ts in send],
        group=group,
    )
    pieces = iter(incoming.split([s.numel() for ss in shapes for s in ss]))
    return [[next(pieces).view(s) for s in ss] for ss in shapes]


def orthogonalise(
    matrices: list[torch.Tensor], method: Orthogonaliser = ORTHOGONALISERS["newton_schulz"]
) -> list[torch.Tensor]:
    """Each matrix orthogonalised by ``method`` (by default torch.optim.Muon's Newton-Schulz, within
    bf16 rounding: ``_step_in_fp32``), with the matrices of one shape (a tall one transposed to
    wide) stacked into one batched matmul, because a CPU runs a few large matmuls much faster than
    many small ones (``bench/newton_schulz.py``)."""
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, m in enumerate(matrices):
        by_shape.setdefault((min(m.shape), max(m.shape)), []).append(i)
    out: list[torch.Tensor] = [None] * len(matrices)  # type: ignore[list-item]
    for index in by_shape.values():
        tall = [matrices[i].size(0) > matrices[i].size(1) for i in index]
        x = torch.stack(
            [m.mT if t else m for m, t in zip((matrices[i] for i in index), tall, strict=True)]
        ).bfloat16()
        norm = x.norm(dim=(-2, -1), keepdim=True)
        if method.norm_scale != 1:
            norm = norm * method.norm_scale
        x = x / norm.clamp(min=NS_EPS)  # spectral norm <= 1
        step = _step_in_fp32 if x.device.type == "cpu" and not cpu_has_bf16() else _step
        for a, b, c in method.steps:
            x = step(x, a, b, c)
        for i, t, y in zip(index, tall, x.unbind(), strict=True):
            out[i] = y.mT if t else y
    return out
