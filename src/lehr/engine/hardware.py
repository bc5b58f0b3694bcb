"""Hardware profiles: device, precision, attention kernel, grad scaler and the MFU denominator."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import shutil
import sys
import sysconfig
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# Dense bf16/fp16 tensor-core peaks in TFLOP/s (vendor datasheets, without sparsity).
PEAK_TFLOPS = {
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "A10": 125.0,
    "4090": 165.0,
    "3090": 71.0,
}
# Dense FP8 peaks (precision fp8): the MFU of an FP8 run is measured against what FP8 could do.
PEAK_TFLOPS_FP8 = {"H200": 1979.0, "H100": 1979.0, "L40S": 733.0}
# glibc's mallopt parameters (malloc.h), and what lehr sets them to on a CPU (``keep_heap_memory``).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
HEAP_SETTINGS = {M_MMAP_THRESHOLD: 32 << 20, M_TRIM_THRESHOLD: 1 << 30, M_TOP_PAD: 64 << 20}
# SDPA kernels by name; "auto" leaves the choice to PyTorch (flash where it can, else the next best).
AttentionKernel = Literal["flash", "efficient", "cudnn", "math"]
Attention = Literal["auto", AttentionKernel]
ATTENTION: dict[AttentionKernel, SDPBackend] = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


@dataclass(frozen=True)
class Hardware:
    device: torch.device
    precision: str  # bf16 | fp16 | fp32 | fp8 (bf16 autocast, FP8 block matmuls), resolved
    peak_tflops: float | None  # None where no honest figure is known (CPUs): MFU is not reported
    name: str
    attention: Attention = "auto"  # SDPA kernel: auto | flash | efficient | cudnn | math

    @property
    def dtype(self) -> torch.dtype:
        return {"bf16": torch.bfloat16, "fp8": torch.bfloat16, "fp16": torch.float16}.get(
            self.precision, torch.float32
        )

    def compute(self) -> contextlib.ExitStack:
        """The context of every forward pass: autocast to the precision, and the attention kernel."""
        stack = contextlib.ExitStack()
        if self.precision != "fp32":
            stack.enter_context(torch.autocast(self.device.type, dtype=self.dtype))
        if self.attention != "auto":
            stack.enter_context(sdpa_kernel(ATTENTION[self.attention]))
        return stack

    def grad_scaler(self) -> torch.amp.GradScaler:
        # fp16 needs loss scaling; bf16 and fp32 run the same code path with scaling disabled.
        return torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")


@functools.cache
def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX). There, bf16 autocast
    trains cpu-demo ~1.4x faster than fp32 (docs/benchmarks.md); elsewhere it is emulated, slower."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def resolve(
    device: str,
    precision: str,
    peak_tflops: float | None,
    local_rank: int = 0,
    attention: Attention = "auto",
    compile: bool = False,
) -> Hardware:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device cuda was asked for but torch sees no CUDA device; use device: cpu")
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls on tensor cores (Ampere+)
        torch.backends.cudnn.allow_tf32 = True
        name = torch.cuda.get_device_name(dev)
        if precision == "auto":
            precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        if precision == "fp8" and torch.cuda.get_device_capability(dev) < (8, 9):
            raise ValueError(
                f"precision fp8 needs FP8 tensor cores (compute capability 8.9+: L40S, RTX 4090, "
                f"H100, H200); {name} has {torch.cuda.get_device_capability(dev)}. Use bf16."
            )
        if peak_tflops is None:
            peaks = PEAK_TFLOPS_FP8 if precision == "fp8" else PEAK_TFLOPS
            peak_tflops = next((v for k, v in peaks.items() if k in name), None)
    else:
        dev, name = torch.device("cpu"), "cpu"
        keep_heap_memory()
        if precision == "auto":
            precision = "bf16" if cpu_has_bf16() else "fp32"
        elif precision == "bf16" and not cpu_has_bf16():
            warnings.warn(
                "precision bf16 on a CPU without bf16 instructions (AVX512-BF16 or AMX) is emulated "
                "and slower than fp32; pretrain.precision: auto picks fp32 here",
                stacklevel=2,
            )
        if precision == "fp16":
            raise ValueError("precision fp16 needs a GPU; use fp32 or bf16 on CPU")
    hw = Hardware(dev, precision, peak_tflops, name, attention)
    if attention != "auto":
        _probe_attention(hw)
    if compile:
        _check_compiler(hw)
    return hw


def keep_heap_memory() -> bool:
    """Have glibc's malloc keep freed tensor memory for the next step instead of handing it back.

    By default a block over the mmap threshold (128 KiB, rising to the largest such block freed)
    is unmapped when freed, so every step's activations and gradients land on fresh pages that
    the kernel must fault in and zero again. Blocks up to 32 MiB now come from the heap, which
    keeps 1 GiB of free space before trimming: lehr's loop measured ~1.18x the tok/s on the 2-core
    CPU (docs/benchmarks.md). Returns whether the C library took the settings (glibc on Linux;
    elsewhere nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return all([mallopt(param, value) == 1 for param, value in HEAP_SETTINGS.items()])


def _probe_attention(hw: Hardware) -> None:
    """Fail at start, naming the setting, rather than at the first step with "No available kernel"."""
    assert hw.attention != "auto", "auto is PyTorch's choice: there is no one kernel to probe"
    q = torch.zeros(1, 2, 16, 64, device=hw.device, dtype=hw.dtype)
    try:
        with warnings.catch_warnings(), sdpa_kernel(ATTENTION[hw.attention]):
            warnings.simplefilter("ignore")  # torch warns each reason; the error below says it once
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
    except RuntimeError as e:
        raise ValueError(
            f"attention kernel {hw.attention!r} cannot run on {hw.name} in {hw.precision} "
            f"({str(e).splitlines()[0]}); use attention: auto"
        ) from e


def _check_compiler(hw: Hardware) -> None:
    """Under ``compile: true`` the first step builds kernels with the machine's compiler: C++ by
    inductor on a CPU (against Python's headers), Triton's C launcher on a GPU (its own search:
    ``CC``, gcc, clang). A machine without them is refused at start, naming the fix, rather than
    by a traceback from inside that step."""
    if hw.device.type != "cpu":
        if not any(shutil.which(c) for c in (os.environ.get("CC"), "gcc", "clang") if c):
            raise ValueError(
                f"compile: true builds kernels on {hw.name}, and no C compiler was found (CC is unset, "
                "and neither gcc nor clang is on PATH). Install one (e.g. apt install gcc, or set CC "
                "to its path), or set compile: false."
            )
        return
    headers = Path(sysconfig.get_paths()["include"])
    if not (headers / "Python.h").is_file():  # the kernels' wrappers include it
        raise ValueError(
            f"compile: true builds C++ kernels against Python's headers, and {headers / 'Python.h'} "
            "is missing. Install them (e.g. apt install python3-dev for the system's Python), or "
            "set compile: false."
        )
    from torch._inductor import cpp_builder

    try:
        cpp_builder.get_cpp_compiler()
    except Exception as e:  # torch's InvalidCxxCompiler, or whatever its search raises
        raise ValueError(
            f"compile: true builds kernels on {hw.name}, and no C++ compiler was found "
            f"({str(e).splitlines()[0] if str(e) else type(e).__name__}). Install one (e.g. apt "
            "install g++, or set CXX to its path), or set compile: false."
        ) from e


def memory_report(device: torch.device) -> str | None:
    """The GPU's memory now and at its peak; None on a CPU (no allocator to ask)."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return (
        f"allocated {torch.cuda.memory_allocated(device) / 2**30:.1f} GiB, peak "
        f"{torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB, free {free / 2**30:.1f} of "
        f"{total / 2**30:.1f} GiB"
    )
