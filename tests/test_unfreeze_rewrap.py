"""A frozen backbone that unfreezes gets a new DDP / torch.compile wrapper (engine/session.py's
begin_epoch, engine/finetune.py's apply_backbone_freeze).

DDP registers, when it is built, the parameters that require a gradient, and all-reduces only
theirs; torch.compile traces the graph with the requires_grad flags of that moment. A wrapper
built while the backbone was frozen and kept after it unfreezes would leave each rank with its own
backbone gradient (silently different replicas), and one built with everything trainable and kept
while the backbone is frozen waits forever for gradients that never come (DDP's "Expected to have
finished reduction" at the next step).

Two gloo processes on the CPU step through the epochs as `vitpose train` does (`begin_epoch`, then
the training step's `forward_backward` through `run.train_model`), each on its own half of one
batch; every gradient must equal the single-process gradient of the whole batch, epoch by epoch.
"""

import socket
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp

from vitpose.engine import session as session_module
from vitpose.engine.distributed import cleanup, init_distributed
from vitpose.engine.precision import Precision
from vitpose.engine.session import begin_epoch, wrap_for_training
from vitpose.engine.trainer import TrainRun, forward_backward
from vitpose.models import build_model

WORLD, PER_RANK, K = 2, 2, 3
FREEZE_EPOCHS = 1
EPOCHS = 3  # frozen, unfrozen, unfrozen (no change: the wrapper stays)
FP32 = Precision("cpu", None, None)


def tiny_model():
    # the simple decoder (no BatchNorm: per-rank batch statistics would differ from the whole
    # batch's) and no drop path (no randomness), so the two-rank average is the one-process answer
    torch.manual_seed(0)
    model = build_model("vitpose-s", decoder="simple", depth=2, embed_dim=32, num_heads=2, drop_path_rate=0.0,
                        num_keypoints=K, img_size=(64, 48))
    with torch.no_grad():  # the N(0, 0.001) head init would leave the backbone gradients ~1e-6
        model.head.final_layer.weight.normal_(0, 0.1)
    return model


def one_batch():
    g = torch.Generator().manual_seed(1)
    images = torch.randn(WORLD * PER_RANK, 3, 64, 48, generator=g)
    heatmaps = torch.rand(WORLD * PER_RANK, K, 16, 12, generator=g)
    return images, heatmaps, torch.ones(WORLD * PER_RANK, K)


def training_session(model, ctx, compile_model=False):
    """What begin_epoch reads of a Session: the run, its position, the config and the messages."""
    cfg = SimpleNamespace(train=SimpleNamespace(freeze_backbone_epochs=FREEZE_EPOCHS, compile=compile_model),
                          distill=SimpleNamespace(teacher=None, head_epochs=0))  # the Config fields begin_epoch reads
    run = TrainRun(model, wrap_for_training(model, cfg, ctx), None, None, FP32, ctx,
                   SimpleNamespace(epoch=0))
    return SimpleNamespace(train_run=run, state=run.state, cfg=cfg, ctx=ctx,
                           telemetry=SimpleNamespace(message=lambda text: None))


def step_gradients(run, batch):
    """One training step's forward and backward through the wrapper; each parameter's gradient
    (None: it got none)."""
    run.train_model.zero_grad(set_to_none=True)
    forward_backward(run.train_model, *batch, FP32)
    return {n: None if p.grad is None else p.grad.detach().clone() for n, p in run.model.named_parameters()}


def _rank(rank, port, out_dir):
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    ctx = init_distributed("cpu")
    try:
        shard = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        batch = tuple(t[shard] for t in one_batch())
        session = training_session(tiny_model(), ctx)
        grads, wrappers = [], []
        for epoch in range(EPOCHS):
            session.state.epoch = epoch
            begin_epoch(session)
            wrappers.append(id(session.train_run.train_model))
            grads.append(step_gradients(session.train_run, batch))
        torch.save({"grads": grads, "wrappers": wrappers, "kind": type(session.train_run.train_model).__name__},
                   f"{out_dir}/rank{rank}.pt")
    finally:
        cleanup(ctx)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("unfreeze")
    mp.spawn(_rank, args=(free_port(), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def whole_batch_gradients():
    model = tiny_model()
    model.zero_grad(set_to_none=True)
    forward_backward(model, *one_batch(), FP32)
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_each_epochs_gradients_are_the_whole_batch_gradients_on_every_rank(two_ranks):
    whole = whole_batch_gradients()
    for rank in two_ranks:
        assert rank["kind"] == "DistributedDataParallel"
        for epoch, grads in enumerate(rank["grads"]):
            frozen = epoch < FREEZE_EPOCHS
            for name, grad in grads.items():
                if frozen and name.startswith("backbone."):
                    assert grad is None, (epoch, name)  # frozen: no gradient, so AdamW leaves it alone
                    continue
                assert grad is not None, (epoch, name)
                # the two-rank mean of half-batch gradients vs one pass over the whole batch:
                # the same sums in another order, so float32 rounding apart (the epoch-0 gradients
                # of the head are the same numbers as the later ones: nothing stepped)
                torch.testing.assert_close(grad, whole[name], rtol=1e-5, atol=1e-7, msg=f"epoch {epoch}, {name}")
    # each rank's own half-batch gradient is far from it: the check above sees a missing all-reduce
    own = whole_batch_gradients_of_half()
    name = "backbone.blocks.0.attn.qkv.weight"
    assert (own[name] - whole[name]).abs().max() > 1e-2 * whole[name].abs().max()


def whole_batch_gradients_of_half():
    model = tiny_model()
    forward_backward(model, *(t[:PER_RANK] for t in one_batch()), FP32)
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_the_wrapper_is_rebuilt_only_when_the_trainable_set_changes(two_ranks):
    for rank in two_ranks:
        frozen, unfrozen, still_unfrozen = rank["wrappers"]
        assert frozen != unfrozen and unfrozen == still_unfrozen


class TracedAt:
    """Stands in for torch.compile's module (which specialises its graph to the requires_grad
    flags it was traced with): remembers the trainable set when it was built and refuses to run
    the model once that set has changed."""

    def __init__(self, model):
        self.model = model
        self.trainable = {n for n, p in model.named_parameters() if p.requires_grad}

    def __call__(self, images):
        now = {n for n, p in self.model.named_parameters() if p.requires_grad}
        assert now == self.trainable, f"a wrapper built for {len(self.trainable)} trainable tensors runs {len(now)}"
        return self.model(images)

    def zero_grad(self, set_to_none=True):
        self.model.zero_grad(set_to_none=set_to_none)


def test_a_compiled_model_is_compiled_again_after_the_backbone_unfreezes(monkeypatch):
    monkeypatch.setattr(session_module.torch, "compile", TracedAt)  # torch.compile's import alone takes seconds
    ctx = SimpleNamespace(distributed=False)
    session = training_session(tiny_model(), ctx, compile_model=True)
    batch = tuple(t[:PER_RANK] for t in one_batch())
    built = []
    for epoch in range(EPOCHS):
        session.state.epoch = epoch
        begin_epoch(session)
        assert isinstance(session.train_run.train_model, TracedAt)
        built.append(session.train_run.train_model)
        grads = step_gradients(session.train_run, batch)
        assert all((grads[n] is None) == (epoch < FREEZE_EPOCHS) for n in grads if n.startswith("backbone."))
    assert built[0] is not built[1] and built[1] is built[2]
