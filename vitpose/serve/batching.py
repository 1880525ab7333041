"""Request batching: the images of concurrent requests share forward passes of one predictor.

One thread (`BatchRunner`) runs a function it is given, `run_batch(images, boxes, labels,
failures) -> [Poses | None]` (`vitpose.serve.app.batch_function`: the predictor's one pipeline
through `vitpose.inference.runner.predict_chunk`). Requests `submit(image, boxes)` and get a
`concurrent.futures.Future` of the image's `Poses`. The thread takes the first waiting job, then
gathers more until their crops reach `max_batch` or `max_wait` has passed since the first, and
hands them to the function as one batch. A job that would overflow the batch waits for the next one.
A job without boxes passes None for its image: the pipeline's detector finds its people.

Fair to every request: a job of more boxes than `max_batch` is cut into slices of `max_batch`
boxes, and the jobs take turns (one slice each per batch, in the order they came), so one request
of many boxes holds the model for one batch at a time, never past the others' timeout. A job's
future stays pending until its last slice is done: a request that gives up (its timeout, or its
client gone) cancels it, and its remaining slices are dropped before the next batch.

One request's bad input never fails another's: images are decoded and boxes checked before they
are submitted, and if a batch still fails, `predict_chunk` runs its images one by one (the
project's one rule for that) and keeps each failure in `failures.errors`; each job gets its own
error. A cancelled job is dropped (never computed further). The batcher
knows nothing of the predictor: it never sets its batch size or wraps its network.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from vitpose.inference.results import Poses
from vitpose.inference.runner import Failures

__all__ = ["BatchRunner", "Metrics"]

_STOP = object()


def _weight(boxes) -> int:
    """Crops that boxes add to a batch; a detector's count is unknown before it runs: one person."""
    return max(1, len(boxes)) if boxes is not None else 1


class _Job:
    __slots__ = ("image", "slices", "done", "future")

    def __init__(self, image: np.ndarray, boxes, max_batch: int):
        self.image = image  # BGR uint8 (H, W, 3), as `vitpose predict` decodes
        # (M, 5) float32 xyxy + score in slices of at most max_batch, or [None]: the detector finds them
        if boxes is None or len(boxes) <= max_batch:
            self.slices = deque([boxes])
        else:
            self.slices = deque(boxes[i:i + max_batch] for i in range(0, len(boxes), max_batch))
        self.done: list = []  # the poses of the slices computed so far
        self.future: Future = Future()  # pending until the last slice is done: cancelling it drops the rest

    def finish(self, result=None, error: BaseException | None = None) -> None:
        self.slices.clear()
        self.image = None  # its memory goes now: the pixel budget counts it free once the request is answered
        if not self.future.set_running_or_notify_cancel():  # cancelled meanwhile: nobody waits for it
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


def _joined(parts: list):
    """One image's poses from those of its slices of boxes (in order)."""
    if len(parts) == 1:
        return parts[0]
    joined = Poses(*(np.concatenate([getattr(p, name) for p in parts])
                     for name in ("boxes", "box_scores", "keypoints", "keypoint_scores")))
    for name in ("keypoint_p", "keypoint_visibility"):  # a calibrated model's: all slices or none
        if all(getattr(p, name) is not None for p in parts):
            setattr(joined, name, np.concatenate([getattr(p, name) for p in parts]))
    return joined


class BatchRunner:
    """The batch thread: `submit(image, boxes)` -> Future[Poses] (see the module docstring).

    run_batch(images, boxes, labels, failures) -> one `Poses` or None per image: a None is a failed
    image, its exception in `failures.errors[label]` (`predict_chunk`'s contract).
    max_batch: crops gathered into one batch (the predictor's batch size: one forward pass).
    max_wait: seconds a batch waits for more requests after its first one.
    """

    def __init__(self, run_batch: Callable, max_batch: int, max_wait: float, prog: str = "vitpose serve"):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.run_batch = run_batch
        self.max_batch = int(max_batch)
        self.max_wait = float(max_wait)
        self.prog = prog
        self._queue: queue.Queue = queue.Queue()
        self._turns: deque[_Job] = deque()  # jobs with slices left, in the order of their turns (the thread's)
        self._thread = threading.Thread(target=self._loop, name="vitpose-batches", daemon=True)
        self._thread.start()

    def submit(self, image: np.ndarray, boxes=None) -> Future:
        job = _Job(image, boxes, self.max_batch)
        self._queue.put(job)
        return job.future

    def close(self, timeout: float = 30.0) -> None:
        """Finish the jobs already submitted, then stop the thread."""
        self._queue.put(_STOP)
        self._thread.join(timeout)

    # --- the thread ------------------------------------------------------------------------

    def _gather(self) -> bool:
        """Move submitted jobs to their turns: block for the first when none has one, then wait
        until the next slices reach `max_batch` crops or `max_wait` has passed; True on a stop."""
        if not self._turns:
            job = self._queue.get()
            if job is _STOP:
                return True
            self._turns.append(job)
        deadline = time.monotonic() + self.max_wait
        while True:  # every job already submitted takes its turn; wait for more only while the batch is short
            short = sum(_weight(job.slices[0]) for job in self._turns if job.slices) < self.max_batch
            left = deadline - time.monotonic() if short else 0
            try:
                job = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is _STOP:
                return True
            self._turns.append(job)
        return False

    def _next_batch(self) -> list[tuple[_Job, object]]:
        """(job, slice of boxes) pairs of the next batch: one slice of each job in turn, up to
        `max_batch` crops; a job that gave a slice goes to the end of the turns."""
        turns, self._turns = self._turns, deque()
        for job in turns:  # drops the jobs that are done (failed) or cancelled (their request gave up)
            if job.slices and job.future.cancelled():
                job.finish()  # its waiters are told it was dropped
            elif job.slices:
                self._turns.append(job)
        batch, crops, again = [], 0, []
        while self._turns:
            weight = _weight(self._turns[0].slices[0])
            if batch and crops + weight > self.max_batch:
                break  # it starts the next batch
            job = self._turns.popleft()
            batch.append((job, job.slices.popleft()))
            crops += weight
            if job.slices:
                again.append(job)
        self._turns.extend(again)
        return batch

    def _loop(self) -> None:
        stop = False
        while True:
            if not stop:
                stop = self._gather()
            elif not self._turns:  # stopped: what is still queued is finished too, then the thread ends
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    return
                if job is not _STOP:
                    self._turns.append(job)
                continue
            batch = self._next_batch()
            if batch:
                self._run(batch)

    def _run(self, batch: list[tuple[_Job, object]]) -> None:
        """One call of the function; each job gets its poses (after its last slice) or its own error."""
        labels = list(range(len(batch)))
        # no traceback here: the request's error handler answers a bug with 500 and the server logs it once
        failures = Failures(self.prog, show_tracebacks=False)
        try:
            found = self.run_batch([job.image for job, _ in batch], [boxes for _, boxes in batch], labels, failures)
        except Exception as e:  # noqa: BLE001 - the function itself failed: no request may wait for ever
            for job, _ in batch:
                job.finish(error=e)
            return
        for label, (job, _), poses in zip(labels, batch, found):
            if label in failures.errors:
                job.finish(error=failures.errors[label])
            else:
                job.done.append(poses)
                if not job.slices:
                    try:
                        joined = _joined(job.done)
                    except Exception as e:  # noqa: BLE001 - the function's answers do not join: this job's bug
                        job.finish(error=e)
                    else:
                        job.finish(joined)


class Metrics:
    """Counters and histograms of the server, as Prometheus text (`render`). Thread-safe."""

    LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
    BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.forward_passes = 0
        self.crops = 0
        self.forward_seconds = 0.0
        self.in_flight = 0
        self._batch = _Histogram(self.BATCH_BUCKETS)
        self._latency: dict[str, _Histogram] = {}

    def forward(self, crops: int, seconds: float) -> None:
        """One forward pass of `crops` crops that took `seconds`."""
        with self._lock:
            self.forward_passes += 1
            self.crops += crops
            self.forward_seconds += seconds
            self._batch.observe(crops)

    def pipeline_call(self, crops: int, batch_size: int, seconds: float) -> None:
        """One call of the top-down pipeline: its `crops` went through the network `batch_size` at a
        time (`TopDown`'s rule, one pass per slice) in `seconds` (its timer's "pose" stage)."""
        sizes = [min(batch_size, crops - start) for start in range(0, crops, max(1, batch_size))]
        for size in sizes:
            self.forward(size, seconds / len(sizes))

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        with self._lock:
            key = (endpoint, int(status))
            self.requests[key] = self.requests.get(key, 0) + 1
            self._latency.setdefault(endpoint, _Histogram(self.LATENCY_BUCKETS)).observe(seconds)

    def started(self, delta: int) -> None:
        with self._lock:
            self.in_flight += delta

    def render(self) -> str:
        with self._lock:
            lines = ["# HELP vitpose_requests_total HTTP requests answered, by endpoint and status.",
                     "# TYPE vitpose_requests_total counter"]
            for (endpoint, status), n in sorted(self.requests.items()):
                lines.append(f'vitpose_requests_total{{endpoint="{endpoint}",status="{status}"}} {n}')
            lines += ["# HELP vitpose_errors_total HTTP requests answered with a 4xx or 5xx status.",
                      "# TYPE vitpose_errors_total counter"]
            errors: dict[tuple[str, int], int] = {}
            for (endpoint, status), n in self.requests.items():
                if status >= 400:
                    errors[(endpoint, status)] = n
            for (endpoint, status), n in sorted(errors.items()):
                lines.append(f'vitpose_errors_total{{endpoint="{endpoint}",status="{status}"}} {n}')
            lines += ["# HELP vitpose_forward_passes_total Forward passes of the pose network.",
                      "# TYPE vitpose_forward_passes_total counter", f"vitpose_forward_passes_total {self.forward_passes}",
                      "# HELP vitpose_crops_total Person crops through the pose network.",
                      "# TYPE vitpose_crops_total counter", f"vitpose_crops_total {self.crops}",
                      "# HELP vitpose_forward_seconds_total Seconds in the pose network.",
                      "# TYPE vitpose_forward_seconds_total counter",
                      f"vitpose_forward_seconds_total {self.forward_seconds:.6f}",
                      "# HELP vitpose_in_flight Requests being answered now.",
                      "# TYPE vitpose_in_flight gauge", f"vitpose_in_flight {self.in_flight}",
                      "# HELP vitpose_batch_size Crops per forward pass.", "# TYPE vitpose_batch_size histogram"]
            lines += self._batch.lines("vitpose_batch_size")
            lines += ["# HELP vitpose_request_seconds Seconds from a request's arrival to its answer.",
                      "# TYPE vitpose_request_seconds histogram"]
            for endpoint, histogram in sorted(self._latency.items()):
                lines += histogram.lines("vitpose_request_seconds", f'endpoint="{endpoint}"')
        return "\n".join(lines) + "\n"


class _Histogram:
    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        out = [f'{name}_bucket{{{labels}{sep}le="{bound:g}"}} {n}' for bound, n in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        suffix = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{suffix} {self.sum:.6f}", f"{name}_count{suffix} {self.count}"]
        return out
