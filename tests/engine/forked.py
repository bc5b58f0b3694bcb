"""The engine's math on several gloo processes forked from the test process (OLMo-core's
``testing/distributed.py`` is the shape): each fork already holds torch and lehr, so a 2-process
run starts in a fraction of a second where torchrun spends seconds importing them three times.
Tests of what the processes compute use ``run`` from here; tests of the launcher itself, of kills,
restarts and two nodes keep ``lehr.engine.processes.launch.run`` (real torchrun)."""

from __future__ import annotations

import multiprocessing
import os
import socket
import traceback

import torch

from lehr.engine.config import Launch, TrainConfig
from lehr.engine.processes import launch as real
from lehr.engine.run.loop import train

TIMEOUT_S = 600  # a fork that hangs fails its test rather than the suite


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(cfg: TrainConfig, rank: int, world: int, port: int, results) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    # As torchrun's workers get it from the launcher: one thread each unless the caller set a share
    # (a reduction over more threads may round otherwise than a torchrun run it is compared with).
    torch.set_num_threads(int(os.environ.setdefault("OMP_NUM_THREADS", "1")))
    try:
        summary = train(cfg)
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        raise
    results.put((rank, "ok", summary))


def run(cfg: TrainConfig, launch: Launch, extra_env: dict[str, str] | None = None) -> dict:
    """``lehr.engine.processes.launch.run`` on one machine's CPU, the processes forked: rank 0's summary."""
    assert launch.nnodes == 1 and not extra_env, "two nodes and injected faults: use real torchrun"
    real.check_fits_machine(launch, cfg.device)
    # One process trains in this one, as the launcher does; CUDA cannot be used in a fork of a
    # process that has used it, so a GPU run goes through torchrun.
    if launch.nproc_per_node == 1 or (cfg.device != "cpu" and torch.cuda.is_available()):
        return real.run(cfg, launch)
    world, port = launch.nproc_per_node, _free_port()
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    procs = [context.Process(target=_rank, args=(cfg, r, world, port, results)) for r in range(world)]
    for proc in procs:
        proc.start()
    got = {}
    try:
        for _ in procs:
            rank, status, value = results.get(timeout=TIMEOUT_S)
            got[rank] = (status, value)
            if status == "error":
                raise RuntimeError(f"rank {rank} failed:\n{value}")
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return got[0][1]
