"""Hardware profiles: device, precision, autocast, grad scaler and the MFU denominator."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

# Dense bf16/fp16 tensor-core peaks in TFLOP/s (vendor datasheets, without sparsity).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0,
               "4090": 165.0, "3090": 71.0}


@dataclass(frozen=True)
class Hardware:
    device: torch.device
    precision: str  # bf16 | fp16 | fp32, resolved
    peak_tflops: float | None  # None where no honest figure is known (CPUs): MFU is not reported
    name: str

    def autocast(self):
        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        # fp16 needs loss scaling; bf16 and fp32 run the same code path with scaling disabled.
        return torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")


def resolve(device: str, precision: str, peak_tflops: float | None, local_rank: int = 0) -> Hardware:
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
        if peak_tflops is None:
            peak_tflops = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    else:
        dev, name = torch.device("cpu"), "cpu"
        # CPU autocast to bf16 is slower than fp32 on most CPUs without AMX, so auto means fp32.
        if precision == "auto":
            precision = "fp32"
        if precision == "fp16":
            raise ValueError("precision fp16 needs a GPU; use fp32 or bf16 on CPU")
    return Hardware(dev, precision, peak_tflops, name)


def memory_report(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    free, total = torch.cuda.mem_get_info(device)
    return (f"allocated {torch.cuda.memory_allocated(device) / 2**30:.1f} GiB, peak "
            f"{torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB, free {free / 2**30:.1f} of "
            f"{total / 2**30:.1f} GiB")
