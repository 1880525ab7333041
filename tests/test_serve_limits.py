"""`vitpose serve` against slow and greedy clients: they are cut off or made to take turns, and
everyone else is still served.

In-process (the batch thread, the application called as ASGI):
- A request of more than `--max-boxes` boxes is a 413 of one line.
- The batch thread cuts a request of many boxes into slices of `max_batch` that take turns with
  the other requests: no forward pass holds more than `max_batch` crops, a 1-box request submitted
  while 3000 boxes are being computed is answered within a few batches, and once the big request
  is cancelled (its timeout, or its client gone) none of its remaining slices is computed.
- A request whose client closes its connection while it waits is cancelled and never computed.
- The batch thread lets go of a job's image once the job is done.
- A job cancelled while its batch runs is dropped when the batch ends, and the thread goes on
  serving (the next job is answered).
- A body sent in chunks without Content-Length is refused as soon as it is over the limit; a body
  that stalls is given up after `body_timeout` (408, `Connection: close`), and so is one that
  trickles a byte at a time.
- The pixel budget: a second image that does not fit waits, then gets 503 with `Retry-After`;
  one that fits once the first is done is served.
- Label Studio's `/predict` decodes its tasks one at a time, each within the pixel budget.
- `/v1/health` says "saturated" when `--max-in-flight` is used up.

A real server (a subprocess on a free port, the tiny random-weights model, 2 CPU cores):
- 64 connections that send headers and 100 bytes of a 90 KB body and stall: `/v1/health` says
  saturated, each is answered 408 and closed after `--body-timeout 1`, and a normal request is
  answered within a few seconds of it.
- A request of 14,000 boxes (with `--max-boxes 20000`) does not make a 1-box request sent after it
  time out (`--timeout 5`); when the big one gets its 504, the server stops computing its crops.
- Four concurrent 144-megapixel PNGs (0.2 MB each) against `--max-pixels-in-flight 150000000`: each
  is answered 200 or 503 with `Retry-After`, and the server's peak RSS grows by less than the
  documented bound (6 bytes a pixel of the budget, 0.9 GB, plus 0.25 GB of slack), where the
  four at once take about 4 x 0.86 GB.
"""

import asyncio
import base64
import gc
import json
import socket
import threading
import time
import weakref
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import pytest
from serve_helpers import multipart, start_server
from test_evaluate import tiny_model
from test_serve_seams import IMAGE, StandIn, call, predict_target

import vitpose

pytest.importorskip("uvicorn", reason='vitpose serve needs the serve extra: pip install -e ".[serve]"')
pytest.importorskip("starlette", reason='vitpose serve needs the serve extra: pip install -e ".[serve]"')
pytest.importorskip("python_multipart", reason='vitpose serve needs the serve extra: pip install -e ".[serve]"')

BYTES_PER_PIXEL = 6  # the documented decoding memory per pixel of --max-pixels-in-flight (vitpose serve --help)
RSS_SLACK = 256 * 2**20  # the allocator's and the request bodies' share, beside the images


def test_more_boxes_than_max_boxes_is_a_413_of_one_line(serve):
    app, _ = serve(StandIn(), max_boxes=3)
    boxes = [(1, 1, 9, 9)] * 4
    status, _, answer, raised = call(app, "POST", predict_target(boxes), IMAGE)
    assert status == 413 and raised is None
    assert "4 boxes" in answer["error"] and "--max-boxes" in answer["error"] and "\n" not in answer["error"]
    status, _, answer, _ = call(app, "POST", predict_target(boxes[:3]), IMAGE)
    assert status == 200, answer


class _Recorder:
    """A batch function that records the boxes of each call and takes `seconds` per call."""

    def __init__(self, seconds: float = 0.0):
        self.seconds = seconds
        self.calls: list[list[int]] = []  # boxes per image of each call
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, images, boxes, labels, failures):
        self.gate.wait(30)
        self.calls.append([len(b) for b in boxes])
        time.sleep(self.seconds)
        return [len(b) for b in boxes]


def test_a_request_of_many_boxes_takes_turns_and_is_dropped_once_cancelled():
    from vitpose.serve.batching import BatchRunner

    record = _Recorder(seconds=0.01)
    runner = BatchRunner(record, max_batch=8, max_wait=0.0)
    try:
        image = np.zeros((4, 4, 3), np.uint8)
        big = runner.submit(image, np.zeros((3000, 5), np.float32))  # 375 slices: ~4 s of batches
        time.sleep(0.2)
        start = time.monotonic()
        small = runner.submit(image, np.zeros((1, 5), np.float32))
        assert small.result(timeout=30) == 1
        waited = time.monotonic() - start
        assert waited < 1.0, f"the 1-box request waited {waited:.2f} s behind 3000 boxes"
        assert not big.done()
        assert big.cancel()  # pending until its last slice: its request may still give up
        time.sleep(0.1)
        calls = len(record.calls)
        time.sleep(0.3)
        assert len(record.calls) <= calls + 1, "the cancelled request's slices are still being computed"
        assert big in futures.wait([big], timeout=5).done  # dropped, and its waiters told
        assert max(sum(c) for c in record.calls) <= 8  # no forward pass over max_batch crops
        assert sum(sum(c) for c in record.calls) < 3000
    finally:
        runner.close()


def test_slices_of_one_image_are_joined_into_its_poses_in_order(serve):
    from vitpose.inference.results import Poses
    from vitpose.serve.app import batch_function
    from vitpose.serve.batching import BatchRunner, Metrics

    class Echo(StandIn):
        def __call__(self, images, boxes=None, box_format="xyxy", channels="rgb"):
            k = self.num_keypoints
            return [Poses(b[:, :4].copy(), b[:, 4].copy(), np.repeat(b[:, None, :2], k, 1).astype(np.float64),
                                  np.ones((len(b), k), np.float32)) for b in boxes]

    metrics = Metrics()
    runner = BatchRunner(batch_function(Echo(), metrics), max_batch=4, max_wait=0.0)
    try:
        boxes = np.array([[i, i, i + 10, i + 10, 0.5] for i in range(11)], np.float32)
        poses = runner.submit(np.zeros((40, 40, 3), np.uint8), boxes).result(timeout=30)
        np.testing.assert_array_equal(poses.boxes, boxes[:, :4])
        assert len(poses) == 11 and metrics.forward_passes == 3 and metrics.crops == 11
    finally:
        runner.close()


def test_the_batch_thread_lets_go_of_an_image_once_its_job_is_done():
    """The pixel budget counts an answered request's pixels free: the thread must not keep its image."""
    from vitpose.serve.batching import BatchRunner

    runner = BatchRunner(_Recorder(), max_batch=8, max_wait=0.0)
    try:
        image = np.zeros((64, 64, 3), np.uint8)
        alive = weakref.ref(image)
        assert runner.submit(image, np.zeros((2, 5), np.float32)).result(timeout=10) == 2
        del image
        gc.collect()
        assert alive() is None, "the batch thread still holds the image of an answered request"
    finally:
        runner.close()


def test_a_job_cancelled_while_its_batch_runs_is_dropped_and_the_thread_goes_on():
    from vitpose.serve.batching import BatchRunner

    record = _Recorder()
    record.gate.clear()
    runner = BatchRunner(record, max_batch=8, max_wait=0.0)
    try:
        image = np.zeros((4, 4, 3), np.uint8)
        running = runner.submit(image, np.zeros((2, 5), np.float32))
        time.sleep(0.2)  # its batch is in the function, waiting on the gate
        running.cancel()
        record.gate.set()
        assert runner.submit(image, np.zeros((3, 5), np.float32)).result(timeout=10) == 3
        assert running in futures.wait([running], timeout=5).done  # dropped, and its waiters told
    finally:
        runner.close()


def test_a_request_whose_client_has_gone_is_not_computed():
    from vitpose.serve.app import Service, Settings
    from vitpose.serve.batching import BatchRunner, Metrics
    from vitpose.serve.labelstudio import RequestError

    record = _Recorder()
    record.gate.clear()
    runner = BatchRunner(record, max_batch=8, max_wait=0.0)
    service = Service(StandIn(), None, Settings(model_name="stand-in", timeout=30), runner, Metrics(), None)
    image = np.zeros((4, 4, 3), np.uint8)
    try:
        first = runner.submit(image, np.zeros((8, 5), np.float32))  # holds the batch thread at the gate
        time.sleep(0.2)

        async def client_closed():
            return {"type": "http.disconnect"}

        with pytest.raises(RequestError) as gone:
            asyncio.run(service.poses(image, np.zeros((3, 5), np.float32), client_closed))
        assert gone.value.status == 499
        record.gate.set()
        assert first.result(timeout=10) == 8
        time.sleep(0.3)
        assert record.calls == [[8]]  # the gone client's 3 boxes never went through the network
    finally:
        record.gate.set()
        runner.close()


def _send_chunks(app, chunks, stall: bool = False, headers=None, trickle: float = 0.0):
    """(status, headers, answer) of a POST whose body comes in `chunks` (no Content-Length); with
    `stall`, the client sends the chunks and then nothing more."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/predict", "raw_path": b"/v1/predict", "query_string": b"boxes=%5B%5D", "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    messages, left = [], list(chunks)

    async def receive():
        if left:
            await asyncio.sleep(trickle)
            chunk = left.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(left) or stall}
        await asyncio.sleep(3600)  # a stalled client, or one waiting for its answer

    async def send(message):
        messages.append(message)

    asyncio.run(asyncio.wait_for(app(scope, receive, send), 30))
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, json.loads(body)


def test_a_chunked_body_over_the_limit_and_a_stalled_body_are_refused(serve):
    app, service = serve(StandIn(), max_body=1000, body_timeout=0.3)
    status, _, answer = _send_chunks(app, [b"x" * 600, b"x" * 600])
    assert status == 413 and "--max-body-mb" in answer["error"]
    start = time.monotonic()
    status, headers, answer = _send_chunks(app, [b"x" * 100], stall=True)
    assert status == 408 and "--body-timeout" in answer["error"] and headers.get("connection") == "close"
    assert time.monotonic() - start < 5
    assert service.metrics.in_flight == 0
    # one that trickles a byte every 50 ms (never idle for body_timeout) is given up all the same
    start = time.monotonic()
    status, headers, answer = _send_chunks(app, [b"x"] * 400, trickle=0.05)
    assert status == 408 and "--body-timeout" in answer["error"] and time.monotonic() - start < 1.5


def _png(width: int, height: int) -> bytes:
    image = np.zeros((height, width, 3), np.uint8)
    image[::97, ::89] = 200  # a little texture: still a small file
    return cv2.imencode(".png", image)[1].tobytes()


def test_the_pixel_budget_makes_a_request_wait_then_503_with_retry_after(serve):
    from vitpose.serve.limits import LimitError

    app, service = serve(StandIn(), max_pixels_in_flight=1000, pixel_wait=0.2)
    budget = service.budget

    async def scenario():
        async with budget.hold(800):
            with pytest.raises(LimitError) as busy:
                async with budget.hold(300):
                    pass
            assert busy.value.status == 503 and "Retry-After" in busy.value.headers
            assert "--max-pixels-in-flight" in str(busy.value)

            async def later():
                async with budget.hold(300):
                    return budget.in_use

            waiting = asyncio.ensure_future(later())
            await asyncio.sleep(0.05)
            assert not waiting.done()  # it waits for the first image to be answered
        return await waiting

    assert asyncio.run(scenario()) == 300 and budget.in_use == 0
    # through HTTP: an image that alone is over the budget is a 413; one within it is served
    status, _, answer, _ = call(app, "POST", predict_target(), _png(40, 30))
    assert status == 413 and "--max-pixels-in-flight" in answer["error"]
    status, _, answer, _ = call(app, "POST", predict_target(), _png(30, 30))
    assert status == 200, answer


def test_labelstudio_tasks_are_decoded_one_at_a_time_within_the_pixel_budget(serve):
    from test_serve import LABEL_CONFIG

    from vitpose.data.metainfo import dataset_info

    held = []

    class Detecting(StandIn):
        detector = "full-frame"  # the stand-in finds nobody, but the server lets it look
        skeleton = dataset_info("coco")

        def __call__(self, images, boxes=None, **options):
            held.append(service.budget.in_use)  # the pixels held while this task's poses are computed
            return super().__call__(images, boxes, **options)

    app, service = serve(Detecting(), max_pixels_in_flight=10_000)
    config = LABEL_CONFIG.format(labels="".join(f'<Label value="{n}"/>' for n in Detecting.skeleton.keypoint_names))
    tasks = [{"id": i, "data": {"photo": "data:image/png;base64," + base64.b64encode(_png(40 + i, 30)).decode()}}
             for i in range(3)]
    body = json.dumps({"tasks": tasks, "label_config": config}).encode()
    status, _, answer, _ = call(app, "POST", "/predict", body, {"Content-Type": "application/json"})
    assert status == 200 and len(answer["results"]) == 3, answer
    assert held == [40 * 30, 41 * 30, 42 * 30]  # each task alone, within the budget
    assert service.budget.in_use == 0


def test_health_says_saturated_when_max_in_flight_is_used_up(serve):
    app, service = serve(StandIn(), max_in_flight=2)
    status, _, answer, _ = call(app, "GET", "/v1/health")
    assert status == 200 and answer["saturated"] is False and answer["max_in_flight"] == 2
    service.metrics.started(+2)
    status, _, answer, _ = call(app, "GET", "/v1/health")
    assert answer["saturated"] is True and answer["status"] == "saturated" and answer["in_flight"] == 2
    status, headers, _, _ = call(app, "POST", predict_target(), IMAGE)
    assert status == 503 and headers.get("retry-after") == "1"
    service.metrics.started(-2)


# --- a real server --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-limits")
    vitpose.save_weights(tiny_model(seed=3), root / "tiny.safetensors")
    server = start_server(["--model", root / "tiny.safetensors", "--detector", "full-frame", "--device", "cpu",
                           "--precision", "fp32", "--max-batch", "8", "--max-wait-ms", "5", "--body-timeout", "1",
                           "--max-in-flight", "64", "--max-pixels-in-flight", "150000000",
                           "--max-boxes", "20000", "--timeout", "5", "--max-body-mb", "4"], root)
    yield server
    assert server.stop() == 0


def _post_png(server, data: bytes, boxes, timeout: float = 60):
    body, headers = multipart({"image": ("a.png", data), "boxes": json.dumps(boxes)})
    return server.request("POST", "/v1/predict", body, headers, timeout=timeout)


def test_64_stalled_bodies_are_closed_after_the_body_timeout(server):
    stalled = []
    for _ in range(64):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                  b"Content-Length: 90000\r\n\r\n" + b"\0" * 100)
        stalled.append(s)
    try:
        saturated, deadline = False, time.monotonic() + 5
        while not saturated and time.monotonic() < deadline:
            saturated = server.json("GET", "/v1/health")[1]["saturated"]
        assert saturated, "/v1/health did not say saturated with 64 stalled requests in flight"
        start = time.monotonic()
        image = cv2.imencode(".png", np.full((48, 64, 3), 90, np.uint8))[1].tobytes()
        status = None
        while status != 200 and time.monotonic() - start < 10:
            status, _, answer = _post_png(server, image, [[2, 2, 30, 40]], timeout=10)
            if status != 200:
                assert status == 503, answer
                time.sleep(0.2)
        waited = time.monotonic() - start
        assert status == 200, "a normal request was refused for 10 s while 64 stalled bodies were open"
        assert waited < 1 + 4, f"a normal request waited {waited:.1f} s with --body-timeout 1"
        print(f"64 stalled bodies: a normal request answered after {waited:.2f} s (--body-timeout 1)")
        for s in stalled:  # each answered 408 and closed by the server
            s.settimeout(5)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
        assert server.json("GET", "/v1/health")[1]["saturated"] is False
    finally:
        for s in stalled:
            s.close()


def test_14000_boxes_do_not_make_a_1_box_request_time_out(server):
    image = cv2.imencode(".png", np.full((120, 160, 3), 90, np.uint8))[1].tobytes()
    boxes = [[i % 100, i % 50, i % 100 + 50, i % 50 + 60] for i in range(14000)]
    crops_before = server.metric("vitpose_crops_total")
    with ThreadPoolExecutor(1) as pool:
        big = pool.submit(_post_png, server, image, boxes)
        time.sleep(1.0)  # the big request's slices are being computed
        start = time.monotonic()
        status, _, answer = _post_png(server, image, [[10, 10, 60, 70]], timeout=30)
        waited = time.monotonic() - start
        assert status == 200, answer
        assert waited < 3, f"the 1-box request waited {waited:.1f} s behind 14000 boxes"
        big_status, _, _ = big.result(timeout=60)
        print(f"14000 boxes: the 1-box request answered in {waited:.2f} s; the big one {big_status}")
    if big_status == 504:  # it gave up: its remaining crops are not computed
        time.sleep(0.5)
        crops = server.metric("vitpose_crops_total")
        time.sleep(1.5)
        assert server.metric("vitpose_crops_total") == crops
        assert crops - crops_before < 14000 + 1
    else:
        assert big_status == 200


def _rss_peak_since_reset(pid: int) -> tuple[int, bool]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["VmHWM"].split()[0]) * 1024, int(fields["VmRSS"].split()[0]) * 1024


def test_four_144_megapixel_pngs_stay_under_the_decoding_budget(server):
    if not Path(f"/proc/{server.proc.pid}/status").exists():
        pytest.skip("the peak RSS is read from /proc (Linux)")
    png = _png(12000, 12000)
    assert len(png) < 2**22
    _, rss_before = _rss_peak_since_reset(server.proc.pid)
    try:  # the peak from here on (Linux >= 4.0); else the peak of the process's life, which is higher
        Path(f"/proc/{server.proc.pid}/clear_refs").write_text("5")
    except OSError:
        pass
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: _post_png(server, png, [[0, 0, 100, 100]], timeout=60), range(4)))
    statuses = [status for status, _, _ in answers]
    for status, headers, body in answers:
        assert status in (200, 503), body[:200]
        if status == 503:
            assert "retry-after" in {k.lower() for k in headers} and b"--max-pixels-in-flight" in body
    assert 200 in statuses
    peak, _ = _rss_peak_since_reset(server.proc.pid)
    bound = 150_000_000 * BYTES_PER_PIXEL + RSS_SLACK
    assert peak - rss_before < bound, f"peak RSS grew by {(peak - rss_before) / 1e9:.2f} GB, over {bound / 1e9} GB"
    print(f"4 x 144 MP: {statuses}, peak RSS {rss_before / 1e9:.2f} -> {peak / 1e9:.2f} GB")
