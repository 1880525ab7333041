"""A real Label Studio uses `vitpose serve` as its ML backend, with the settings docs/labelstudio.md gives.

Slow tier. Label Studio runs from its own environment: $LABEL_STUDIO names its `label-studio` command,
else it is installed once into ~/.cache/vitpose-tests/ (label-studio 1.23.2 with `sentry-sdk<3`), or
the test is skipped with the reason where it cannot be. Label Studio starts on
127.0.0.1 with `ML_BLOCK_LOCAL_IP=false SSRF_PROTECTION_ENABLED=false`, a project gets the labelling
config the server generates (`GET /v1/labelstudio-config`), 6 images are uploaded and a 7th task
names an image that does not exist; the server (reading the project's uploads folder, `--image-dir`)
is connected through Label Studio's own API and "Retrieve Predictions" asks for all 7 in one
`/predict`. The 6 stored predictions equal `vitpose predict --format labelstudio` on their images;
the missing image costs only its own prediction (one line on the server's console). A second
server without `--image-dir` fetches the images from Label Studio with a Personal Access Token
(`--labelstudio-url`, $LABEL_STUDIO_API_KEY) and answers the same predictions.
"""

import http.cookiejar
import json
import os
import queue
import re
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import cv2
import numpy as np
import pytest
from serve_helpers import start_server, tool_in_its_own_venv
from test_evaluate import tiny_model

import vitpose
from vitpose.cli import main

pytestmark = pytest.mark.slow
START_S = 300  # Label Studio's first start migrates its database


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LabelStudio:
    """Label Studio's API through a logged-in session (cookie and CSRF token, what its web page uses)."""

    def __init__(self, url: str, email: str, password: str):
        self.url = url
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies),
                                                  urllib.request.ProxyHandler({}))
        self.opener.open(url + "/user/login/", timeout=60).read()
        form = urllib.parse.urlencode({"email": email, "password": password,
                                       "csrfmiddlewaretoken": self._csrf()}).encode()
        self.opener.open(urllib.request.Request(url + "/user/login/", data=form, headers={"Referer": url}),
                         timeout=60).read()

    def _csrf(self) -> str:
        return next(c.value for c in self.cookies if c.name == "csrftoken")

    def api(self, method: str, path: str, payload=None, body: bytes | None = None, content_type=None):
        if payload is not None:
            body, content_type = json.dumps(payload).encode(), "application/json"
        headers = {"X-CSRFToken": self._csrf(), "Referer": self.url}
        if content_type:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(self.url + path, data=body, method=method, headers=headers)
        try:
            with self.opener.open(request, timeout=300) as response:
                data = response.read()
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{method} {path}: {e.code} {e.read()[:500]!r}") from None
        return json.loads(data) if data else None


def _multipart(files) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{name}"\r\n'
             f"Content-Type: image/jpeg\r\n\r\n".encode() + data + b"\r\n" for name, data in files]
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


@pytest.fixture
def label_studio(tmp_path):
    # its own environment (Label Studio 1.23 needs sentry-sdk < 3: the newest breaks its start)
    command = tool_in_its_own_venv("LABEL_STUDIO", "label-studio", ["label-studio==1.23.2", "sentry-sdk<3"])
    port, email, password = _free_port(), "user@example.com", secrets.token_hex(8)
    env = {**os.environ, "ML_BLOCK_LOCAL_IP": "false", "SSRF_PROTECTION_ENABLED": "false",
           "LABEL_STUDIO_USERNAME": email, "LABEL_STUDIO_PASSWORD": password,
           "LABEL_STUDIO_USER_TOKEN": secrets.token_hex(20), "SENTRY_DSN": "", "FRONTEND_SENTRY_DSN": ""}
    log = open(tmp_path / "label-studio.log", "w")
    proc = subprocess.Popen([command, "start", "--no-browser", "--port", str(port), "--internal-host", "127.0.0.1",
                             "--data-dir", str(tmp_path / "lsdata")], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Label Studio did not start: {(tmp_path / 'label-studio.log').read_text()[-3000:]}")
            time.sleep(2)
        yield LabelStudio(url, email, password), tmp_path / "lsdata"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_label_studio_stores_predictions_equal_to_predict_and_a_missing_image_costs_only_its_own(
        label_studio, tmp_path, coco_mini_dir, monkeypatch):
    ls, data_dir = label_studio
    vitpose.save_weights(tiny_model(seed=11), tmp_path / "tiny.safetensors")
    images = tmp_path / "images"
    images.mkdir()
    for path in sorted(coco_mini_dir.glob("*.jpg"))[:4]:
        shutil.copy(path, images / path.name)
    rng = np.random.default_rng(0)
    for k in (1, 2):
        cv2.imwrite(str(images / f"synthetic{k}.jpg"), rng.integers(0, 256, (160 + 20 * k, 200, 3), dtype=np.uint8))
    names = sorted(p.name for p in images.iterdir())
    assert len(names) == 6

    # the config the server writes, from a server with no Label Studio yet
    model = ["--model", tmp_path / "tiny.safetensors", "--detector", "full-frame", "--device", "cpu",
             "--precision", "fp32"]
    first = start_server(model, tmp_path)
    try:
        status, _, config = first.request("GET", "/v1/labelstudio-config")
        assert status == 200
    finally:
        assert first.stop() == 0
    project = ls.api("POST", "/api/projects", {"title": "vitpose", "label_config": config.decode()})["id"]
    body, content_type = _multipart([(name, (images / name).read_bytes()) for name in names])
    ls.api("POST", f"/api/projects/{project}/import", body=body, content_type=content_type)
    ls.api("POST", f"/api/projects/{project}/import",
           [{"image": f"/data/upload/{project}/ffffffff-missing.jpg"}])
    uploads = data_dir / "media" / "upload" / str(project)
    assert len(list(uploads.iterdir())) == 6

    server = start_server([*model, "--image-dir", uploads], tmp_path)
    try:
        ls.api("POST", "/api/ml", {"url": f"http://127.0.0.1:{server.port}", "project": project, "title": "vitpose"})
        ls.api("POST", f"/api/dm/actions?id=retrieve_tasks_predictions&project={project}",
               {"selectedItems": {"all": True, "excluded": []}})
        found = ls.api("GET", f"/api/tasks?project={project}&page_size=100")
        tasks = found["tasks"] if isinstance(found, dict) else found
        assert len(tasks) == 7
        predictions = ls.api("GET", f"/api/predictions?project={project}")
        lines = []
        while True:
            try:
                line = server.lines.get(timeout=2)
            except queue.Empty:
                break
            lines.append(line)
    finally:
        assert server.stop() == 0
    by_task = {p["task"]: p for p in predictions}
    missing = [t["id"] for t in tasks if "missing" in t["data"]["image"]]
    assert len(by_task) == 6 and missing[0] not in by_task
    assert [line for line in lines if "no prediction" in line and f"task {missing[0]}" in line], lines

    # fetching from Label Studio itself with a Personal Access Token (1.2x's default kind of key)
    pat = ls.api("POST", "/api/token/", {})["token"]
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", pat)
    fetching = start_server([*model, "--labelstudio-url", ls.url], tmp_path)
    try:
        asked = [t for t in tasks if t["id"] not in missing]
        status, answer = fetching.json("POST", "/predict", json.dumps({"tasks": asked, "label_config": config.decode()})
                                       .encode(), {"Content-Type": "application/json"})
    finally:
        assert fetching.stop() == 0
    assert status == 200 and all("result" in r for r in answer["results"]), answer
    for task, fetched in zip(asked, answer["results"]):
        assert fetched["result"] == by_task[task["id"]]["result"]

    out = tmp_path / "want.json"
    assert main(["predict", *[str(images / n) for n in names], "--model", str(tmp_path / "tiny.safetensors"),
                 "--detector", "full-frame", "--device", "cpu", "--precision", "fp32", "--format", "labelstudio",
                 "--json", str(out)]) == 0
    want = {re.sub(r".*[/=]", "", t["data"]["image"]): t["predictions"][0] for t in json.loads(out.read_text())}
    for task in tasks:
        if task["id"] in missing:
            continue
        name = re.sub(r"^[0-9a-f]{8}-", "", task["data"]["image"].rsplit("/", 1)[-1])
        got, expected = by_task[task["id"]], want[name]
        assert len(got["result"]) == len(expected["result"]) == 18
        for region, reference in zip(got["result"], expected["result"]):
            assert (region["type"], region["from_name"], region["to_name"]) == \
                (reference["type"], reference["from_name"], reference["to_name"])
            for key in ("x", "y", "width", "height"):
                if key in reference["value"]:
                    assert region["value"][key] == pytest.approx(reference["value"][key], abs=1e-3)
