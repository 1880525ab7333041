"""`vitpose serve` (issue 30): the server's answers are `vitpose predict`'s, batched, bounded, stoppable.

One server process (a tiny random-weight model saved with `vitpose.save_weights`, the full-frame
detector, fp32, a 1 MB body limit, a token) answers most tests; the SIGTERM test starts its own.
- Its records for an image equal `vitpose predict --json` on that image (keypoints within 1e-3 px:
  the server puts several images' crops in one forward pass, the command other ones, and a GEMM
  of another batch size may round differently in the last bits), with and without given boxes.
- 16 concurrent requests take fewer than 16 forward passes (`/metrics`), and a bad image among 16
  gets its 4xx while the other 15 get their poses.
- Garbage, an empty body, a 30000x20000 PNG header, a wrong or missing token and a body over the
  limit: each a 4xx JSON error of one line, and `/v1/health` answers after each.
- SIGTERM during 8 requests in flight: all 8 answered with their poses, exit status 0 (and a 9th
  beyond `--max-in-flight 8` got a 503 at once).
- Label Studio's `/predict` equals `vitpose predict --format labelstudio`, and `vitpose
  import-annotations` reads it back.
"""

import json
import shutil
import signal
import struct
import threading
import time
import zlib

import cv2
import numpy as np
import pytest
from serve_helpers import multipart, start_server
from test_evaluate import tiny_model

import vitpose
from vitpose.cli import main
from vitpose.data.annotation_formats import labelstudio_image_url

pytest.importorskip("uvicorn", reason='vitpose serve needs the serve extra: pip install -e ".[serve]"')
pytest.importorskip("starlette", reason='vitpose serve needs the serve extra: pip install -e ".[serve]"')
pytest.importorskip("python_multipart", reason='vitpose serve needs the serve extra: pip install -e ".[serve]"')

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON_AUTH = {**AUTH, "Content-Type": "application/json"}  # Label Studio sends JSON
KEYPOINT_TOL = 1e-3  # px: see the module docstring
SCORE_TOL = 1e-5
COCO_IMAGE = "000000000785.jpg"
LABEL_CONFIG = """<View>
  <Image name="img" value="$photo"/>
  <RectangleLabels name="box" toName="img"><Label value="human"/></RectangleLabels>
  <KeyPointLabels name="joints" toName="img">{labels}</KeyPointLabels>
</View>"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, coco_mini_dir):
    """The tiny model's weights and three images named by number (COCO ids, as the command reads them)."""
    root = tmp_path_factory.mktemp("serve")
    vitpose.save_weights(tiny_model(seed=11), root / "tiny.safetensors")
    images = root / "images"
    images.mkdir()
    shutil.copy(coco_mini_dir / COCO_IMAGE, images / COCO_IMAGE)
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:180, 0:120]
    smooth = np.stack([xx * 2, yy, (xx + yy) % 256], -1).astype(np.uint8)
    cv2.imwrite(str(images / "000000000001.png"), smooth)
    cv2.imwrite(str(images / "000000000002.jpg"), rng.integers(0, 256, (150, 210, 3), dtype=np.uint8))
    return root


@pytest.fixture(scope="module")
def server(workdir):
    server = start_server(["--model", workdir / "tiny.safetensors", "--detector", "full-frame", "--device", "cpu",
                           "--precision", "fp32", "--max-batch", "32", "--max-wait-ms", "300", "--max-body-mb", "1",
                           "--token", TOKEN, "--image-dir", workdir / "images"], workdir)
    yield server
    assert server.stop() == 0


def predict_json(workdir, *extra, name="out.json"):
    out = workdir / name
    argv = ["predict", *map(str, extra), "--model", str(workdir / "tiny.safetensors"), "--device", "cpu",
            "--precision", "fp32", "--json", str(out)]
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def expected(workdir):
    """`vitpose predict --json` on each image: {file_name: records}."""
    files = sorted((workdir / "images").iterdir())
    records = json.loads(predict_json(workdir, *files, "--detector", "full-frame").read_text())
    by_name = {f.name: [] for f in files}
    for record in records:
        by_name[record["file_name"]].append(record)
    assert all(len(v) == 1 for v in by_name.values())  # full frame: one person each
    return by_name


def assert_same_records(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert set(g) == set(w)
        assert (g["image_id"], g["file_name"], g["category_id"]) == (w["image_id"], w["file_name"], w["category_id"])
        np.testing.assert_allclose(g["bbox"], w["bbox"], rtol=0, atol=1e-4)
        got_k, want_k = np.reshape(g["keypoints"], (-1, 3)), np.reshape(w["keypoints"], (-1, 3))
        np.testing.assert_allclose(got_k[:, :2], want_k[:, :2], rtol=0, atol=KEYPOINT_TOL)
        np.testing.assert_allclose(got_k[:, 2], want_k[:, 2], rtol=0, atol=SCORE_TOL)
        assert g["bbox_score"] == pytest.approx(w["bbox_score"], abs=SCORE_TOL)
        assert g["score"] == pytest.approx(w["score"], abs=SCORE_TOL)


def post_image(server, path, headers=AUTH, **query):
    body, form_headers = multipart({"image": (path.name, path.read_bytes()), **query})
    return server.json("POST", "/v1/predict", body, {**headers, **form_headers})


def test_answers_equal_predict_json(server, workdir, expected, coco_mini_dir):
    for path in sorted((workdir / "images").iterdir()):
        status, answer = post_image(server, path)
        assert status == 200, answer
        assert_same_records(answer["records"], expected[path.name])
        image = cv2.imread(str(path))
        assert (answer["width"], answer["height"]) == (image.shape[1], image.shape[0])
    # the raw body, named by a query parameter, is the same request
    data = (workdir / "images" / COCO_IMAGE).read_bytes()
    status, answer = server.json("POST", f"/v1/predict?file_name={COCO_IMAGE}", data, AUTH)
    assert status == 200 and answer["image_id"] == 785
    assert_same_records(answer["records"], expected[COCO_IMAGE])
    # given boxes (xywh, with scores) equal `predict --boxes` on the same boxes
    dets = [d for d in json.loads((coco_mini_dir / "test_coco_det_AP_H_56.json").read_text()) if d["image_id"] == 785]
    dets = dets[:3]
    (workdir / "dets.json").write_text(json.dumps(dets))
    want = json.loads(predict_json(workdir, workdir / "images" / COCO_IMAGE, "--boxes", workdir / "dets.json",
                                   name="boxes.json").read_text())
    boxes = json.dumps([d["bbox"] + [d["score"]] for d in dets])
    status, answer = post_image(server, workdir / "images" / COCO_IMAGE, boxes=boxes, box_format="xywh")
    assert status == 200, answer
    assert len(want) == 3
    assert_same_records(answer["records"], want)

    # format=cvat is `predict --format cvat`'s file (coordinates have CVAT's 2 decimals: equal, or one
    # step apart where the last bits of a batch moved a value across a rounding edge)
    want = predict_json(workdir, workdir / "images" / COCO_IMAGE, "--detector", "full-frame", "--format", "cvat",
                        name="cvat.xml").read_text().splitlines()
    body, headers = multipart({"image": (COCO_IMAGE, data), "format": "cvat"})
    status, _, got = server.request("POST", "/v1/predict", body, {**AUTH, **headers})
    assert status == 200
    got = got.decode().splitlines()
    assert len(got) == len(want) > 20
    for line, line_want in zip(got, want):
        if 'points="' in line:
            point, point_want = (np.array(text.split('points="')[1].split('"')[0].split(","), float)
                                 for text in (line, line_want))
            np.testing.assert_allclose(point, point_want, rtol=0, atol=0.0100001)
            line, line_want = line.split('points="')[0], line_want.split('points="')[0]
        assert line == line_want


def _concurrently(server, bodies):
    """Send every (body, headers) at once from its own thread; [(status, answer)] in order."""
    results = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def send(i):
        barrier.wait(timeout=30)
        results[i] = server.json("POST", "/v1/predict", *bodies[i], timeout=120)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert all(r is not None for r in results), "a request got no answer"
    return results


def _form(path):
    body, headers = multipart({"image": (path.name, path.read_bytes())})
    return body, {**AUTH, **headers}


def test_16_concurrent_requests_take_fewer_than_16_forward_passes(server, workdir, expected):
    paths = sorted((workdir / "images").iterdir())
    chosen = [paths[i % len(paths)] for i in range(16)]
    before = server.metric("vitpose_forward_passes_total", AUTH)
    crops_before = server.metric("vitpose_crops_total", AUTH)
    results = _concurrently(server, [_form(p) for p in chosen])
    passes = server.metric("vitpose_forward_passes_total", AUTH) - before
    assert server.metric("vitpose_crops_total", AUTH) - crops_before == 16  # every image went through
    assert passes < 16, f"16 concurrent requests took {passes:g} forward passes"
    for path, (status, answer) in zip(chosen, results):
        assert status == 200, answer
        assert_same_records(answer["records"], expected[path.name])


def test_a_bad_image_among_16_fails_alone(server, workdir, expected):
    paths = sorted((workdir / "images").iterdir())
    bodies = [_form(paths[i % len(paths)]) for i in range(16)]
    broken, headers = multipart({"image": ("broken.jpg", b"\xff\xd8\xff\xe0 not really a JPEG \xff\xd9")})
    bodies[7] = (broken, {**AUTH, **headers})
    results = _concurrently(server, bodies)
    for i, (status, answer) in enumerate(results):
        if i == 7:
            assert 400 <= status < 500 and "broken.jpg" in answer["error"], answer
        else:
            assert status == 200, answer
            assert_same_records(answer["records"], expected[paths[i % len(paths)].name])


def png_header(width: int, height: int) -> bytes:
    """A PNG that is only a header (IHDR) and the end chunk: its size is read, nothing to decode."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + \
        chunk(b"IEND", b"")


BAD_REQUESTS = {  # case: (body, headers, status, words of the error)
    "garbage": (b"\x00\x01garbage bytes" * 10, AUTH, 422, "could not be decoded"),
    "empty body": (b"", AUTH, 400, "empty"),
    "30000x20000 PNG header": (png_header(30000, 20000), AUTH, 413, "30000x20000"),
    "wrong token": (b"x", {"Authorization": "Bearer not-the-token"}, 401, "token"),
    "no token": (b"x", {}, 401, "token"),
    "body over the limit": (b"\xff" * (2**20 + 10), AUTH, 413, "over the limit"),
    "bad boxes": (b"x", AUTH, 400, "boxes"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS), ids=lambda case: case.replace(" ", "_"))
def test_bad_requests_are_a_4xx_json_error_and_the_server_keeps_serving(server, case):
    body, headers, status, words = BAD_REQUESTS[case]
    path = "/v1/predict?boxes=[[1,2,3]]" if case == "bad boxes" else "/v1/predict"
    got, answer = server.json("POST", path, body, headers)
    assert got == status, answer
    assert set(answer) == {"error"} and words in answer["error"] and "\n" not in answer["error"]
    if status == 401:
        assert "Bearer" in server.request("POST", "/v1/predict", body, headers)[1].get("www-authenticate", "")
    health, answer = server.json("GET", "/v1/health")
    assert health == 200 and answer["status"] == "ok"


def test_sigterm_answers_the_requests_in_flight_and_exits_0(workdir, expected):
    # a long batch wait keeps all 8 requests in flight until the signal has arrived
    server = start_server(["--model", workdir / "tiny.safetensors", "--detector", "full-frame", "--device", "cpu",
                           "--precision", "fp32", "--max-batch", "64", "--max-wait-ms", "4000", "--max-in-flight", "8"],
                          workdir)
    try:
        paths = sorted((workdir / "images").iterdir())
        chosen = [paths[i % len(paths)] for i in range(8)]
        results = [None] * 8

        def send(i):
            body, headers = multipart({"image": (chosen[i].name, chosen[i].read_bytes())})
            results[i] = server.json("POST", "/v1/predict", body, headers, timeout=120)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while server.metric("vitpose_in_flight") < 8:
            assert time.monotonic() < deadline, "the 8 requests never were in flight together"
            time.sleep(0.05)
        # a 9th is over --max-in-flight: a 503 at once, the 8 are not disturbed
        body, headers = multipart({"image": (chosen[0].name, chosen[0].read_bytes())})
        busy, answer = server.json("POST", "/v1/predict", body, headers, timeout=30)
        assert busy == 503 and "--max-in-flight" in answer["error"], answer
        server.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=120)
        status = server.proc.wait(timeout=60)
    finally:
        server.stop()
    for path, result in zip(chosen, results):
        assert result is not None and result[0] == 200, result
        assert_same_records(result[1]["records"], expected[path.name])
    assert status == 0


def test_labelstudio_backend_equals_predict_format_labelstudio_and_imports_back(server, workdir, capsys):
    names = vitpose.load_model(workdir / "tiny.safetensors").skeleton.keypoint_names
    config = LABEL_CONFIG.format(labels="".join(f'<Label value="{n}"/>' for n in names))
    status, answer = server.json("GET", "/health")
    assert status == 200 and answer["status"] == "UP"
    status, answer = server.json("POST", "/setup", json.dumps({"project": "1.1700000000", "schema": config}).encode(),
                                 JSON_AUTH)
    assert status == 200 and answer["model_version"] == "vitpose"
    # a config whose keypoint labels lack the model's keypoints is refused in one line
    bad = LABEL_CONFIG.format(labels='<Label value="nose"/>')
    status, answer = server.json("POST", "/setup", json.dumps({"project": "1", "schema": bad}).encode(), JSON_AUTH)
    assert status == 422 and "left_eye" in answer["error"]

    tasks = [{"id": 7, "data": {"photo": labelstudio_image_url(COCO_IMAGE)}}]
    request = {"tasks": tasks, "project": "1.1700000000", "label_config": config, "params": {"context": {}}}
    status, answer = server.json("POST", "/predict", json.dumps(request).encode(), JSON_AUTH)
    assert status == 200, answer
    [prediction] = answer["results"]

    # `vitpose predict --format labelstudio` for that image, with the config's names
    out = predict_json(workdir, workdir / "images" / COCO_IMAGE, "--detector", "full-frame", "--format",
                       "labelstudio", name="ls.json")
    [task] = json.loads(out.read_text())
    want = task["predictions"][0]
    rename = {"person": "box", "keypoints": "joints"}
    assert prediction["model_version"] == want["model_version"]
    assert prediction["score"] == pytest.approx(want["score"], abs=SCORE_TOL)
    assert len(prediction["result"]) == len(want["result"]) == 1 + len(names)
    for got, region in zip(prediction["result"], want["result"]):
        assert got["from_name"] == rename[region["from_name"]] and got["to_name"] == "img"
        assert {k: v for k, v in got.items() if k not in ("from_name", "to_name", "value", "score", "meta")} == \
            {k: v for k, v in region.items() if k not in ("from_name", "to_name", "value", "score", "meta")}
        labels = "rectanglelabels" if got["type"] == "rectanglelabels" else "keypointlabels"
        assert got["value"][labels] == (["human"] if labels == "rectanglelabels" else region["value"][labels])
        for key in ("x", "y", "width", "height"):
            if key in region["value"]:  # percent of the image: 1e-3 px in percent of a 640 px side
                assert got["value"][key] == pytest.approx(region["value"][key], abs=100 * KEYPOINT_TOL / 425)
        assert got["score"] == pytest.approx(region["score"], abs=SCORE_TOL)
        assert ("meta" in got) == ("meta" in region)

    # a Label Studio export of the accepted prediction reads back as the same keypoints
    export = workdir / "ls_export.json"
    task_back = {"id": 7, "data": {"image": labelstudio_image_url(COCO_IMAGE)},
                 "annotations": [{"id": 1, "result": [{**r, "from_name": {"box": "person", "joints": "keypoints"}[
                     r["from_name"]], "to_name": "image"} for r in prediction["result"]]}]}
    export.write_text(json.dumps([task_back]))
    coco = workdir / "imported.json"
    assert main(["import-annotations", str(export), "--format", "labelstudio", "--out", str(coco)]) == 0, \
        capsys.readouterr().err
    imported = json.loads(coco.read_text())
    assert [i["file_name"] for i in imported["images"]] == [COCO_IMAGE]
    [person] = imported["annotations"]
    points = {r["value"]["keypointlabels"][0]: r["value"] for r in prediction["result"] if r["type"] == "keypointlabels"}
    back = np.reshape(person["keypoints"], (-1, 3))
    for k, name in enumerate(imported["categories"][0]["keypoints"]):
        assert back[k, 0] == pytest.approx(points[name]["x"] * 640 / 100, abs=1e-6)
        assert back[k, 1] == pytest.approx(points[name]["y"] * 425 / 100, abs=1e-6)


def test_the_console_says_how_to_get_the_labelling_config_and_prints_each_error(server):
    """At start-up the server prints the command that fetches the labelling config of its model, and
    every error answer is one line on its console (Label Studio shows only "NNN Client Error")."""
    import queue

    def next_line(words):
        while True:
            try:
                line = server.lines.get(timeout=10)
            except queue.Empty:
                raise AssertionError(f"no console line with {words!r}") from None
            if line is not None and words in line:
                return line

    line = next_line("/v1/labelstudio-config")
    assert "keypoints" in line and 'Authorization: Bearer $TOKEN' in line
    status, config = server.request("GET", "/v1/labelstudio-config", headers=AUTH)[::2]
    assert status == 200 and config.decode().count("<Label value=") == 18  # 17 keypoints and the person
    assert server.json("POST", "/v1/predict", b"x", {"Authorization": "Bearer wrong"})[0] == 401
    assert next_line("POST /v1/predict 401").startswith("vitpose serve: POST /v1/predict 401: missing or wrong token")


class _StubPredictor:
    """The TopDown call the batch function makes (`batch_function`), with a network that records
    its batches and an image that fails the pipeline (a first pixel of 255)."""

    batch_size, detector, skeleton = 8, None, None

    def __init__(self):
        self.batches = []

    def run_network(self, crops):
        self.batches.append(len(crops))
        return crops

    def __call__(self, images, boxes, box_format="xyxy", channels="rgb"):
        if any(image[0, 0, 0] == 255 for image in images):
            raise ValueError("this image fails the pipeline")
        self.run_network(np.zeros((sum(len(b) for b in boxes), 3, 4, 3), np.uint8))
        return [len(b) for b in boxes]


def test_a_failing_job_in_a_batch_fails_alone_and_a_late_request_times_out():
    """The batch thread's own rules, without HTTP: a batch that fails is run again job by job (only
    the job that failed gets the error), and a request past its timeout gets a 504 and its job is
    dropped before it runs."""
    import asyncio

    from vitpose.serve.app import Service, Settings, batch_function
    from vitpose.serve.batching import BatchRunner, Metrics
    from vitpose.serve.labelstudio import RequestError

    stub, metrics = _StubPredictor(), Metrics()
    runner = BatchRunner(batch_function(stub, metrics), max_batch=16, max_wait=0.5)
    try:
        images = [np.zeros((4, 4, 3), np.uint8) for _ in range(6)]
        images[2] = np.full((4, 4, 3), 255, np.uint8)
        futures = [runner.submit(image, np.zeros((i + 1, 5), np.float32)) for i, image in enumerate(images)]
        for i, future in enumerate(futures):
            if i == 2:
                with pytest.raises(ValueError, match="fails the pipeline"):
                    future.result(timeout=30)
            else:
                assert future.result(timeout=30) == i + 1
        assert stub.batches == [1, 2, 4, 5, 6] and metrics.forward_passes == 5  # retried one by one
        # gathered: the next jobs share one pass
        futures = [runner.submit(images[0], np.zeros((1, 5), np.float32)) for _ in range(4)]
        assert [f.result(timeout=30) for f in futures] == [1] * 4 and stub.batches[-1] == 4

        service = Service(stub, None, Settings(model_name="stub", timeout=0.1), runner, metrics, None)
        runner.max_wait = 1.0  # the batch waits longer than the request may
        with pytest.raises(RequestError) as late:
            asyncio.run(service.poses(images[0], np.zeros((1, 5), np.float32)))
        assert late.value.status == 504 and "timeout" in str(late.value)
        time.sleep(1.5)
        assert stub.batches[-1] == 4  # the cancelled job never ran
    finally:
        runner.close()


def test_labelstudio_task_images_come_from_its_host_only(server, workdir):
    """A task image that is not in --image-dir is fetched from the Label Studio `/setup` named, with
    its token; a URL on another host is refused in one line; a data: URL is read as it is."""
    import base64
    import http.server

    data = (workdir / "images" / COCO_IMAGE).read_bytes()
    seen = []

    class FakeLabelStudio(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append((self.path, self.headers.get("Authorization")))
            ok = self.path == "/data/upload/1/5e3b2f1a-photo.jpg" and self.headers.get("Authorization") == "Token ls-key"
            self.send_response(200 if ok else 403)
            self.send_header("Content-Length", str(len(data) if ok else 0))
            self.end_headers()
            if ok:
                self.wfile.write(data)

        def log_message(self, *args):
            pass

    fake = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeLabelStudio)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    try:
        host = f"http://127.0.0.1:{fake.server_address[1]}"
        status, _ = server.json("POST", "/setup", json.dumps({"project": "1", "hostname": host,
                                                               "access_token": "ls-key"}).encode(), JSON_AUTH)
        assert status == 200
        encoded = "data:image/jpeg;base64," + base64.b64encode(data).decode()
        tasks = [{"id": 1, "data": {"image": "/data/upload/1/5e3b2f1a-photo.jpg"}},
                 {"id": 2, "data": {"image": labelstudio_image_url(COCO_IMAGE)}},
                 {"id": 3, "data": {"image": encoded}}]
        status, answer = server.json("POST", "/predict", json.dumps({"tasks": tasks}).encode(), JSON_AUTH)
        assert status == 200, answer
        assert seen == [("/data/upload/1/5e3b2f1a-photo.jpg", "Token ls-key")]  # only the image not on disk
        fetched, local, inline = answer["results"]
        assert fetched["result"] == local["result"] == inline["result"] and len(local["result"]) == 18
        for url in ("http://169.254.169.254/latest/meta-data/x.jpg", "file:///etc/passwd"):
            status, answer = server.json("POST", "/predict", json.dumps(
                {"tasks": [{"id": 9, "data": {"image": url}}]}).encode(), JSON_AUTH)
            assert status == 422 and "task 9" in answer["error"] and "not on Label Studio's host" in answer["error"]
        assert len(seen) == 1  # nothing else was fetched
    finally:
        fake.shutdown()


def test_command_line_errors_are_one_line_and_exit_2(workdir, capsys):
    """A taken port fails before the model loads; bad flags and a missing model name what to fix."""
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        cases = [(["--port", str(port)], f"--port {port}: cannot listen there"),
                 (["--port", "70000"], "--port must be in 0..65535"),
                 (["--max-batch", "0"], "--max-batch must be >= 1"),
                 (["--image-dir", str(workdir / "missing")], "--image-dir: not a folder"),
                 (["--model", str(workdir / "missing.safetensors"), "--port", "0"], "missing.safetensors")]
        for argv, words in cases:
            assert main(["serve", "--model", str(workdir / "tiny.safetensors"), *argv]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].startswith("vitpose serve: error: ") and words in err[0], err
    finally:
        taken.close()


@pytest.mark.parametrize(("suffix", "runtime"), [(".onnx", "onnxruntime"), (".xml", "openvino")])
def test_an_exported_file_is_served_through_predicts_door(workdir, tmp_path, suffix, runtime):
    """`vitpose serve --model X.onnx | X.xml`: the file loads through the factory `vitpose predict
    --model` uses (its spec, skeleton and flip test), and its answers are the command's records on it."""
    if runtime == "openvino":
        pytest.importorskip("openvino")
    exported = tmp_path / "files" / f"tiny{suffix}"
    assert main(["export", "--model", str(workdir / "tiny.safetensors"), "--out", str(exported)]) == 0
    image = workdir / "images" / COCO_IMAGE
    out = tmp_path / "want.json"
    assert main(["predict", str(image), "--model", str(exported), "--detector", "full-frame", "--json", str(out)]) == 0
    want = json.loads(out.read_text())
    served = start_server(["--model", exported, "--detector", "full-frame", "--max-wait-ms", "0"], tmp_path)
    try:
        status, answer = post_image(served, image, headers={})
        assert status == 200, answer
        assert_same_records(answer["records"], want)
        status, info = served.json("GET", "/v1/model")
        assert status == 200 and info["settings"]["runtime"] == runtime and info["model"] == exported.name
        recorded = vitpose.load_model(workdir / "tiny.safetensors", device="cpu").model.spec
        assert info["spec"]["input_size"] == list(recorded.input_size)  # the file's ModelSpec, read by predict's door
    finally:
        assert served.stop() == 0
