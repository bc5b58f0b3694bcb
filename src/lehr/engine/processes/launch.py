"""Starting a run's processes. World size 1 trains in this process; more goes through
``torch.distributed.run`` (torchrun): one machine on a private rendezvous, several through a
shared endpoint. The training itself is ``loop.train``; each torchrun worker enters at ``worker``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from lehr.engine.config import Launch, TrainConfig
from lehr.engine.processes import shares
from lehr.engine.run.loop import train
from lehr.files import locks
from lehr.files.atomic import sibling


def on_gpu(device: str) -> bool:
    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def check_fits_machine(launch: Launch, device: str) -> None:
    """Refused before any wait or work: more processes than the devices this process was given (its
    CPU affinity, ``CUDA_VISIBLE_DEVICES``), which no share could ever hold."""
    gpu = on_gpu(device)
    machine = shares.this_machine(gpu)
    have = len(machine.gpus) if gpu else len(machine.cores)
    if launch.nproc_per_node > have:
        what = f"{have} CUDA device(s)" if gpu else f"{have} CPU cores"
        raise ValueError(
            f"launch.nproc_per_node = {launch.nproc_per_node} exceeds the {what} this process was given "
            "(its CPU affinity, CUDA_VISIBLE_DEVICES); ask for at most that many"
        )


def torchrun_args(launch: Launch) -> list[str]:
    args = [f"--nproc-per-node={launch.nproc_per_node}", f"--max-restarts={launch.max_restarts}"]
    if launch.nnodes == 1:
        # One machine: a private rendezvous on a free local port, so two runs never collide.
        return [*args, "--standalone"]
    return [
        *args,
        f"--nnodes={launch.nnodes}",
        f"--node-rank={launch.node_rank}",
        f"--rdzv-backend={launch.rdzv_backend}",
        f"--rdzv-endpoint={launch.rdzv_endpoint}",
    ]


def run(
    cfg: TrainConfig,
    launch: Launch,
    callback_specs: Sequence[str] = (),
    extra_env: dict[str, str] | None = None,
    wait_for_folder: bool = False,
    on_share: Callable[[shares.Share], None] | None = None,
) -> dict[str, Any]:
    """Train ``cfg`` on a share of the machine (``lehr.engine.processes.shares``); returns rank 0's run
    summary with the share's ``tags()``. Multi-process runs go through torchrun.

    ``callback_specs`` are ``module:factory`` paths, built in whichever process is rank 0.
    ``wait_for_folder``: wait for a live run on the same folder to end instead of refusing at once.
    ``on_share`` hears of the share once it is held.
    """
    check_fits_machine(launch, cfg.device)
    out_dir = Path(cfg.out_dir)
    # One writer per run folder: the first node's launcher holds it for the whole group (on a shared
    # filesystem the other nodes' launchers would otherwise find it taken). A run that would wait
    # for another on the same folder (the same stable phase, queued twice) waits before it claims
    # devices, so that the devices go to work that is not already being done.
    holding = locks.hold(out_dir, "training run", wait=wait_for_folder)
    nproc = launch.nproc_per_node
    with (
        holding if launch.node_rank == 0 else contextlib.nullcontext(),
        shares.claim(nproc, on_gpu(cfg.device), f"training {out_dir}") as share,
    ):
        if on_share is not None:
            on_share(share)
        with shares.pinned(share, nproc):
            # One process trains in this one, unless its GPU is not the first this process sees:
            # CUDA fixed its devices when torch first asked for them, so it goes through torchrun.
            if nproc * launch.nnodes == 1 and share.first_gpu_index in (None, 0):
                summary = train(cfg, list(callback_specs))
            else:
                env = {**(extra_env or {}), **share.env(nproc)}
                summary = _torchrun(cfg, launch, callback_specs, env, out_dir)
        return {**summary, "share": share.tags()}


def _torchrun(
    cfg: TrainConfig, launch: Launch, callback_specs: Sequence[str], extra_env: dict[str, str], out_dir: Path
) -> dict[str, Any]:
    # The job files live in the run folder under a name the next run's recovery clears if a kill
    # leaves them behind (a kill skips every cleanup handler).
    job_dir = sibling(out_dir / "launch", "tmp")
    job_dir.mkdir(parents=True, exist_ok=True)
    try:
        cfg_path, summary_path = job_dir / "config.json", job_dir / "summary.json"
        cfg_path.write_text(json.dumps({"config": cfg.to_dict(), "callbacks": list(callback_specs)}))
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *torchrun_args(launch),
            "-m",
            "lehr.engine.processes.worker",
            str(cfg_path),
            str(summary_path),
        ]
        # One thread per worker unless the run's share says how many (extra_env has the last word).
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(extra_env or {})}
        # torchrun dies with this process, and its workers with it (worker.py): a kill of the stage
        # leaves no process behind to go on writing the run folder.
        proc = subprocess.run(cmd, env=env, preexec_fn=die_with_parent)
        if proc.returncode != 0:
            raise RuntimeError(f"torchrun exited with code {proc.returncode}; see the log above")
        if launch.nnodes > 1 and not summary_path.is_file():
            # The rendezvous put rank 0, which writes the run's summary, on another node.
            return {"node_rank": launch.node_rank}
        summary: dict[str, Any] = json.loads(summary_path.read_text())
        return summary
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
