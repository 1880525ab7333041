"""`vitpose serve` in front of real clients: every route holds its token, no key reaches another
host, the schema equals the routes, Label Studio gets per-task answers, every error is a console line.

In-process (the application called as ASGI, `test_serve_seams.call`) with a stand-in predictor of
the COCO skeleton; fake Label Studio hosts are `http.server`s on 127.0.0.1 that record what they get.
- The route table is walked: without the token every route answers 401 but the open ones (`/`,
  `/v1/health`, `/health`, `/webhook`); Basic auth counts the password, never the user name.
- `/openapi.json` has exactly the routes' paths and methods, and needs the token; a 405 says `Allow`.
- `/setup` never replaces a `--labelstudio-url`; without `--token` the first `/setup` names the host
  and a second naming another is a 409 whose key is kept nowhere; a text/plain `/setup` is a 415.
- A key that a later /setup brings never reaches the host an earlier one named.
- A redirect from Label Studio's host to another port is not followed (the other never sees a
  request); a Personal Access Token is refreshed into a bearer token, renewed once on a 401.
- One `/predict` of 4 tasks with one image missing: 3 predictions, one `{"error"}`, one console line.
"""

import base64
import http.server
import json
import threading

import cv2
import numpy as np
import pytest
from test_serve_seams import IMAGE, StandIn, call

from vitpose.cli import main
from vitpose.data.metainfo import dataset_info
from vitpose.serve.labelstudio import RequestError, TaskImages, labelling_names

pytest.importorskip("starlette", reason='vitpose serve needs the serve extra: pip install -e ".[serve]"')
pytest.importorskip("python_multipart", reason='vitpose serve needs the serve extra: pip install -e ".[serve]"')

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json"}
OPEN_ROUTES = {("GET", "/"), ("GET", "/v1/health"), ("GET", "/health"), ("POST", "/webhook")}
PAT = "eyJhbGciOiJIUzI1NiJ9.eyJ0b2tlbl90eXBlIjoicmVmcmVzaCJ9.c2lnbmF0dXJl"  # the shape of a JWT


class CocoStandIn(StandIn):
    skeleton = dataset_info("coco")
    detector = "full-frame"  # Label Studio's tasks come without boxes


@pytest.fixture
def serve():
    """serve(task_images=None, **settings) -> (app, service); batch threads closed after the test."""
    from vitpose.serve.app import Settings, build_app, open_service

    services = []

    def make(task_images=None, **settings):
        service = open_service(CocoStandIn(), None, Settings(model_name="stand-in", **settings), max_wait=0.0,
                               task_images=task_images)
        services.append(service)
        return build_app(service), service

    yield make
    for service in services:
        service.runner.close()


def basic(user: str, password: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def route_table(app):
    return sorted((method, route.path) for route in app.routes for method in route.methods if method != "HEAD")


def test_every_route_but_the_open_ones_needs_the_token(serve):
    app, _ = serve(token=TOKEN)
    routes = route_table(app)
    assert OPEN_ROUTES < set(routes) and len(routes) >= 11
    for method, path in routes:
        body = json.dumps({"tasks": []}).encode() if path == "/predict" else b""
        status, _, answer, _ = call(app, method, path, body, JSON)
        if (method, path) in OPEN_ROUTES:
            assert status == 200, (method, path, answer)
        else:
            assert status == 401 and "token" in answer["error"], (method, path, answer)
            # Label Studio's Basic auth: the token is the password; in the user name it is no token
            assert call(app, method, path, body, {**JSON, **basic(TOKEN, "x")})[0] == 401, (method, path)
            assert call(app, method, path, body, {**JSON, **basic("label-studio", TOKEN)})[0] != 401, (method, path)
            assert call(app, method, path, body, {**JSON, **AUTH})[0] != 401, (method, path)


@pytest.mark.parametrize("path", ["/v1/model", "/predict", "/setup", "/v1/labelstudio-config", "/openapi.json"])
def test_the_endpoints_a_mutation_left_open_refuse_a_caller_without_the_token(serve, path):
    app, _ = serve(token=TOKEN)
    method = "POST" if path in ("/predict", "/setup") else "GET"
    status, headers, answer, _ = call(app, method, path, b'{"tasks": []}', JSON)
    assert status == 401 and "Bearer" in headers["www-authenticate"], answer
    status, _, answer, _ = call(app, method, path, b'{"tasks": []}', {**JSON, **basic("label-studio", TOKEN)})
    assert status == 200, answer


def test_the_openapi_schema_has_exactly_the_routes_and_needs_the_token(serve):
    from vitpose.serve.openapi import openapi_schema

    app, _ = serve(token=TOKEN)
    schema = openapi_schema()
    described = sorted((method.upper(), path) for path, item in schema["paths"].items() for method in item)
    assert described == route_table(app)
    assert {(m.upper(), p) for p, item in schema["paths"].items() for m, op in item.items()
            if op.get("security") == []} == OPEN_ROUTES
    assert call(app, "GET", "/openapi.json")[0] == 401
    status, headers, answer, _ = call(app, "GET", "/openapi.json", headers=AUTH)
    assert status == 200 and headers["content-type"].startswith("application/json") and answer == schema


def test_a_405_says_allow_and_every_error_is_json_and_one_console_line(serve, capsys):
    app, _ = serve(token=TOKEN)
    status, headers, answer, _ = call(app, "TRACE", "/v1/predict", headers=AUTH)
    assert status == 405 and headers["allow"] == "POST" and set(answer) == {"error"}
    status, headers, answer, _ = call(app, "DELETE", "/setup", headers=AUTH)
    assert status == 405 and headers["allow"] == "POST"
    assert call(app, "GET", "/nowhere", headers=AUTH)[2] == {"error": "GET /nowhere: Not Found"}
    assert call(app, "GET", "/v1/model")[0] == 401
    status, _, answer, _ = call(app, "POST", "/v1/predict?boxes=[[1,2,3]]", IMAGE, AUTH)
    assert status == 400
    assert call(app, "GET", "/v1/health")[0] == 200  # no line for an answer that is no error
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["vitpose serve: TRACE /v1/predict 405: TRACE /v1/predict: Method Not Allowed",
                     "vitpose serve: DELETE /setup 405: DELETE /setup: Method Not Allowed",
                     "vitpose serve: GET /nowhere 404: GET /nowhere: Not Found",
                     "vitpose serve: GET /v1/model 401: missing or wrong token: send 'Authorization: Bearer TOKEN' "
                     "(vitpose serve --token)",
                     f"vitpose serve: POST /v1/predict 400: {answer['error']}"]


def test_a_bug_is_a_500_and_one_console_line(capsys):
    from vitpose.serve.app import Settings, build_app, open_service

    service = open_service(StandIn(ValueError("deep")), None, Settings(model_name="s"), max_wait=0.0)
    try:
        status, _, answer, raised = call(build_app(service), "POST", "/v1/predict?boxes=[[1,1,9,9]]", IMAGE)
    finally:
        service.runner.close()
    assert status == 500 and isinstance(raised, ValueError)
    assert capsys.readouterr().err.splitlines() == ["vitpose serve: POST /v1/predict 500: internal error: ValueError: deep"]


def test_the_labelling_config_names_every_keypoint_and_setup_takes_it(serve):
    app, _ = serve(token=TOKEN)
    status, headers, config, _ = call(app, "GET", "/v1/labelstudio-config", headers=AUTH)
    assert status == 200 and headers["content-type"].startswith("application/xml")
    names = labelling_names(config, CocoStandIn.skeleton.keypoint_names)
    assert names.keypoint_labels == CocoStandIn.skeleton.keypoint_names and len(names.keypoint_labels) == 17
    status, _, answer, _ = call(app, "POST", "/setup", json.dumps({"schema": config}).encode(), {**JSON, **AUTH})
    assert (status, answer) == (200, {"model_version": "vitpose"})
    status, _, answer, _ = call(app, "POST", "/webhook", b'{"action": "ANNOTATION_CREATED"}', JSON)
    assert (status, answer) == (200, {"status": "ok"})


def test_setup_never_replaces_a_command_line_host_nor_sends_its_key_elsewhere(serve, monkeypatch):
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", "env-key")
    images = TaskImages(labelstudio_url="http://ls.internal:8080")
    app, _ = serve(images)  # no --token: anyone may call /setup
    setup = json.dumps({"hostname": "http://attacker.example", "access_token": "theirs"}).encode()
    assert call(app, "POST", "/setup", setup, JSON)[0] == 200
    assert images.labelstudio_url == "http://ls.internal:8080" and images.access_token == "env-key"
    assert images.auth.keys["http://attacker.example:80"] == "theirs"  # its own key, for its own host only
    # /setup naming the same host with a key: the command line's key stays
    same = json.dumps({"hostname": "http://ls.internal:8080/", "access_token": "other"}).encode()
    assert call(app, "POST", "/setup", same, JSON)[0] == 200 and images.access_token == "env-key"


def test_without_a_token_the_first_setup_names_the_host_and_no_later_one_changes_it(serve, monkeypatch):
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", "env-key")
    images = TaskImages()
    app, _ = serve(images)
    assert images.access_token is None and images.auth.keys == {}  # the environment's key has no host: unused
    first = json.dumps({"hostname": "http://127.0.0.1:18900"}).encode()
    assert call(app, "POST", "/setup", first, JSON)[0] == 200 and images.labelstudio_url == "http://127.0.0.1:18900"
    assert images.access_token is None  # $LABEL_STUDIO_API_KEY goes to --labelstudio-url only, never /setup's host
    second = json.dumps({"hostname": "http://127.0.0.1:18901", "access_token": "LS-SECRET"}).encode()
    status, _, answer, _ = call(app, "POST", "/setup", second, JSON)
    assert status == 409 and "--labelstudio-url" in answer["error"], answer
    assert images.labelstudio_url == "http://127.0.0.1:18900" and "LS-SECRET" not in images.auth.keys.values()
    # a web page's form post (text/plain needs no preflight) is not read
    status, _, answer, _ = call(app, "POST", "/setup", first, {"Content-Type": "text/plain"})
    assert status == 415 and "application/json" in answer["error"]
    # with --token an authenticated /setup may name another host
    images = TaskImages()
    app, _ = serve(images, token=TOKEN)
    for hostname in ("http://127.0.0.1:18900", "http://127.0.0.1:18901"):
        body = json.dumps({"hostname": hostname, "access_token": "k"}).encode()
        assert call(app, "POST", "/setup", body, {**JSON, **AUTH})[0] == 200 and images.labelstudio_url == hostname


class FakeLabelStudio:
    """An http.server on 127.0.0.1 that records (method, path, Authorization) and answers `answer(handler)`."""

    def __init__(self, answer):
        self.seen = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                outer.seen.append(("GET", self.path, self.headers.get("Authorization")))
                answer(self)

            def do_POST(self):  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                outer.seen.append(("POST", self.path, self.rfile.read(length).decode()))
                answer(self)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def reply(handler, status: int, body: bytes = b"", headers=()):
    handler.send_response(status)
    for key, value in headers:
        handler.send_header(key, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def test_a_key_sent_to_setup_never_reaches_the_host_an_earlier_setup_named(serve, tmp_path):
    """The attack of a tokenless server: a local process names its own host first, then Label
    Studio's /setup brings the real key; the first host must never see that key."""
    attacker = FakeLabelStudio(lambda h: reply(h, 200, IMAGE))
    label_studio = FakeLabelStudio(lambda h: reply(h, 200, IMAGE))
    try:
        app, _ = serve(TaskImages(image_dir=tmp_path))
        for host, key in ((attacker.url, None), (label_studio.url, "LS-SECRET-TOKEN")):
            call(app, "POST", "/setup", json.dumps({"hostname": host, "access_token": key}).encode(), JSON)
        task = {"tasks": [{"id": 1, "data": {"image": "/data/upload/3/photo.png"}}]}
        assert call(app, "POST", "/predict", json.dumps(task).encode(), JSON)[0] == 200
        assert attacker.seen == [("GET", "/data/upload/3/photo.png", None)] and label_studio.seen == []
    finally:
        attacker.close()
        label_studio.close()


def test_no_redirect_leaves_the_labelstudio_host_and_no_key_goes_with_one():
    elsewhere = FakeLabelStudio(lambda h: reply(h, 200, IMAGE))
    home = FakeLabelStudio(lambda h: reply(h, 302, headers=[("Location", elsewhere.url + "/stolen.png")])
                           if h.path.startswith("/data/") else reply(h, 200, IMAGE))
    try:
        images = TaskImages(labelstudio_url=home.url, access_token="LS-SECRET-TOKEN")
        with pytest.raises(RequestError) as refused:
            images.read("/data/upload/1/photo.png", "task 3")
        assert refused.value.status == 502 and "another host" in str(refused.value) and "task 3" in str(refused.value)
        assert elsewhere.seen == []  # never asked, so never given the key
        assert home.seen == [("GET", "/data/upload/1/photo.png", "Token LS-SECRET-TOKEN")]
        # a redirect on the same host is followed, with the key
        same = FakeLabelStudio(lambda h: reply(h, 302, headers=[("Location", "/media/photo.png")])
                               if h.path.startswith("/data/") else reply(h, 200, IMAGE))
        try:
            data, name = TaskImages(labelstudio_url=same.url, access_token="k").read("/data/upload/1/photo.png", "t")
            assert (data, name) == (IMAGE, "photo.png")
            assert [s[1:] for s in same.seen] == [("/data/upload/1/photo.png", "Token k"), ("/media/photo.png", "Token k")]
        finally:
            same.close()
    finally:
        home.close()
        elsewhere.close()


def test_a_personal_access_token_is_refreshed_into_a_bearer_token_and_renewed_on_a_401():
    issued = []

    def answer(h):
        if h.command == "POST":
            ok = h.path == "/api/token/refresh/" and json.loads(fake.seen[-1][2]) == {"refresh": PAT}
            issued.append(f"access-{len(issued) + 1}")
            reply(h, 200 if ok else 400, json.dumps({"access": issued[-1]}).encode())
        else:  # the first access token has expired by the time the image is asked
            reply(h, 200, IMAGE) if h.headers.get("Authorization") == "Bearer access-2" else reply(h, 401)

    fake = FakeLabelStudio(answer)
    try:
        images = TaskImages(labelstudio_url=fake.url, access_token=PAT)
        assert images.read("/data/upload/1/a.png", "task 1") == (IMAGE, "a.png")
        assert [s[:2] for s in fake.seen] == [("POST", "/api/token/refresh/"), ("GET", "/data/upload/1/a.png"),
                                             ("POST", "/api/token/refresh/"), ("GET", "/data/upload/1/a.png")]
        assert [s[2] for s in fake.seen if s[0] == "GET"] == ["Bearer access-1", "Bearer access-2"]
        images.read("/data/upload/1/b.png", "task 2")  # the access token is kept while it works
        assert fake.seen[-1] == ("GET", "/data/upload/1/b.png", "Bearer access-2") and len(fake.seen) == 5
    finally:
        fake.close()


def test_a_legacy_token_that_label_studio_refuses_is_a_502_that_names_the_fix():
    fake = FakeLabelStudio(lambda h: reply(h, 401))
    try:
        with pytest.raises(RequestError) as refused:
            TaskImages(labelstudio_url=fake.url, access_token="0123abcd").read("/data/upload/1/a.png", "task 1")
        assert refused.value.status == 502 and "Personal Access Token" in str(refused.value)
        assert fake.seen == [("GET", "/data/upload/1/a.png", "Token 0123abcd")]  # not retried: nothing to renew
    finally:
        fake.close()


def test_a_task_that_fails_gets_no_prediction_and_the_others_theirs(serve, tmp_path, capsys):
    cv2.imwrite(str(tmp_path / "a.png"), np.full((40, 50, 3), 80, np.uint8))
    app, _ = serve(TaskImages(image_dir=tmp_path), token=TOKEN)
    inline = "data:image/png;base64," + base64.b64encode(IMAGE).decode()
    tasks = [{"id": 1, "data": {"image": "/data/local-files/?d=a.png"}}, {"id": 2, "data": {"image": inline}},
             {"id": 7, "data": {"image": "/data/local-files/?d=missing.png"}}, {"id": 4, "data": {"image": inline}}]
    status, _, answer, _ = call(app, "POST", "/predict", json.dumps({"tasks": tasks}).encode(), {**JSON, **AUTH})
    assert status == 200, answer
    results = answer["results"]
    assert len(results) == 4 and [("result" in r) for r in results] == [True, True, False, True]
    assert set(results[2]) == {"error"} and "task 7" in results[2]["error"] and "missing.png" in results[2]["error"]
    assert all(r["model_version"] == "vitpose" and r["result"] == [] and "score" in r for i, r in enumerate(results)
               if i != 2)
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("vitpose serve: POST /predict 422: no prediction: task 7: ")
    # when every task fails, the request fails with the first task's error
    status, _, answer, _ = call(app, "POST", "/predict", json.dumps({"tasks": tasks[2:3]}).encode(), {**JSON, **AUTH})
    assert status == 422 and "task 7" in answer["error"]


def test_a_host_beyond_this_machine_without_a_token_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("VITPOSE_SERVE_TOKEN", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--port", "0", "--model", str(tmp_path / "none.pth")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("vitpose serve: error: --host 0.0.0.0 without --token") and "--token" in line


def test_a_label_studio_body_nested_too_deep_is_a_400_not_a_500(serve):
    app, _ = serve()
    for body in (b"[" * 100_000, b'{"tasks": ' + b"[" * 100_000 + b"}"):
        status, _, answer, raised = call(app, "POST", "/predict", body, JSON)
        assert (status, answer, raised) == (400, {"error": "the body must be JSON"}, None)


@pytest.mark.slow
def test_schemathesis_finds_no_5xx_and_no_error_that_is_not_json(tmp_path):
    """schemathesis (its own environment: $SCHEMATHESIS names its command, else `schemathesis` on
    PATH, else installed once into ~/.cache/vitpose-tests/) against a live server through `/openapi.json`: no 5xx, every answer as the schema says
    (every error a JSON `{"error"}`), `Allow` on a 405."""
    import subprocess

    from serve_helpers import start_server, tool_in_its_own_venv
    from test_evaluate import tiny_model

    import vitpose

    command = tool_in_its_own_venv("SCHEMATHESIS", "schemathesis", ["schemathesis==4.32.5"])
    vitpose.save_weights(tiny_model(seed=11), tmp_path / "tiny.safetensors")
    server = start_server(["--model", tmp_path / "tiny.safetensors", "--detector", "full-frame", "--device", "cpu",
                           "--precision", "fp32", "--token", TOKEN, "--image-dir", tmp_path], tmp_path)
    try:
        checks = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance," \
                 "unsupported_method"
        done = subprocess.run([command, "run", f"http://127.0.0.1:{server.port}/openapi.json", "-H",
                               f"Authorization: Bearer {TOKEN}", "--checks", checks, "--max-examples", "30",
                               "--seed", "5", "--no-color"], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert "No issues found" in done.stdout
        assert server.json("GET", "/v1/health")[1]["status"] == "ok"
    finally:
        assert server.stop() == 0


def test_serve_prints_the_labelling_config_of_its_model_and_exits(tmp_path, capsys):
    """`vitpose serve --labelstudio-config`: the config a Label Studio project is made with, every keypoint
    of the model named, printed without starting a server (what GET /v1/labelstudio-config answers)."""
    from test_evaluate import tiny_model

    import vitpose
    from vitpose.cli import main
    from vitpose.data.metainfo import dataset_info
    from vitpose.serve.labelstudio import labelling_config

    vitpose.save_weights(tiny_model(seed=11), tmp_path / "tiny.safetensors")
    code = main(["serve", "--model", str(tmp_path / "tiny.safetensors"), "--labelstudio-config", "--device", "cpu",
                 "--detector", "full-frame", "--port", "1"])
    printed = capsys.readouterr().out
    names = dataset_info("coco").keypoint_names
    assert code == 0 and printed.strip() == labelling_config(names).strip()
    assert labelling_names(printed, names).keypoint_labels == tuple(names)
