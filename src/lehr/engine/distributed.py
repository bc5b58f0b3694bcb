"""Process groups and the launcher. World size 1 runs in-process; more goes through
``torch.distributed.run`` (torchrun): gloo on CPU, NCCL on CUDA, multi-node via its rendezvous."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from lehr import locks
from lehr.atomic import sibling


@dataclass(frozen=True)
class Dist:
    rank: int
    local_rank: int
    world: int
    host_group: object = None  # a gloo group for flags the hosts agree on; None: the default group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def setup(device: str) -> Dist:
    if "RANK" not in os.environ:
        return Dist(0, 0, 1)
    backend = "nccl" if device != "cpu" and torch.cuda.is_available() else "gloo"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Rank 0 may spend minutes writing a large checkpoint while the others wait in a collective;
    # a short timeout would kill healthy runs on slow shared filesystems.
    timeout = datetime.timedelta(minutes=60)
    # After torchrun restarts a failed group, the store still holds the dead workers' addresses;
    # seen here: the new gloo group dialled them and failed. A prefix per restart keeps rounds apart.
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun's own store
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0 and not agent_hosts_store, timeout=timeout)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend, store=dist.PrefixStore(f"lehr/restart{restart}", store), rank=rank,
                            world_size=world, timeout=timeout)
    # Agreeing on a host flag over NCCL would mean a device tensor and a device sync; over gloo it
    # is a few bytes between the hosts while the GPU queue keeps running.
    host_group = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None
    return Dist(rank, int(os.environ.get("LOCAL_RANK", 0)), world, host_group)


def teardown(d: Dist) -> None:
    if d.enabled and dist.is_initialized():
        dist.destroy_process_group()


def any_rank(flag: bool, d: Dist) -> bool:
    """True on every rank if ``flag`` is true on any: one tiny all-reduce between hosts, no device sync."""
    if not d.enabled:
        return flag
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=d.host_group)
    return bool(t.item())


def mean_over_ranks(t: torch.Tensor, d: Dist) -> torch.Tensor:
    """The mean of a scalar over the ranks, on the device (called at sync points only: a collective)."""
    if not d.enabled:
        return t
    total = t.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / d.world


def broadcast_object(obj, d: Dist):
    if not d.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_to_main(obj, d: Dist) -> list | None:
    if not d.enabled:
        return [obj]
    out = [None] * d.world if d.is_main else None
    dist.gather_object(obj, out, dst=0)
    return out


def barrier(d: Dist) -> None:
    if d.enabled:
        dist.barrier()


@dataclass(frozen=True)
class Launch:
    nproc_per_node: int = 1  # processes on this machine (GPUs, or CPU workers on gloo)
    nnodes: int = 1  # machines taking part
    node_rank: int = 0
    rdzv_endpoint: str = "127.0.0.1:29500"  # host:port of the rendezvous (node 0)
    rdzv_backend: str = "c10d"
    max_restarts: int = 0  # torchrun restarts the whole group this often after a worker dies


def check_launch(launch: Launch, device: str) -> None:
    if launch.nproc_per_node < 1 or launch.nnodes < 1:
        raise ValueError("launch.nproc_per_node and launch.nnodes must be at least 1")
    wants_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if wants_cuda and launch.nproc_per_node > torch.cuda.device_count():
        raise ValueError(
            f"launch.nproc_per_node = {launch.nproc_per_node} but this machine has "
            f"{torch.cuda.device_count()} CUDA device(s); ask for at most that many"
        )
    if not wants_cuda and launch.nproc_per_node > (os.cpu_count() or 1):
        raise ValueError(
            f"launch.nproc_per_node = {launch.nproc_per_node} exceeds the {os.cpu_count()} CPU cores of "
            f"this machine; ask for at most that many"
        )


def torchrun_args(launch: Launch) -> list[str]:
    args = [f"--nproc-per-node={launch.nproc_per_node}", f"--max-restarts={launch.max_restarts}"]
    if launch.nnodes == 1:
        # One machine: a private rendezvous on a free local port, so two runs never collide.
        return [*args, "--standalone"]
    return [*args, f"--nnodes={launch.nnodes}", f"--node-rank={launch.node_rank}",
            f"--rdzv-backend={launch.rdzv_backend}", f"--rdzv-endpoint={launch.rdzv_endpoint}"]


def run(config_dict: dict, launch: Launch, callback_specs: list[str] = (), extra_env: dict[str, str] | None = None) -> dict:
    """Train with ``config_dict``; returns rank 0's run summary. Multi-process runs use torchrun.

    ``callback_specs`` are ``module:factory`` paths, built in whichever process is rank 0.
    """
    from lehr.engine.config import TrainConfig
    from lehr.engine.loop import train

    check_launch(launch, config_dict.get("device", "auto"))
    out_dir = Path(config_dict["out_dir"])
    with locks.hold(out_dir, "training run"):
        if launch.nproc_per_node * launch.nnodes == 1:
            return train(TrainConfig.from_dict(config_dict), list(callback_specs))
        return _launch(config_dict, launch, callback_specs, extra_env, out_dir)


def _launch(config_dict: dict, launch: Launch, callback_specs, extra_env, out_dir: Path) -> dict:
    # The job files live in the run folder under a name the next run's recovery clears if a kill
    # leaves them behind (a kill skips every cleanup handler).
    job_dir = sibling(out_dir / "launch", "tmp")
    job_dir.mkdir(parents=True, exist_ok=True)
    try:
        cfg_path, summary_path = job_dir / "config.json", job_dir / "summary.json"
        cfg_path.write_text(json.dumps({"config": config_dict, "callbacks": list(callback_specs)}))
        cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun_args(launch),
               "-m", "lehr.engine.worker", str(cfg_path), str(summary_path)]
        env = {**os.environ, **(extra_env or {}), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        # torchrun dies with this process, and its workers with it (worker.py): a kill of the stage
        # leaves no process behind to go on writing the run folder.
        proc = subprocess.run(cmd, env=env, preexec_fn=die_with_parent)
        if proc.returncode != 0:
            raise RuntimeError(f"torchrun exited with code {proc.returncode}; see the log above")
        return json.loads(summary_path.read_text())
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
