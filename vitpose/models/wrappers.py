"""Wrappers around a model and its parameter names: DDP's `module.`, torch.compile's `_orig_mod.`.

A model trained with DistributedDataParallel or compiled with torch.compile saves its parameters
under prefixed names, and is itself a wrapper around the plain ViTPose. Files are read with the
prefixes removed (`vitpose.models.checkpoint`), and files are written from the plain model.
"""

import torch

__all__ = ["WRAPPER_PREFIXES", "strip_wrapper_prefixes", "unwrap_model"]

WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def strip_wrapper_prefixes(names):
    """Parameter names without DDP's `module.` and torch.compile's `_orig_mod.` (in any nesting):
    one name (a str) or a list of them (a list, in order)."""
    if not isinstance(names, str):
        return [strip_wrapper_prefixes(name) for name in names]
    name, changed = names, True
    while changed:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix):], True
        name = name.replace("._orig_mod.", ".")
    return name


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model inside DDP (`.module`) and torch.compile (`._orig_mod`) wrappers, in any
    nesting: the module whose parameter names carry none of the prefixes above."""
    from torch.nn.parallel import DistributedDataParallel

    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):  # torch.compile
            model = model._orig_mod
        else:
            return model
