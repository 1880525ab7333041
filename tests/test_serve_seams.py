"""`vitpose serve` on Starlette's seams, in-process (the application called as ASGI, no socket):

- The command line's error rule: a request whose processing raises a plain `ValueError` deep in
  the library gets 500 `internal error: ...` (and the exception goes on to the server, which logs
  its traceback once); a `UserError` (also one that is a `ValueError`, as a `BoxError`) gets its
  4xx; the server's own refusals of a request (bad boxes, a missing token) are 4xx too.
- The batcher never patches the predictor: after the application is built and has answered, the
  predictor's `run_network` and `batch_size` are what they were, and `/metrics` still counts the
  forward passes and crops.
- Start-up refusals: a missing model file, `--detector typo`, `--precision typo` end `python -m
  vitpose serve` with exit 2 and one `error:` line, and the port it had bound is free again.
"""

import asyncio
import json
import os
import socket
import subprocess
import sys
from urllib.parse import quote

import cv2
import numpy as np
import pytest
from conftest import REPO
from test_evaluate import tiny_model

import vitpose
from vitpose.cli import main
from vitpose.errors import UserError
from vitpose.inference.pipeline import BoxError
from vitpose.inference.results import Poses

pytest.importorskip("uvicorn", reason='vitpose serve needs the serve extra: pip install -e ".[serve]"')
pytest.importorskip("starlette", reason='vitpose serve needs the serve extra: pip install -e ".[serve]"')
pytest.importorskip("python_multipart", reason='vitpose serve needs the serve extra: pip install -e ".[serve]"')

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
IMAGE = cv2.imencode(".png", np.full((48, 64, 3), 90, np.uint8))[1].tobytes()


def call(app, method: str, target: str, body: bytes = b"", headers=None):
    """(status, headers, answer (JSON, else text), the exception the app raised on to its server or None)."""
    path, _, query = target.partition("?")
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    messages, received, answered = [], [], []

    async def receive():
        if received:  # as a server does: the disconnect comes once the client has its answer
            while not answered:
                await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}
        received.append(True)
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        messages.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            answered.append(True)

    async def run():
        try:
            await app(scope, receive, send)
        except Exception as e:  # noqa: BLE001 - what a server (uvicorn) would log
            return e
        return None

    raised = asyncio.run(run())
    start = next(m for m in messages if m["type"] == "http.response.start")
    data = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    answer_headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    is_json = answer_headers.get("content-type", "").startswith("application/json")
    return start["status"], answer_headers, json.loads(data) if is_json else data.decode(), raised


class StandIn:
    """A predictor's call as the batch function makes it: empty poses, or the error it was given."""

    batch_size, detector, skeleton, num_keypoints = 4, None, None, 17

    def __init__(self, error: Exception | None = None):
        self.error = error

    def run_network(self, crops):
        raise AssertionError("the stand-in has no network")

    def __call__(self, images, boxes=None, box_format="xyxy", channels="rgb"):
        if self.error is not None:
            raise self.error
        k = self.num_keypoints
        return [Poses(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros((0, k, 2)),
                      np.zeros((0, k), np.float32)) for _ in images]


def predict_target(boxes=((2, 2, 30, 40),)) -> str:
    return "/v1/predict?boxes=" + quote(json.dumps([list(b) for b in boxes]))


def test_a_plain_value_error_deep_inside_is_500_and_goes_on_to_the_server(serve):
    deep = ValueError("operands could not be broadcast together")
    app, service = serve(StandIn(deep))
    status, _, answer, raised = call(app, "POST", predict_target(), IMAGE)
    assert status == 500, answer
    assert answer == {"error": "internal error: ValueError: operands could not be broadcast together"}
    assert raised is deep  # re-raised once to the server, which logs its traceback (uvicorn: once)
    assert service.metrics.requests == {("predict", 500): 1}
    # the server keeps serving
    status, _, answer, raised = call(app, "GET", "/v1/health")
    assert (status, answer["status"], raised) == (200, "ok", None)


@pytest.mark.parametrize("error", [UserError("frame 3: the boxes file names no such image"),
                                   BoxError("box 0 [1e+06, 0, 2e+06, 5] (xyxy) lies far outside the 64x48 image")],
                         ids=["UserError", "BoxError(UserError, ValueError)"])
def test_a_user_error_deep_inside_is_its_4xx(serve, error):
    app, service = serve(StandIn(error))
    status, _, answer, raised = call(app, "POST", predict_target(), IMAGE)
    assert (status, answer, raised) == (422, {"error": str(error)}, None)
    assert service.metrics.requests == {("predict", 422): 1}


def test_the_servers_own_refusals_are_4xx_through_the_seams(serve):
    app, service = serve(StandIn(), token=TOKEN)
    # request parsing: the server's own UserError (RequestError), never a bare ValueError
    status, _, answer, raised = call(app, "POST", "/v1/predict?boxes=[[5,5,1,1]]", IMAGE, AUTH)
    assert status == 422 and answer["error"].startswith("boxes: ") and raised is None, answer
    status, _, answer, _ = call(app, "POST", "/v1/predict?mark_below=high", IMAGE, AUTH)
    assert status == 400 and "mark_below" in answer["error"]
    # the token middleware: 401 with the scheme to use; the open endpoints stay open
    status, headers, answer, _ = call(app, "POST", predict_target(), IMAGE)
    assert status == 401 and "token" in answer["error"] and "Bearer" in headers["www-authenticate"]
    assert call(app, "GET", "/v1/health")[0] == 200
    status, _, answer, _ = call(app, "POST", predict_target(), IMAGE, AUTH)
    assert status == 200 and answer["records"] == [], answer
    # an unknown route: the one error shape, not counted under an endpoint
    status, _, answer, _ = call(app, "GET", "/nowhere", headers=AUTH)
    assert status == 404 and answer == {"error": "GET /nowhere: Not Found"}
    assert service.metrics.requests == {("predict", 422): 1, ("predict", 400): 1, ("predict", 401): 1,
                                        ("predict", 200): 1, ("health", 200): 1}


def test_the_in_flight_limit_answers_503_and_counts_it(serve):
    app, service = serve(StandIn(), max_in_flight=1)
    service.metrics.started(+1)  # one request is being answered
    try:
        status, _, answer, _ = call(app, "POST", predict_target(), IMAGE)
    finally:
        service.metrics.started(-1)
    assert status == 503 and "--max-in-flight" in answer["error"]
    assert call(app, "POST", predict_target(), IMAGE)[0] == 200
    assert service.metrics.requests == {("predict", 503): 1, ("predict", 200): 1} and service.metrics.in_flight == 0


def test_the_batcher_never_patches_the_predictor(serve, tmp_path):
    vitpose.save_weights(tiny_model(seed=3), tmp_path / "tiny.safetensors")
    predictor = vitpose.open_predictor(tmp_path / "tiny.safetensors", device="cpu", precision="fp32",
                                       detector="full-frame", batch_size=2)
    before = dict(vars(predictor))
    app, service = serve(predictor)
    boxes = [(2, 2, 30, 40), (10, 5, 60, 45), (0, 0, 64, 48), (20, 10, 50, 30), (5, 5, 25, 25)]
    status, _, answer, _ = call(app, "POST", predict_target(boxes), IMAGE)
    assert status == 200 and len(answer["records"]) == 5, answer
    status, _, answer, _ = call(app, "POST", "/v1/predict", IMAGE)  # no boxes: the pipeline's detector
    assert status == 200 and len(answer["records"]) == 1, answer
    assert vars(predictor).keys() == before.keys()
    assert all(vars(predictor)[name] is value for name, value in before.items())
    assert "run_network" not in vars(predictor) and predictor.batch_size == 2
    assert service.runner.max_batch == 2  # the batches are the predictor's own size
    # counted all the same: 5 crops in passes of 2, 2, 1, then the detector's one person
    assert (service.metrics.forward_passes, service.metrics.crops) == (4, 6)
    assert service.metrics.forward_seconds > 0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(("argv", "words"), [
    (["--model", "nope.pth"], "nope.pth"),
    (["--detector", "typo"], "--detector"),
    (["--precision", "typo"], "--precision"),
], ids=["missing model", "detector typo", "precision typo"])
def test_a_bad_model_flag_is_a_start_up_refusal(tmp_path, argv, words):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "vitpose", "serve", *argv, "--port", "0"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2, lines
    assert len(lines) == 1 and lines[0].startswith("vitpose serve: error: ") and words in lines[0], lines


def test_a_start_up_refusal_closes_the_listening_socket(tmp_path, capsys):
    port = _free_port()
    assert main(["serve", "--detector", "typo", "--host", "127.0.0.1", "--port", str(port)]) == 2
    assert "--detector" in capsys.readouterr().err
    with socket.socket() as again:  # bound and listening before the model opened: closed on the refusal
        again.bind(("127.0.0.1", port))
