"""Multi-process (DDP) plumbing: one process per GPU, launched by torchrun (or SLURM's srun).

`init_distributed` reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT),
or SLURM's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) when torchrun's is absent
(`launch_environment`; a variable that cannot be used is one line naming it, `LaunchError`), meets
the other ranks (`vitpose.engine.rendezvous`: a printed timeout, SIGTERM / SIGINT heard while
waiting) and returns a `DistContext`; without torchrun it returns a single-process context and every
helper below is a no-op, so the trainer has one code path. The data loaders shard their
samples by `ctx.rank` / `ctx.world_size`.

BatchNorm buffers (the classic decoder's running statistics) are not broadcast by DDP: each rank
keeps its own, as in ViTPose's training script (`broadcast_buffers=False`), and `sync_buffers`
replaces them with their mean over ranks at the end of each epoch, as MMPose's SyncBuffersHook
does, so that the checkpoint rank 0 writes holds statistics of all the data.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from vitpose.device import resolve_device
from vitpose.engine import rendezvous
from vitpose.engine.rendezvous import LaunchError
from vitpose.models.wrappers import unwrap_model


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    is_main: bool = True
    backend: str | None = None  # "nccl" | "gloo" | None (single process)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _process_device(device: str | torch.device, local_rank: int, launched: bool) -> torch.device:
    """The configured device, with torchrun's LOCAL_RANK choosing the GPU of each process."""
    if launched and str(device) in ("auto", "cuda") and torch.cuda.is_available():
        device = f"cuda:{local_rank}"  # one GPU per process
    dev = resolve_device(device)
    if launched and dev.type == "cuda" and dev.index != local_rank:
        raise LaunchError(f"train.device {str(device)!r} conflicts with the launcher's local rank {local_rank}; "
                          "use device 'cuda' or 'auto' under torchrun or srun")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev


@dataclass(frozen=True)
class LaunchEnvironment:
    """Where this process stands among its peers, as the launcher said it."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launcher: str | None = None  # "torchrun" | "slurm" | None (one process)


def launch_environment(environ=os.environ) -> LaunchEnvironment:
    """Rank, world size and local rank from torchrun's RANK / WORLD_SIZE / LOCAL_RANK, else from
    SLURM's SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (`srun --ntasks-per-node G python train.py`:
    one task per GPU, no torchrun) when SLURM_NTASKS > 1, else one process.

    Under SLURM the rendezvous address is the job's first node unless MASTER_ADDR is set (the
    batch script usually sets it from `scontrol show hostnames`); `init_distributed` falls back to
    SLURM_LAUNCH_NODE_IPADDR, the node srun ran on, and MASTER_PORT to 29500 + the job id mod 1000.
    """
    def number(name: str, default: int | None = None) -> int | None:
        value = environ.get(name)
        if value is None or value == "":
            return default
        text = value.strip()
        if not text.isascii() or not text.isdigit():
            raise LaunchError(f"environment variable {name}={value!r} is not a whole number")
        return int(text)

    def ranked(rank: int, world: int, names: tuple[str, str], local: int, launcher: str) -> LaunchEnvironment:
        if world < 1:
            raise LaunchError(f"environment variable {names[1]}={world} must be at least 1")
        if rank >= world:
            raise LaunchError(f"{names[0]}={rank} is not below {names[1]}={world} (ranks count from 0)")
        return LaunchEnvironment(rank, world, local, launcher)

    if "RANK" in environ and "WORLD_SIZE" in environ:
        rank = number("RANK")
        return ranked(rank, number("WORLD_SIZE"), ("RANK", "WORLD_SIZE"), number("LOCAL_RANK", rank), "torchrun")
    tasks = number("SLURM_NTASKS", 1)
    if tasks > 1 and "SLURM_PROCID" in environ:
        return ranked(number("SLURM_PROCID"), tasks, ("SLURM_PROCID", "SLURM_NTASKS"), number("SLURM_LOCALID", 0),
                      "slurm")
    return LaunchEnvironment()


def _slurm_rendezvous(environ) -> None:
    """MASTER_ADDR / MASTER_PORT for init_process_group's env:// under srun, when not set."""
    if "MASTER_ADDR" not in environ:
        environ["MASTER_ADDR"] = environ.get("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1")
    if "MASTER_PORT" not in environ:
        environ["MASTER_PORT"] = str(29500 + int(environ.get("SLURM_JOB_ID", "0") or 0) % 1000)


def _restart_store(world_size: int):
    """The rendezvous store for a process that torchrun restarted, or None (then env:// as usual).

    torchrun's static rendezvous (`--master-port`, no `--rdzv-backend`) keeps one TCPStore, hosted by
    its agent, for every restart (torch 2.14: `StaticTCPRendezvous` creates it once) and the workers'
    env:// store has no per-attempt prefix, so a restarted group reads the addresses the previous
    attempt's processes published and gloo connects to dead ports: "Connection refused" until it gives
    up, or a hang (seen here under `--max-restarts`). The keys of each attempt get their own prefix."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    from torch.distributed.constants import default_pg_timeout

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False,
                          timeout=default_pg_timeout)
    return dist.PrefixStore(f"vitpose/attempt_{attempt}", store)


def init_distributed(device: str | torch.device = "auto", *, rendezvous_timeout: float | None = None,
                     stop=None) -> DistContext:
    """Join the process group torchrun (or srun, `launch_environment`) set up (NCCL on CUDA, gloo
    on CPU), or run single-process. The ranks meet through `vitpose.engine.rendezvous.join`: at most
    `rendezvous_timeout` seconds (None: $VITPOSE_RENDEZVOUS_TIMEOUT, else 600), printed, and a
    SIGTERM / SIGINT caught by `stop` (the run's StopOnSignal) ends the wait in one line."""
    launch = launch_environment(os.environ)
    launched = launch.launcher is not None
    rank, world_size, local_rank = launch.rank, launch.world_size, launch.local_rank
    if launch.launcher == "slurm" and world_size > 1:
        _slurm_rendezvous(os.environ)
    dev = _process_device(device, local_rank, launched)
    if world_size == 1:
        return DistContext(device=dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if not dist.is_initialized():
        # device_id binds the process group to this GPU, so barriers and object collectives
        # need not guess which device to use.
        kwargs = {"device_id": dev} if backend == "nccl" else {}
        timeout = rendezvous.rendezvous_timeout(rendezvous_timeout)
        agent_store = _restart_store(world_size) if launch.launcher == "torchrun" else None
        kwargs["store"] = rendezvous.join(rank, world_size, timeout, stop, store=agent_store)
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, **kwargs)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=dev,
                       is_main=rank == 0, backend=dist.get_backend())


def wrap_model(model: nn.Module, ctx: DistContext) -> nn.Module:
    """DDP around the model when there is more than one process, else the model itself.

    Every parameter gets a gradient in each step (no unused parameters), and buffers are not
    broadcast from rank 0 each forward: `sync_buffers` averages them at epoch ends instead.
    """
    if not ctx.distributed:
        return model
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=False,
                                   broadcast_buffers=False, gradient_as_bucket_view=True)


def no_sync(model: nn.Module, enabled: bool = True):
    """Context in which backward skips DDP's gradient all-reduce (the first micro-batches of a
    gradient-accumulation step); a plain context for a model without DDP or when not `enabled`."""
    while enabled:
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        if not hasattr(model, "_orig_mod"):
            break
        model = model._orig_mod  # torch.compile around DDP
    return contextlib.nullcontext()


def any_rank(flags: Sequence[bool], ctx: DistContext) -> tuple[bool, ...]:
    """For each flag, whether it is true on any rank (e.g. a non-finite loss, a stop request):
    decisions that change the control flow must be the same on every rank."""
    if not ctx.distributed:
        return tuple(bool(f) for f in flags)
    t = torch.tensor([float(bool(f)) for f in flags], device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return tuple(bool(v) for v in t.tolist())


@torch.no_grad()
def sync_buffers(model: nn.Module, ctx: DistContext) -> None:
    """Replace every floating-point buffer (BN running mean/var) by its mean over ranks.

    Integer buffers such as BN's num_batches_tracked are left as they are. Buffers of one dtype
    and device travel in one all-reduce.
    """
    if not ctx.distributed:
        return
    groups: dict[tuple, list[torch.Tensor]] = {}
    for buf in unwrap_model(model).buffers():
        if buf.is_floating_point():
            groups.setdefault((buf.dtype, buf.device), []).append(buf)
    for bufs in groups.values():
        flat = torch.cat([b.reshape(-1) for b in bufs])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= ctx.world_size
        offset = 0
        for b in bufs:
            b.copy_(flat[offset:offset + b.numel()].view_as(b))
            offset += b.numel()


def all_reduce_mean(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Mean of `tensor` over ranks (a new tensor; the input is left unchanged)."""
    out = tensor.detach().clone()
    if ctx.distributed:
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        out /= ctx.world_size
    return out


def gather_objects(obj_list: list, ctx: DistContext, dst: int = 0) -> list:
    """Concatenate every rank's list of picklable objects on rank `dst` (in rank order).

    Ranks other than `dst` get an empty list. Used for validation predictions; a loader that
    pads shards to equal length must drop the padding itself.
    """
    if not ctx.distributed:
        return list(obj_list)
    parts = [None] * ctx.world_size if ctx.rank == dst else None
    dist.gather_object(list(obj_list), parts, dst=dst)
    if ctx.rank != dst:
        return []
    return [obj for part in parts for obj in part]


def broadcast_object(obj, ctx: DistContext, src: int = 0):
    """Rank `src`'s `obj` on every rank (e.g. a stop decision or a run directory name)."""
    if not ctx.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def cleanup(ctx: DistContext | None = None) -> None:
    """Leave the process group (call once at the end of the run, also after an error)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
