"""DDP helpers: two gloo processes on CPU against one process on the same global batch."""

import contextlib
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from vitpose.engine.distributed import (
    all_reduce_mean,
    any_rank,
    broadcast_object,
    cleanup,
    gather_objects,
    init_distributed,
    no_sync,
    sync_buffers,
    wrap_model,
)
from vitpose.models import build_model
from vitpose.models.wrappers import unwrap_model as unwrap

WORLD = 2
PER_RANK = 2  # samples per rank; the global batch is WORLD * PER_RANK


def tiny_vitpose(decoder="simple"):
    # BatchNorm would make per-rank batch statistics differ from the global batch's, so the
    # gradient check uses the simple decoder (no BN) and no drop path (no randomness).
    torch.manual_seed(0)
    extra = {"deconv_channels": (8, 8)} if decoder == "classic" else {}
    model = build_model("vitpose-s", decoder=decoder, depth=2, embed_dim=32, num_heads=2, drop_path_rate=0.0,
                        num_keypoints=3, **extra)
    with torch.no_grad():  # the N(0, 0.001) head init would leave the backbone gradients ~1e-6
        model.head.final_layer.weight.normal_(0, 0.1)
    return model


def global_batch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(WORLD * PER_RANK, 3, 256, 192, generator=g)
    target = torch.rand(WORLD * PER_RANK, 3, 64, 48, generator=g)
    return x, target


def grads_of(model, x, target):
    loss = F.mse_loss(model(x), target)
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in unwrap(model).named_parameters()}


def classic_head_ddp_warnings(ctx):
    """Warnings of two DDP steps of the classic decoder, whose 1x1 final layer sees the
    backbone's channels-last activations. With 16 crops per rank oneDNN returned that layer's
    weight gradient channels-last, (C, 1, C, C) strides against the weight's (C, 1, 1, 1), and DDP
    warned "Grad strides do not match bucket view strides" (with 2-4 crops it happened not to).
    Recorded in this fresh process, where torch has not yet warned once."""
    torch.manual_seed(0)
    model = build_model("vitpose-s", decoder="classic", depth=1, embed_dim=32, num_heads=2, num_keypoints=17,
                        deconv_channels=(16, 16), img_size=(64, 48), drop_path_rate=0.0)
    ddp = wrap_model(model.train(), ctx)
    x, target = torch.randn(16, 3, 64, 48), torch.rand(16, 17, 16, 12)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            ddp.zero_grad(set_to_none=True)  # as the trainer does: each step's gradient is new
            grads_of(ddp, x, target)
    return [str(w.message) for w in caught]


def _worker(rank, port, out_dir):
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    ctx = init_distributed("cpu")
    try:
        x, target = global_batch()
        shard = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        local = grads_of(tiny_vitpose(), x[shard], target[shard])  # this rank's own gradient
        ddp = wrap_model(tiny_vitpose(), ctx)
        averaged = grads_of(ddp, x[shard], target[shard])
        ddp.zero_grad(set_to_none=True)
        stride_warnings = classic_head_ddp_warnings(ctx)
        with no_sync(ddp):  # an accumulation micro-step: gradients stay this rank's own
            unsynced = grads_of(ddp, x[shard], target[shard])

        # BN running stats from different data on each rank; num_batches_tracked set apart.
        bn_model = tiny_vitpose("classic").train()
        with torch.no_grad():
            for m in bn_model.head.deconv_layers:  # the head's N(0, 0.001) init leaves almost no variance
                if isinstance(m, torch.nn.ConvTranspose2d):
                    m.weight.normal_(0, 0.5)
            bn_model(torch.randn(2, 3, 256, 192, generator=torch.Generator().manual_seed(10 + rank)) * (rank + 1))
        for name, buf in bn_model.named_buffers():
            if name.endswith("num_batches_tracked"):
                buf.fill_(5 + rank)
        before = {n: b.clone() for n, b in bn_model.named_buffers()}
        sync_buffers(bn_model, ctx)
        after = {n: b.clone() for n, b in bn_model.named_buffers()}

        torch.save({
            "ctx": (ctx.rank, ctx.world_size, ctx.local_rank, str(ctx.device), ctx.is_main, ctx.backend),
            "is_ddp": type(ddp).__name__,
            "local": local, "averaged": averaged, "unsynced": unsynced,
            "stride_warnings": stride_warnings,
            "any": any_rank([rank == 1, False, True], ctx), "before": before, "after": after,
            "gathered": gather_objects([f"r{rank}-{i}" for i in range(rank + 2)], ctx),
            "mean": all_reduce_mean(torch.tensor([float(rank), 10.0 * rank]), ctx),
            "broadcast": broadcast_object({"from": rank}, ctx),
        }, f"{out_dir}/rank{rank}.pt")
    finally:
        cleanup(ctx)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(free_port(), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def test_context_from_torchrun_env(two_ranks):
    assert [r["ctx"] for r in two_ranks] == [(0, 2, 0, "cpu", True, "gloo"), (1, 2, 1, "cpu", False, "gloo")]
    assert all(r["is_ddp"] == "DistributedDataParallel" for r in two_ranks)


def test_ddp_gradients_equal_single_process_global_batch(two_ranks):
    single = grads_of(tiny_vitpose(), *global_batch())
    assert set(single) == set(two_ranks[0]["averaged"])
    for rank in two_ranks:
        for name, g in single.items():
            scale = g.abs().max().item()
            diff = (rank["averaged"][name] - g).abs().max().item()
            assert scale > 5e-5, name  # large enough for a wrong average to show
            assert diff <= 1e-6 and diff <= 1e-5 * scale, (name, diff, scale)
        # The rank's own half-batch gradient is not the answer: averaging did happen.
        w = "backbone.blocks.0.attn.qkv.weight"
        assert (rank["local"][w] - single[w]).abs().max() > 1e-3 * single[w].abs().max()


def test_no_grad_stride_warning_from_the_heads_final_layer(two_ranks):
    for rank in two_ranks:
        assert not [w for w in rank["stride_warnings"] if "strides" in w], rank["stride_warnings"]


@pytest.mark.slow  # two torchrun processes import torch and write a synthetic set: about a minute
def test_two_process_demo_has_no_grad_stride_warning(tmp_path):
    """The two-process gloo demo through torchrun, as the issue ran it: no stride warning."""
    repo = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(repo / "train.py"),
           "--demo", "--epochs", "1", "--work-dir", str(tmp_path / "run"),
           "--set", f"data.root={tmp_path / 'synthetic'}", "--set", "data.synthetic_train_images=8",
           "--set", "data.synthetic_val_images=2", "--set", "train.stop_at_iteration=2",
           "--set", "loader.num_workers=0", "--set", "loader.batch_size=4"]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "stopped by train.stop_at_iteration" in output, output[-3000:]  # the steps did run
    assert "Grad strides do not match" not in output, output[-3000:]


def test_no_sync_keeps_local_gradients(two_ranks):
    for rank in two_ranks:
        for name, g in rank["local"].items():
            torch.testing.assert_close(rank["unsynced"][name], g, rtol=1e-5, atol=1e-7)


def test_sync_buffers_means_float_buffers_keeps_integer_ones(two_ranks):
    before = [r["before"] for r in two_ranks]
    names = list(before[0])
    assert any(n.endswith("running_var") for n in names)
    for name in names:
        if name.endswith("num_batches_tracked"):
            for rank, r in enumerate(two_ranks):
                assert r["after"][name].item() == 5 + rank  # integer buffers stay per rank
            continue
        assert not torch.allclose(before[0][name], before[1][name])  # the ranks really differed
        mean = (before[0][name] + before[1][name]) / 2
        for r in two_ranks:
            torch.testing.assert_close(r["after"][name], mean, rtol=1e-6, atol=1e-7)


def test_gather_reduce_broadcast(two_ranks):
    assert two_ranks[0]["gathered"] == ["r0-0", "r0-1", "r1-0", "r1-1", "r1-2"]
    assert two_ranks[1]["gathered"] == []
    for r in two_ranks:
        assert r["mean"].tolist() == [0.5, 5.0]
        assert r["broadcast"] == {"from": 0}
        assert r["any"] == (True, False, True)


def test_single_process_is_a_no_op(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    ctx = init_distributed("cpu")
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.backend, ctx.distributed) == (0, 1, True, None, False)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    assert wrap_model(model, ctx) is model
    sync_buffers(model, ctx)
    t = torch.tensor([1.0, 2.0])
    assert all_reduce_mean(t, ctx).tolist() == [1.0, 2.0]
    assert gather_objects([1, 2], ctx) == [1, 2] and broadcast_object("x", ctx) == "x"
    assert any_rank([0, 1], ctx) == (False, True)
    assert isinstance(no_sync(model), contextlib.nullcontext)
    cleanup(ctx)


@pytest.mark.slow  # importing torch._dynamo alone takes seconds
def test_unwrap_strips_compile_wrapper():
    model = torch.nn.Linear(2, 2)
    compiled = torch.compile(model)  # wrapping is lazy: nothing compiles until the first call
    assert compiled is not model and unwrap(compiled) is model


def test_a_restarted_torchrun_attempt_keeps_its_rendezvous_keys_apart(monkeypatch):
    """Under torchrun's agent store (one store for every restart), each attempt writes under its own
    prefix: attempt 1 cannot read what attempt 0's processes published (their dead addresses)."""
    from datetime import timedelta

    from vitpose.engine.distributed import _restart_store

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = torch.distributed.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=10))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert _restart_store(2) is None  # not the agent's store: env:// as usual
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    first = _restart_store(2)
    first.set("rank_1_address", "127.0.0.1:13699")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    second = _restart_store(2)
    assert second.check(["rank_1_address"]) is False  # the dead attempt's key is not visible
    second.set("rank_1_address", "127.0.0.1:31129")
    assert agent.get("vitpose/attempt_0/rank_1_address") == b"127.0.0.1:13699"
    assert agent.get("vitpose/attempt_1/rank_1_address") == b"127.0.0.1:31129"
