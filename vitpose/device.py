"""Which device a run uses: one rule for train.py, evaluate.py, `vitpose.cli.tune` and `Predictor`."""

from __future__ import annotations

import torch


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """`"auto"` / None -> CUDA when available, else CPU; `"cpu"`, `"cuda"`, `"cuda:N"` as given.

    A CUDA device without an index gets the current one, so the result names a concrete device.
    Asking for CUDA on a machine without it raises ValueError naming the request (instead of
    torch's lazy failure at the first tensor moved there).
    """
    text = "auto" if spec is None else str(spec)
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(text)
    except RuntimeError as e:
        raise ValueError(f"device {text!r} is not a device torch knows ({e}); use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {text!r} was asked for but CUDA is not available here; use auto or cpu")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elif device.index >= torch.cuda.device_count():
            raise ValueError(f"device {text!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device
