"""Request batching: the images of concurrent requests share forward passes of one predictor.

One thread (`BatchRunner`) runs a function it is given, `run_batch(images, boxes, labels,
failures) -> [Poses | None]` (`vitpose.serve.app.batch_function`: the predictor's one pipeline
through `vitpose.inference.runner.predict_chunk`). Requests `submit(image, boxes)` and get a
`concurrent.futures.Future` of the image's `Poses`. The thread takes the first waiting job, then
gathers more until their crops reach `max_batch` or `max_wait` has passed since the first, and
hands them to the function as one batch. A job that would overflow the batch waits for the next one.
A job without boxes passes None for its image: the pipeline's detector finds its people.

One request's bad input never fails another's: images are decoded and boxes checked before they
are submitted, and if a batch still fails, `predict_chunk` runs its images one by one (the
project's one rule for that) and keeps each failure in `failures.errors`; each job gets its own
error. A job cancelled before its batch started (its request timed out) is dropped. The batcher
knows nothing of the predictor: it never sets its batch size or wraps its network.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from vitpose.inference.runner import Failures

__all__ = ["BatchRunner", "Metrics"]

_STOP = object()


class _Job:
    __slots__ = ("image", "boxes", "future", "weight")

    def __init__(self, image: np.ndarray, boxes):
        self.image = image  # BGR uint8 (H, W, 3), as `vitpose predict` decodes
        self.boxes = boxes  # (M, 5) float32 xyxy + score, or None: the predictor's detector finds them
        self.future: Future = Future()
        # crops the job adds to a batch; a detector's count is unknown before it runs: one person
        self.weight = max(1, len(boxes)) if boxes is not None else 1


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
        self._held = None  # the job that did not fit the last batch
        self._thread = threading.Thread(target=self._loop, name="vitpose-batches", daemon=True)
        self._thread.start()

    def submit(self, image: np.ndarray, boxes=None) -> Future:
        job = _Job(image, boxes)
        self._queue.put(job)
        return job.future

    def close(self, timeout: float = 30.0) -> None:
        """Finish the jobs already submitted, then stop the thread."""
        self._queue.put(_STOP)
        self._thread.join(timeout)

    # --- the thread ------------------------------------------------------------------------

    def _next_batch(self) -> tuple[list[_Job], bool]:
        """(jobs of the next batch, whether a stop was asked for); blocks for the first job."""
        first = self._held if self._held is not None else self._queue.get()
        self._held = None
        if first is _STOP:
            return [], True
        batch, crops, stop = [first], first.weight, False
        deadline = time.monotonic() + self.max_wait
        while crops < self.max_batch:
            left = deadline - time.monotonic()
            try:
                job = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is _STOP:
                stop = True
                break
            if crops + job.weight > self.max_batch:
                self._held = job  # it starts the next batch
                break
            batch.append(job)
            crops += job.weight
        return batch, stop

    def _loop(self) -> None:
        stop = False
        while not stop or self._held is not None or not self._queue.empty():
            batch, asked = self._next_batch()
            stop = stop or asked
            batch = [job for job in batch if job.future.set_running_or_notify_cancel()]  # drops timed-out jobs
            if batch:
                self._run(batch)

    def _run(self, batch: list[_Job]) -> None:
        """One call of the function; each job gets its poses or its own error."""
        labels = list(range(len(batch)))
        # no traceback here: the request's error handler answers a bug with 500 and the server logs it once
        failures = Failures(self.prog, show_tracebacks=False)
        try:
            found = self.run_batch([job.image for job in batch], [job.boxes for job in batch], labels, failures)
        except Exception as e:  # noqa: BLE001 - the function itself failed: no request may wait for ever
            for job in batch:
                job.future.set_exception(e)
            return
        for label, job, poses in zip(labels, batch, found):
            if label in failures.errors:
                job.future.set_exception(failures.errors[label])
            else:
                job.future.set_result(poses)


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
