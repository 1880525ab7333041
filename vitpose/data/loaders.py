"""Training and validation batches from ONE pool of worker processes.

Why one pool: the usual setup is a persistent training DataLoader plus a second DataLoader for
validation. At the first validation the training workers stay alive (they are persistent) while
the validation loader starts as many again, so host memory doubles exactly when a long run
reaches its first checkpoint, and it can die there (32 + 32 workers on a 64-core host).

Design (kept small on purpose):

- One `torch.utils.data.DataLoader` with `persistent_workers=True` over `_PhaseDataset`, whose
  items are keys `(source, index, epoch)`: source 0 is the training set, 1 the validation set.
  It looks the sample up as `sets[source][(index, epoch)]`, the dataset protocol of
  `CocoKeypoints` (every random draw is a pure function of (seed, epoch, index)), so workers
  hold no epoch state and never need to be told that an epoch changed.
- Its batch sampler, `_PlannedBatchSampler`, yields whatever list of key batches the main
  process planned for the current phase. `Loaders.train(epoch)` / `Loaders.val()` set the plan
  and call `iter(loader)`. With persistent workers, `iter()` reuses the same worker processes
  (torch calls `_reset` on its one iterator instead of starting new workers), so the pool is
  started once, at the first phase, and shut down by `close()`.
- Phase switches: torch's `_reset` first waits until every worker has acknowledged the new
  phase and drops any batch still in flight from the old one, so a phase abandoned mid-way
  (an exception, `break`, a time-limited run) cannot leak batches into the next phase. The cost
  is that each phase starts with an empty prefetch queue, the same as a plain persistent
  DataLoader between two epochs. Interleaving two phases (asking the training iterator for
  another batch after validation started) raises instead of silently mixing data.
- Order: training indices are shuffled by a generator seeded with `seed + epoch` and sharded
  exactly like `torch.utils.data.DistributedSampler(shuffle=True, seed=seed)` (padded by
  repetition to a multiple of world_size, then every world_size-th index from `rank`).
  `train(epoch, start_batch)` is the tail of the full epoch, so a resumed run sees the same
  batches. Validation is in dataset order, strided by rank without padding (no duplicates to
  drop; ranks may differ by one sample). Neither depends on `num_workers`.
- Memory: before starting workers, `estimate_worker_bytes` adds a documented per-process
  constant, the dataset's own size (a worker may end up with a private copy) and the batches
  it holds (prefetch_factor + the one it builds); `cap_workers` lowers num_workers, with a
  message naming the figures, when the pool would not fit in `psutil.virtual_memory().available`.

Batches carry uint8 images: `to_device(batch, device)` moves them (non-blocking from pinned
memory) and normalises on the device, so host-to-device traffic is a quarter of float32.
"""

from __future__ import annotations

import contextlib
import logging
import math
import mmap
import os
import random
import signal
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .pixels import normalize_images

log = logging.getLogger(__name__)

TRAIN, VAL = 0, 1

# Private memory of one forked worker before it holds any batch: the interpreter's pages that
# reference counting dirties, torch/cv2 per-process state and JPEG decode buffers. Measured as
# the PSS growth of one idle-then-decoding worker on Linux (torch 2.x, opencv 4.x): 120-250 MiB;
# the upper end is used so that the cap errs on the safe side.
WORKER_BASE_BYTES = 256 * 2**20
# Share of the available RAM the worker pool may take; the rest is left for the main process
# (model, optimiser, pinned batches, the evaluator's predictions) and the rest of the machine.
RAM_BUDGET_FRACTION = 0.8


# ----------------------------------------------------------------------------------------------
# Index plans: which samples, in which order, on which rank


def train_indices(num_samples: int, epoch: int, seed: int = 0, rank: int = 0, world_size: int = 1) -> list[int]:
    """This rank's training indices for `epoch`, as `DistributedSampler(shuffle=True)` gives them."""
    _check_rank(rank, world_size)
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    indices = torch.randperm(num_samples, generator=g).tolist()
    total = math.ceil(num_samples / world_size) * world_size
    padding = total - num_samples
    if padding and indices:
        # Repeat the shuffled order (as often as needed) so that every rank gets as many samples.
        indices += (indices * math.ceil(padding / len(indices)))[:padding]
    return indices[rank:total:world_size]


def val_indices(num_samples: int, rank: int = 0, world_size: int = 1) -> list[int]:
    """This rank's validation indices: dataset order, strided, no padding and no duplicates."""
    _check_rank(rank, world_size)
    return list(range(rank, num_samples, world_size))


def batched(indices: Sequence[int], batch_size: int, drop_last: bool = False) -> list[list[int]]:
    """Consecutive batches of `indices`; the short last one is dropped when `drop_last`."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    stop = len(indices) - len(indices) % batch_size if drop_last else len(indices)
    return [list(indices[i:i + batch_size]) for i in range(0, stop, batch_size)]


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")


# ----------------------------------------------------------------------------------------------
# Worker count and memory


def default_num_workers() -> int:
    """Half the logical cores this process may use, shared among the processes of this node."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    local_procs = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, cores // 2 // max(1, local_procs))


def sample_nbytes(sample: Any) -> int:
    """Bytes of the tensors and arrays in one sample (nested dicts/lists included)."""
    if isinstance(sample, torch.Tensor):
        return sample.numel() * sample.element_size()
    if isinstance(sample, np.ndarray):
        return sample.nbytes
    if isinstance(sample, dict):
        return sum(sample_nbytes(v) for v in sample.values())
    if isinstance(sample, (list, tuple)):
        return sum(sample_nbytes(v) for v in sample)
    return sys.getsizeof(sample)


def dataset_nbytes(dataset: Any, _depth: int = 0) -> int:
    """Approximate size of a dataset object: its arrays plus its Python containers.

    A forked worker shares these pages at first, but reference counting dirties the pages of
    Python objects it touches, and a spawned worker gets a full copy; counting all of it keeps
    the estimate on the safe side. Memory-mapped arrays count nothing (the page cache is shared).
    A dataset may report its own figure as an integer `nbytes` attribute.
    """
    if isinstance(dataset, np.ndarray):
        # A memory-mapped file (a crop cache) lives in the page cache, shared by every process.
        return 0 if _file_backed(dataset) else dataset.nbytes
    if isinstance(dataset, mmap.mmap):
        return 0
    own = getattr(dataset, "nbytes", None)
    if isinstance(own, int):
        return own
    if isinstance(dataset, torch.Tensor):
        return dataset.numel() * dataset.element_size()
    if _depth > 4:
        return sys.getsizeof(dataset)
    if isinstance(dataset, dict):
        return sys.getsizeof(dataset) + _items_nbytes(list(dataset.items()), _depth + 1)
    if isinstance(dataset, (list, tuple, set, frozenset)):
        return sys.getsizeof(dataset) + _items_nbytes(list(dataset), _depth + 1)
    if hasattr(dataset, "__dict__") and not isinstance(dataset, type):
        return sys.getsizeof(dataset) + dataset_nbytes(vars(dataset), _depth + 1)
    return sys.getsizeof(dataset)


def _file_backed(array: np.ndarray) -> bool:
    base = array
    while base is not None:
        if isinstance(base, (np.memmap, mmap.mmap)):
            return True
        base = getattr(base, "base", None)
    return False


def _items_nbytes(items: list, depth: int) -> int:
    # Big collections of records are uniform: measure up to 1000 of them and extrapolate.
    if not items:
        return 0
    step = max(1, len(items) // 1000)
    probe = items[::step][:1000]
    return sum(dataset_nbytes(v, depth) for v in probe) * len(items) // len(probe)


@dataclass
class MemoryEstimate:
    per_worker_bytes: int
    base_bytes: int
    dataset_bytes: int
    batch_bytes: int
    prefetch_factor: int

    def describe(self) -> str:
        mib = 2**20
        return (f"{self.per_worker_bytes / mib:.0f} MiB per worker = {self.base_bytes / mib:.0f} MiB process"
                f" + {self.dataset_bytes / mib:.0f} MiB dataset + ({self.prefetch_factor} prefetched + 1)"
                f" x {self.batch_bytes / mib:.1f} MiB batches")


def estimate_worker_bytes(datasets: Sequence[Any], sample_bytes: int, batch_size: int,
                          prefetch_factor: int) -> MemoryEstimate:
    """Memory one worker adds: process overhead + dataset copy + the batches it holds."""
    data = sum(dataset_nbytes(d) for d in datasets if d is not None)
    batch = sample_bytes * batch_size
    total = WORKER_BASE_BYTES + data + (prefetch_factor + 1) * batch
    return MemoryEstimate(total, WORKER_BASE_BYTES, data, batch, prefetch_factor)


def available_ram_bytes() -> int:
    """RAM available to this process's worker pool (shared among the processes of this node)."""
    local_procs = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return psutil.virtual_memory().available // local_procs


def cap_workers(requested: int, estimate: MemoryEstimate, available: int | None = None) -> tuple[int, str | None]:
    """The largest worker count <= requested whose pool fits in the RAM budget, and why it was cut."""
    if requested <= 0:
        return 0, None
    available = available_ram_bytes() if available is None else available
    budget = RAM_BUDGET_FRACTION * available
    fits = int(budget // estimate.per_worker_bytes)
    if fits >= requested:
        return requested, None
    gib = 2**30
    message = (f"num_workers capped from {requested} to {fits}: {estimate.describe()}; "
               f"{requested} workers would need {requested * estimate.per_worker_bytes / gib:.1f} GiB, "
               f"but only {available / gib:.1f} GiB RAM is available ({RAM_BUDGET_FRACTION:.0%} of it "
               f"is given to the workers). Lower loader.batch_size or loader.prefetch_factor, "
               f"or free memory, to get more workers.")
    return fits, message


# ----------------------------------------------------------------------------------------------
# The one DataLoader


class _PhaseDataset(Dataset):
    """Items are keys `(source, index, epoch)`; source 0 = training set, 1 = validation set."""

    def __init__(self, train_set, val_set):
        self.sets = (train_set, val_set)

    def __len__(self) -> int:
        return sum(len(s) for s in self.sets if s is not None)

    def __getitem__(self, key):
        source, index, epoch = key
        sample = self.sets[source][(index, epoch)]
        if isinstance(sample, dict) and "index" not in sample:
            sample["index"] = index  # lets the evaluator and tests see which sample it was
        return sample


class _PlannedBatchSampler(Sampler):
    """Yields the batches of keys the main process planned for the current phase."""

    def __init__(self):
        self.plan: list[list[tuple[int, int, int]]] = []

    def __iter__(self) -> Iterator[list[tuple[int, int, int]]]:
        return iter(list(self.plan))  # a snapshot: the next phase may replace `plan`

    def __len__(self) -> int:
        return len(self.plan)


@contextlib.contextmanager
def cv2_threads_parked():
    """Fork with OpenCV's thread pool stopped, then restore the parent's thread count.

    A forked child inherits the pool's condition variables but not its threads; if the parent's
    pool threads were waiting at the fork, the child's `cv2.setNumThreads` blocks forever in
    pthread_cond_destroy (seen with opencv 4.x: ~1 fork in 4 hung after the main process had
    decoded a sample). With one thread there are no pool threads to inherit.
    """
    try:
        import cv2
    except ImportError:
        yield
        return
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        cv2.setNumThreads(threads)


# Ctrl-C reaches the whole foreground process group, and `timeout`, `kill -- -PGID`, systemd's
# stop and Slurm's job signals send SIGTERM to the whole group. Only the main process acts on
# them (it finishes the step, saves, then shuts the pool down); a worker would otherwise run the
# handler it inherited (announce a stop it cannot carry out) or, without one, die and break the
# step in flight (and the save with it).
WORKER_IGNORED_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM") if hasattr(signal, n))


@contextlib.contextmanager
def worker_signals_deferred() -> Iterator[None]:
    """Around the fork of the worker pool: SIGINT/SIGTERM are blocked in the forking thread, so a
    worker is born with them blocked and cannot die of one before `_init_worker` ignores them
    (a signal that came in between stays pending and is discarded once ignored). The main
    process gets its own pending signal when the block is lifted."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_IGNORED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _init_worker(worker_id: int, seed: int, rank: int) -> None:
    for signum in WORKER_IGNORED_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, WORKER_IGNORED_SIGNALS)
    # One thread per worker: N workers x M library threads on N cores only thrash.
    torch.set_num_threads(1)
    try:
        import cv2
        cv2.setNumThreads(1)
    except ImportError:
        pass
    # Distinct, reproducible seeds for any code that draws from global generators (the
    # datasets themselves draw from (seed, epoch, index) and do not need this).
    ss = np.random.SeedSequence([seed, rank, worker_id])
    np.random.seed(ss.generate_state(1)[0])
    random.seed(int(ss.generate_state(2)[1]))


class _Phase:
    """An iterable over one phase's batches, with a length."""

    def __init__(self, loaders: Loaders, keys: list[list[tuple[int, int, int]]]):
        self._loaders = loaders
        self._keys = keys

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self):
        return self._loaders.batches(self._keys)


class Loaders:
    """Training and validation batches from one worker pool; see the module docstring.

    Attributes: `train_batches_per_epoch`, `val_batches`, `num_workers` (effective, after the
    RAM cap), `requested_workers`, `pin_memory`, `memory` (the estimate) and `memory_note` (the
    cap's message, or None).
    """

    def __init__(self, train_set, val_set, loader_cfg, seed: int = 0, rank: int = 0, world_size: int = 1,
                 available_ram: int | None = None):
        _check_rank(rank, world_size)
        if train_set is None and val_set is None:
            raise ValueError("build_loaders needs a training set, a validation set or both")
        for name, ds in (("training", train_set), ("validation", val_set)):
            if ds is not None and len(ds) == 0:
                raise ValueError(f"the {name} set is empty")
        self.train_set, self.val_set = train_set, val_set
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.batch_size = loader_cfg.batch_size
        self.val_batch_size = loader_cfg.val_batch_size
        self.drop_last = loader_cfg.drop_last
        self.prefetch_factor = loader_cfg.prefetch_factor
        if self.batch_size < 1 or self.val_batch_size < 1:
            raise ValueError(f"loader.batch_size ({self.batch_size}) and loader.val_batch_size "
                             f"({self.val_batch_size}) must be >= 1")
        if self.prefetch_factor < 1:
            raise ValueError(f"loader.prefetch_factor must be >= 1, got {self.prefetch_factor}")

        requested = default_num_workers() if loader_cfg.num_workers is None else loader_cfg.num_workers
        if requested < 0:
            raise ValueError(f"loader.num_workers must be >= 0 or null (auto), got {requested}")
        self.requested_workers = requested
        self.memory = self._estimate_memory()
        self.num_workers, self.memory_note = cap_workers(requested, self.memory, available_ram)
        if self.memory_note:
            log.warning(self.memory_note)
        self.pin_memory = bool(loader_cfg.pin_memory) and torch.cuda.is_available()

        self._sampler = _PlannedBatchSampler()
        workers = self.num_workers > 0
        self._loader = DataLoader(
            _PhaseDataset(train_set, val_set),
            batch_sampler=self._sampler,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            prefetch_factor=self.prefetch_factor if workers else None,
            persistent_workers=workers,
            worker_init_fn=partial(_init_worker, seed=seed, rank=rank) if workers else None,
            # Its own generator: the workers' base seed must not consume the global torch RNG
            # (which would make model initialisation depend on when the loaders were built).
            generator=torch.Generator().manual_seed(seed * 1000 + rank),
        )
        self._phase_id = 0
        self._closed = False

    def _estimate_memory(self) -> MemoryEstimate:
        sample = 0
        for source, ds in ((TRAIN, self.train_set), (VAL, self.val_set)):
            if ds is not None:
                sample = max(sample, sample_nbytes(_PhaseDataset(self.train_set, self.val_set)[(source, 0, 0)]))
        batch_size = max(self.batch_size if self.train_set is not None else 0,
                         self.val_batch_size if self.val_set is not None else 0)
        return estimate_worker_bytes([self.train_set, self.val_set], sample, batch_size, self.prefetch_factor)

    # -- plans ---------------------------------------------------------------------------------

    def _train_keys(self, epoch: int) -> list[list[tuple[int, int, int]]]:
        if self.train_set is None:
            raise RuntimeError("these loaders were built without a training set")
        indices = train_indices(len(self.train_set), epoch, self.seed, self.rank, self.world_size)
        return [[(TRAIN, i, epoch) for i in b] for b in batched(indices, self.batch_size, self.drop_last)]

    def _val_keys(self) -> list[list[tuple[int, int, int]]]:
        if self.val_set is None:
            raise RuntimeError("these loaders were built without a validation set")
        indices = val_indices(len(self.val_set), self.rank, self.world_size)
        return [[(VAL, i, 0) for i in b] for b in batched(indices, self.val_batch_size)]

    @property
    def train_batches_per_epoch(self) -> int:
        if self.train_set is None:
            return 0
        per_rank = math.ceil(len(self.train_set) / self.world_size)
        return per_rank // self.batch_size if self.drop_last else math.ceil(per_rank / self.batch_size)

    @property
    def val_batches(self) -> int:
        if self.val_set is None:
            return 0
        return math.ceil(len(val_indices(len(self.val_set), self.rank, self.world_size)) / self.val_batch_size)

    # -- phases --------------------------------------------------------------------------------

    def train(self, epoch: int, start_batch: int = 0) -> _Phase:
        """This rank's training batches of `epoch`, from batch `start_batch` on (exact resume)."""
        keys = self._train_keys(epoch)
        if not 0 <= start_batch <= len(keys):
            raise ValueError(f"start_batch {start_batch} is outside [0, {len(keys)}] for epoch {epoch}")
        return _Phase(self, keys[start_batch:])

    def val(self) -> _Phase:
        """This rank's validation batches, in dataset order (each sample carries its `index`)."""
        return _Phase(self, self._val_keys())

    def batches(self, keys):
        """The batches of `keys` (one list of (source, index, epoch) per batch) from the worker pool."""
        if self._closed:
            raise RuntimeError("the loaders were closed")
        self._phase_id += 1
        token = self._phase_id
        if not keys:
            return
        self._sampler.plan = keys
        if self._loader._iterator is None and self.num_workers > 0:
            with cv2_threads_parked(), worker_signals_deferred():  # the first iter() forks the pool
                batches = iter(self._loader)
        else:
            batches = iter(self._loader)  # persistent workers: the same pool, reset to the new plan
        while True:
            if self._phase_id != token:
                raise RuntimeError("a newer train()/val() phase started while this one was being "
                                   "iterated; finish (or drop) one phase before starting the next")
            try:
                batch = next(batches)
            except StopIteration:
                return
            yield batch

    def worker_pids(self) -> list[int]:
        """Process ids of the live worker pool (empty before the first phase or without workers)."""
        it = self._loader._iterator
        if it is None:
            return []
        return [w.pid for w in getattr(it, "_workers", []) if w.is_alive()]

    def close(self) -> None:
        """Stop the worker pool (also done when the object is collected)."""
        self._closed = True
        it = self._loader._iterator
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self._loader._iterator = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def build_loaders(train_set, val_set, loader_cfg, seed: int = 0, rank: int = 0, world_size: int = 1,
                  available_ram: int | None = None) -> Loaders:
    """Loaders whose training and validation batches come from one persistent worker pool.

    train_set / val_set: datasets indexed by `(index, epoch)` (`CocoKeypoints`); either may be
    None. loader_cfg: `vitpose.config.LoaderConfig` (batch_size, val_batch_size,
    num_workers (None: half the logical cores), pin_memory (used only when CUDA is available),
    prefetch_factor, drop_last). seed/rank/world_size: the shuffle seed and the
    DistributedSampler-style shard. available_ram: bytes, for tests (default: psutil's figure).

    Returns a `Loaders`: `train(epoch, start_batch=0)`, `val()`, `train_batches_per_epoch`,
    `val_batches`, `num_workers`, `close()`. Each batch is the default collation of the samples,
    plus `index` (the dataset index of each sample).
    """
    return Loaders(train_set, val_set, loader_cfg, seed=seed, rank=rank, world_size=world_size,
                   available_ram=available_ram)


# ----------------------------------------------------------------------------------------------
# Device side


def to_device(batch: dict, device: torch.device | str, normalize: bool = True, non_blocking: bool = True) -> dict:
    """The batch's tensors on `device`; with `normalize`, a uint8 `image` becomes normalised float
    there (`normalize_images`)."""
    out = {k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v
           for k, v in batch.items()}
    image = out.get("image")
    if normalize and isinstance(image, torch.Tensor) and image.dtype == torch.uint8:
        out["image"] = normalize_images(image)
    return out
