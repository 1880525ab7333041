"""Numeric precision of a training run: autocast dtype and (for fp16) the gradient scaler.

    --amp on CUDA                       fp16 autocast + GradScaler (dynamic loss scale)
    --amp --amp-dtype bfloat16 on CUDA  bf16 autocast, no scaler (bf16 has fp32's range)
    --amp on CPU                        bf16 autocast, no scaler (CPU autocast is bf16-first), when
                                        the CPU computes bf16 natively (AVX512-BF16 or AMX); else fp32,
                                        since emulated bf16 matmuls run several times slower than fp32
    --amp --amp-dtype bfloat16 on CPU   bf16 autocast whatever the CPU (asked for explicitly)
    no --amp                            fp32
The loss is always computed in fp32, outside autocast.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from vitpose.device import cpu_has_native_bf16  # the one rule of native bf16 (also precision="auto")

DTYPES = {"float16": torch.float16, "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


@dataclass
class Precision:
    device_type: str  # "cuda" | "cpu" | ...
    dtype: torch.dtype | None  # autocast dtype; None = fp32
    scaler: torch.amp.GradScaler | None
    note: str = ""  # why the choice differs from what was asked, if it does

    @property
    def name(self) -> str:
        if self.dtype is None:
            return "fp32"
        name = {torch.float16: "fp16", torch.bfloat16: "bf16"}[self.dtype]
        return name + (" + GradScaler" if self.scaler is not None else "")

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)


def resolve_precision(device: torch.device, amp: bool, amp_dtype: str = "float16") -> Precision:
    if amp_dtype not in DTYPES:
        raise ValueError(f"amp dtype {amp_dtype!r}: choose float16 or bfloat16")
    if not amp:
        return Precision(device.type, None, None)
    dtype = DTYPES[amp_dtype]
    if device.type == "cuda":
        if dtype is torch.bfloat16 and not torch.cuda.is_bf16_supported():
            raise ValueError("bfloat16 autocast needs a GPU with bf16 support (Ampere or newer); use float16")
        scaler = torch.amp.GradScaler("cuda") if dtype is torch.float16 else None
        return Precision("cuda", dtype, scaler)
    if dtype is torch.bfloat16:
        return Precision(device.type, torch.bfloat16, None)
    if device.type == "cpu" and not cpu_has_native_bf16():
        return Precision("cpu", None, None, "--amp on this CPU: no native bf16 (AVX512-BF16/AMX), so bf16 "
                         "autocast would be slower than fp32; running fp32 (--amp-dtype bfloat16 forces bf16)")
    return Precision(device.type, torch.bfloat16, None,
                     f"--amp on {device.type}: using bfloat16 autocast (no fp16 scaler there)")
