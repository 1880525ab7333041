"""One worker pool for training and validation: order, sharding, resume, process count, RAM cap."""

import math
from types import SimpleNamespace

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from vitpose.coco_meta import PIXEL_MEAN, PIXEL_STD
from vitpose.config import LoaderConfig
from vitpose.data import loaders as L
from vitpose.data.loaders import batched, build_loaders, to_device, train_indices, val_indices


class ToyPoses:
    """Stand-in for CocoKeypoints: `ds[(index, epoch)]`, randomness a pure function of (seed, epoch, index)."""

    def __init__(self, n, seed=0, train=True):
        self.n, self.seed, self.train = n, seed, train

    def __len__(self):
        return self.n

    def __getitem__(self, key):
        index, epoch = key
        rng = np.random.default_rng([self.seed, epoch if self.train else 0, index])
        sample = {
            "image": torch.from_numpy(rng.integers(0, 256, (3, 8, 6), dtype=np.uint8)),
            "id": index,
            "center": rng.random(2).astype(np.float32),
        }
        if self.train:
            sample["keypoints"] = torch.from_numpy(rng.random((17, 2), dtype=np.float32))
        return sample


def cfg(**kw):
    base = {"batch_size": 4, "val_batch_size": 3, "num_workers": 0, "pin_memory": False, "prefetch_factor": 2}
    return LoaderConfig(**{**base, **kw})


def as_lists(batches):
    return [(b["index"].tolist(), b["image"].clone(), b.get("keypoints")) for b in batches]


def assert_same(a, b):
    assert len(a) == len(b)
    for (ia, xa, ka), (ib, xb, kb) in zip(a, b):
        assert ia == ib
        assert torch.equal(xa, xb)
        assert (ka is None and kb is None) or torch.equal(ka, kb)


@pytest.mark.parametrize("n", [10, 11, 13])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_train_sharding_matches_distributed_sampler_and_covers_all(n, world_size):
    for epoch in (0, 3):
        shards = []
        for rank in range(world_size):
            ref = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True, seed=7)
            ref.set_epoch(epoch)
            ours = train_indices(n, epoch, seed=7, rank=rank, world_size=world_size)
            assert ours == list(ref)
            shards.append(ours)
        assert len({len(s) for s in shards}) == 1  # every rank takes the same number of steps
        flat = [i for s in shards for i in s]
        assert set(flat) == set(range(n))
        assert len(flat) == math.ceil(n / world_size) * world_size
    assert train_indices(n, 0, seed=7) != train_indices(n, 1, seed=7)  # reshuffled per epoch


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_val_sharding_covers_every_index_once(world_size):
    shards = [val_indices(11, r, world_size) for r in range(world_size)]
    flat = sorted(i for s in shards for i in s)
    assert flat == list(range(11))
    assert all(s == sorted(s) for s in shards)


def test_batched_and_batch_counts():
    assert batched(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert batched(list(range(7)), 3, drop_last=True) == [[0, 1, 2], [3, 4, 5]]
    for drop_last in (False, True):
        for world_size in (1, 2, 3):
            for rank in range(world_size):
                ld = build_loaders(ToyPoses(23), ToyPoses(10, train=False), cfg(drop_last=drop_last),
                                   rank=rank, world_size=world_size)
                assert len(ld.train(0)) == ld.train_batches_per_epoch
                assert len(ld.val()) == ld.val_batches
                sizes = [len(b["index"]) for b in ld.train(0)]
                assert len(sizes) == ld.train_batches_per_epoch
                assert all(s == 4 for s in sizes[:-1])
                if drop_last:
                    assert sizes[-1] == 4


def test_resume_is_the_tail_of_the_epoch():
    ld = build_loaders(ToyPoses(22), None, cfg())
    full = as_lists(ld.train(2))
    assert len(full) == 6
    for start in (0, 1, 5, 6):
        assert_same(as_lists(ld.train(2, start_batch=start)), full[start:])
    with pytest.raises(ValueError, match="start_batch 7"):
        ld.train(2, start_batch=7)


def children():
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_one_pool_through_train_val_train_same_batches_as_single_process():
    train_set, val_set = ToyPoses(26, seed=3), ToyPoses(14, seed=3, train=False)
    ref = build_loaders(train_set, val_set, cfg(num_workers=0), seed=5)
    expected = [as_lists(ref.train(0)), as_lists(ref.val()), as_lists(ref.train(1, start_batch=2))]

    before = children()
    with build_loaders(train_set, val_set, cfg(num_workers=2), seed=5, available_ram=2**40) as ld:
        assert ld.num_workers == 2
        seen, pools = set(), []
        got = []
        for phase in (ld.train(0), ld.val(), ld.train(1, start_batch=2)):
            batches = []
            for batch in phase:
                seen |= children() - before
                batches.append(batch)
            pools.append(tuple(ld.worker_pids()))
            got.append(as_lists(batches))
        assert len(seen) == 2  # never more than num_workers processes, over all three phases
        assert pools[0] == pools[1] == pools[2]  # the same pool, never respawned
    for g, e in zip(got, expected):
        assert_same(g, e)
    assert [b[0] for b in got[1]] == batched(list(range(14)), 3)  # validation in dataset order


class SignalDispositions(ToyPoses):
    """ToyPoses whose samples also carry how the process that built them treats SIGINT/SIGTERM."""

    def __getitem__(self, key):
        import signal
        sample = super().__getitem__(key)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        for name in ("SIGINT", "SIGTERM"):
            signum = getattr(signal, name)
            sample[name] = int(signal.getsignal(signum) is signal.SIG_IGN and signum not in blocked)
        return sample


def test_workers_ignore_sigint_and_sigterm_and_survive_them():
    # A process-group signal (Ctrl-C, `timeout`, `kill -- -PGID`, a scheduler's stop) reaches the
    # workers too: only the main process may act on it, so a worker ignores both and lives on.
    import os
    import signal
    train_set = SignalDispositions(24, seed=1)
    with build_loaders(train_set, None, cfg(num_workers=1, batch_size=2), available_ram=2**40) as ld:
        batches = iter(ld.train(0))
        first = next(batches)
        (worker,) = ld.worker_pids()
        assert worker != os.getpid()
        os.kill(worker, signal.SIGTERM)
        os.kill(worker, signal.SIGINT)
        rest = list(batches)  # a worker killed by either raises "DataLoader worker ... killed by signal"
        assert ld.worker_pids() == [worker]
    assert len(rest) == 11
    for batch in [first, *rest]:
        assert batch["SIGINT"].tolist() == [1, 1] and batch["SIGTERM"].tolist() == [1, 1]
    # The main process keeps its own handlers and an unblocked mask.
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_the_pool_is_forked_with_the_stop_signals_blocked():
    # A signal between the fork and the worker's init cannot kill it: it stays pending until the
    # worker ignores it. The main process gets its own when the block is lifted.
    import signal
    with L.worker_signals_deferred():
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        assert {signal.SIGINT, signal.SIGTERM} <= blocked
    assert not {signal.SIGINT, signal.SIGTERM} & signal.pthread_sigmask(signal.SIG_BLOCK, [])
    import os
    received = []
    old = signal.signal(signal.SIGTERM, lambda *a: received.append(1))
    try:
        with L.worker_signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            assert received == []  # pending while the pool forks
        assert received == [1]
    finally:
        signal.signal(signal.SIGTERM, old)


def test_two_loader_setup_doubles_the_processes():
    # The count above can fail: the usual persistent training loader + a validation loader
    # runs 2 + 2 workers during validation.
    before = children()
    train = DataLoader(range(16), batch_size=4, num_workers=2, persistent_workers=True)
    val = DataLoader(range(8), batch_size=4, num_workers=2)
    list(train)
    peak = 0
    for _ in val:
        peak = max(peak, len(children() - before))
    assert peak == 4
    del train, val


def test_abandoned_phase_does_not_leak_and_interleaving_raises():
    train_set, val_set = ToyPoses(40), ToyPoses(9, train=False)
    with build_loaders(train_set, val_set, cfg(num_workers=2), available_ram=2**40) as ld:
        for i, _ in enumerate(ld.train(0)):
            if i == 1:
                break  # workers still have prefetched training batches in flight
        val = [b["index"].tolist() for b in ld.val()]
        assert val == batched(list(range(9)), 3)
        it = iter(ld.train(1))
        next(it)
        for _ in ld.val():
            pass
        with pytest.raises(RuntimeError, match="newer train"):
            next(it)


def test_order_does_not_depend_on_num_workers():
    ds = ToyPoses(19)
    ref = as_lists(build_loaders(ds, None, cfg(num_workers=0), seed=1).train(4))
    with build_loaders(ds, None, cfg(num_workers=2, prefetch_factor=1), seed=1, available_ram=2**40) as ld:
        assert_same(as_lists(ld.train(4)), ref)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_ram_cap_with_monkeypatched_available_memory(monkeypatch):
    train_set, val_set = ToyPoses(30), ToyPoses(10, train=False)
    config = cfg(num_workers=8, batch_size=4, val_batch_size=3, prefetch_factor=3)
    plenty = build_loaders(train_set, val_set, config, available_ram=2**40)
    assert plenty.num_workers == 8 and plenty.memory_note is None
    est = plenty.memory
    # Analytic: a training sample is 144 image bytes + 8 center bytes + 17*2*4 keypoint bytes
    # + the int id and index; the training batch (4) is larger than the validation one (3).
    sample = 3 * 8 * 6 + 2 * 4 + 17 * 2 * 4 + 2 * int.__sizeof__(1)
    assert est.batch_bytes == 4 * sample
    assert est.per_worker_bytes == L.WORKER_BASE_BYTES + est.dataset_bytes + 4 * est.batch_bytes

    # Room for exactly 2.5 workers' worth of the budget -> 2 workers.
    available = int(2.5 * est.per_worker_bytes / L.RAM_BUDGET_FRACTION)
    monkeypatch.setattr(L.psutil, "virtual_memory", lambda: SimpleNamespace(available=available))
    capped = build_loaders(train_set, val_set, config)
    assert capped.num_workers == 2
    assert "capped from 8 to 2" in capped.memory_note and "GiB" in capped.memory_note
    monkeypatch.setattr(L.psutil, "virtual_memory", lambda: SimpleNamespace(available=available // 10))
    assert build_loaders(train_set, val_set, config).num_workers == 0


def test_dataset_size_counts_arrays_but_not_memory_maps(tmp_path):
    np.save(tmp_path / "pixels.npy", np.zeros(4_000_000, np.uint8))
    ds = ToyPoses(3)
    ds.index = np.zeros((1000, 2), np.float32)  # 8000 bytes, copied by a spawned worker
    ds.pixels = np.load(tmp_path / "pixels.npy", mmap_mode="r")  # page cache, shared
    ds.window = ds.pixels[100:1100].reshape(10, 100)
    size = L.dataset_nbytes(ds)
    assert 8000 <= size < 8000 + 4000


def test_auto_workers_is_half_the_cores(monkeypatch):
    monkeypatch.setattr(L.os, "sched_getaffinity", lambda pid: set(range(12)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert L.default_num_workers() == 6
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert L.default_num_workers() == 3
    ld = build_loaders(ToyPoses(8), None, cfg(num_workers=None), available_ram=2**40)
    assert ld.requested_workers == ld.num_workers == 3
    assert ld.pin_memory == torch.cuda.is_available() or not ld.pin_memory


def test_to_device_normalises_uint8_images():
    batch = next(iter(build_loaders(ToyPoses(4), None, cfg()).train(0)))
    assert batch["image"].dtype == torch.uint8
    moved = to_device(batch, "cpu")
    x = batch["image"].double().numpy()
    mean = np.array(PIXEL_MEAN).reshape(1, 3, 1, 1)
    std = np.array(PIXEL_STD).reshape(1, 3, 1, 1)
    assert moved["image"].dtype == torch.float32
    np.testing.assert_allclose(moved["image"].numpy(), (x - mean) / std, rtol=1e-6, atol=1e-6)
    assert torch.equal(moved["keypoints"], batch["keypoints"])
    assert to_device(batch, "cpu", normalize=False)["image"].dtype == torch.uint8


def test_bad_settings_fail_clearly():
    with pytest.raises(ValueError, match="training set is empty"):
        build_loaders(ToyPoses(0), None, cfg())
    with pytest.raises(ValueError, match="rank 2"):
        build_loaders(ToyPoses(4), None, cfg(), rank=2, world_size=2)
    with pytest.raises(ValueError, match="num_workers"):
        build_loaders(ToyPoses(4), None, cfg(num_workers=-1))


FORK_AFTER_CV2 = r"""
import sys
import cv2, numpy as np, torch
from vitpose.data import loaders
from vitpose.config import LoaderConfig

if sys.argv[1] == "unguarded":
    import contextlib
    loaders.cv2_threads_parked = contextlib.nullcontext

big = np.random.default_rng(0).integers(0, 256, (800, 800, 3), dtype=np.uint8)

class Blurred:
    def __len__(self):
        return 8
    def __getitem__(self, key):
        crop = cv2.GaussianBlur(big, (11, 11), 3)[:8, :6]
        return {"image": torch.from_numpy(crop.transpose(2, 0, 1).copy())}

for trial in range(4):
    cv2.GaussianBlur(big, (11, 11), 3)  # the parent's OpenCV pool threads now exist
    cfg = LoaderConfig(batch_size=4, num_workers=2, pin_memory=False)
    with loaders.build_loaders(Blurred(), None, cfg, available_ram=2**40) as ld:
        assert sum(len(b["image"]) for b in ld.train(trial)) == 8
print("ok")
"""


def test_workers_start_after_the_main_process_used_opencv_threads():
    # Regression: a forked worker calling cv2.setNumThreads hung (about 1 fork in 4) when the
    # main process had run OpenCV's thread pool; run in a subprocess so a hang is a timeout.
    import os
    import subprocess
    import sys
    from pathlib import Path

    import cv2

    if cv2.getNumThreads() < 2:
        pytest.skip("OpenCV runs single-threaded here: nothing to inherit")
    repo = Path(__file__).resolve().parents[1]
    try:
        proc = subprocess.run([sys.executable, "-c", FORK_AFTER_CV2, "guarded"], cwd=repo, timeout=180, check=False,
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(repo)})
    except subprocess.TimeoutExpired:
        pytest.fail("a DataLoader worker hung at start-up after the main process used OpenCV threads")
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
