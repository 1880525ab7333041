"""Request batching: the images of concurrent requests share forward passes of one predictor.

One thread (`BatchRunner`) owns the predictor (a `vitpose.Predictor` or `vitpose.OnnxPredictor`,
whose `TopDown.__call__` is the one pipeline: boxes -> crops -> network -> decode). Requests
`submit(image, boxes)` and get a `concurrent.futures.Future` of the image's `Poses`. The thread
takes the first waiting job, then gathers more until their crops reach `max_batch` or `max_wait`
has passed since the first, and runs them as one call of the pipeline: the crops of every image go
through the network together (`max_batch` crops per pass: the predictor's `batch_size`). A job
that would overflow the batch waits for the next one.

One request's bad input never fails another's: images are decoded and boxes checked before they
are submitted, and if a batch still fails, its jobs are run again one by one so the failure lands
on the job that caused it. A job cancelled before its batch started (its request timed out) is
dropped. Forward passes, their sizes and seconds are counted where the network runs
(`Metrics.forward`), not inferred.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

import numpy as np

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
    """The predictor's thread: `submit(image, boxes)` -> Future[Poses] (see the module docstring).

    predictor: a TopDown predictor; its `batch_size` becomes `max_batch` (crops per forward pass)
    and its `run_network` is wrapped to count the passes into `metrics`.
    max_wait: seconds a batch waits for more requests after its first one.
    """

    def __init__(self, predictor, max_batch: int, max_wait: float, metrics: Metrics):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.predictor = predictor
        self.max_batch = int(max_batch)
        self.max_wait = float(max_wait)
        self.metrics = metrics
        predictor.batch_size = self.max_batch
        network = predictor.run_network

        def counted_network(crops):
            start = time.perf_counter()
            heatmaps = network(crops)
            metrics.forward(len(crops), time.perf_counter() - start)
            return heatmaps

        predictor.run_network = counted_network  # this instance only: the pipeline calls it per pass
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
        try:
            poses = self._pose(batch)
        except Exception as e:  # noqa: BLE001 - the failure is handed to the request(s) it belongs to
            if len(batch) == 1:
                batch[0].future.set_exception(e)
                return
            for job in batch:  # one by one: only the job that fails gets the error
                try:
                    job.future.set_result(self._pose([job])[0])
                except Exception as e_job:  # noqa: BLE001
                    job.future.set_exception(e_job)
            return
        for job, found in zip(batch, poses):
            job.future.set_result(found)

    def _pose(self, batch: list[_Job]):
        """One call of the pipeline on every image of the batch (the detector first, for the jobs without boxes)."""
        images = [job.image for job in batch]
        boxes = [job.boxes for job in batch]
        unboxed = [i for i, b in enumerate(boxes) if b is None]
        if unboxed:
            found = self.predictor.detect([images[i] for i in unboxed], channels="bgr")
            for i, detections in zip(unboxed, found):
                boxes[i] = np.concatenate([detections.boxes, detections.scores[:, None]], axis=1)
        return self.predictor(images, boxes=boxes, channels="bgr")


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
        with self._lock:
            self.forward_passes += 1
            self.crops += crops
            self.forward_seconds += seconds
            self._batch.observe(crops)

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
