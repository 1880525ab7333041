"""`vitpose serve`'s HTTP application: poses of uploaded images, the page, Label Studio's backend.

Endpoints (JSON unless said; every error is `{"error": "one line"}` with a 4xx or 5xx status):
- `POST /v1/predict`: an image as the raw body (any Content-Type) or as the `image` field of a
  multipart form. Options as query parameters or form fields: `boxes` (JSON `[[x1, y1, x2, y2(,
  score)], ...]`, `[]` for nobody; default: the server's detector), `box_format` (`xyxy` | `xywh`),
  `format` (`coco` | `labelstudio` | `cvat`), `file_name` (default: the upload's name, else
  "image"), `mark_below`. Answer for `coco`: `{"records": [...], "file_name", "image_id", "width",
  "height", "model", "seconds"}`, the records `vitpose predict --json` writes for that image
  (`vitpose.inference.records.image_records`); `labelstudio` / `cvat`: the text `vitpose predict
  --format` writes for it.
- `GET /v1/health`, `GET /v1/model` (the model's spec, skeleton and the server's settings),
  `GET /metrics` (Prometheus text: `vitpose.serve.batching.Metrics`), `GET /` (the page),
  `GET /openapi.json` (`vitpose.serve.openapi`).
- Label Studio's ML backend: `POST /setup`, `POST /predict` (JSON bodies only; a task that fails
  gets `{"error"}` and no prediction, the others theirs), `GET /health`, `POST /webhook`
  (acknowledged), and `GET /v1/labelstudio-config`, the labelling config of the model's keypoints
  (`vitpose.serve.labelstudio`).

Limits (`vitpose.serve.limits`): the body (`--max-body-mb`, checked on Content-Length and while
reading; `--body-timeout` seconds without a byte of it, or slower than 16 KB/s after that: 408 and
the connection closed), the pixel
limit (`vitpose.files`, read from the image's header before decoding), the pixels decoded at once
(`--max-pixels-in-flight`, counted from the headers: beyond it a short wait, then 503 with
`Retry-After`; Label Studio's tasks are decoded one at a time within it), the boxes of a request
(`--max-boxes`, beyond it 413), a per-request timeout (504; a request whose client has gone is not
computed), the requests answered at once (`--max-in-flight`, beyond it 503 with `Retry-After`;
`/v1/health` says when the server is saturated). With `--token`, every endpoint but `/`,
`/v1/health`, `/health` and `/webhook` (which reads nothing) needs `Authorization: Bearer TOKEN`
(or HTTP Basic with the token as password: what Label Studio sends to a backend). Every answer of
400 or more is one line on the console (`ErrorLog`).
Images are decoded as `vitpose predict` decodes files (`vitpose.data.image_io.decode_image`: BGR,
truncation and pixel checks), so the server's records for an image equal the command's.

Built on Starlette's own seams: the cross-cutting work is ASGI middleware around the routes of the
`ENDPOINTS` table (`RequestMetrics`: time and count every answer by endpoint and status;
`InFlightLimit`: 503 beyond `--max-in-flight`; `TokenCheck`: 401 without the token), and errors
go through exception handlers with the command line's rule: a `vitpose.errors.UserError` is the
client's, answered with its `http_status` (a 4xx: 422 unless it says otherwise; `RequestError`
names its own); anything else is a bug, 500 `internal error: ...`, its traceback logged once by
the server (Starlette's error middleware re-raises it to uvicorn), as it is exit 70 on the command
line. Request parsing raises `RequestError`s itself, so a `ValueError` from deep in the library
is never dressed up as the client's mistake.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers, UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from vitpose.data.errors import DataError
from vitpose.data.image_io import decode_image
from vitpose.errors import UserError
from vitpose.files import ImageTooLargeError, check_pixel_limit
from vitpose.inference.calibrate import calibration_summary
from vitpose.inference.pipeline import caller_boxes, image_ids
from vitpose.inference.records import FORMATS, image_records, labelstudio_tasks, parse_marking, render_records
from vitpose.inference.runner import predict_chunk
from vitpose.serve.batching import BatchRunner, Metrics
from vitpose.serve.console import ErrorLog, error_line
from vitpose.serve.labelstudio import MODEL_VERSION, RequestError, TaskImages, labelling_config, labelling_names
from vitpose.serve.limits import LimitError, PixelBudget, client_gone, default_pixel_budget, header_pixels, read_body
from vitpose.serve.openapi import openapi_schema

__all__ = ["ENDPOINTS", "Endpoint", "InFlightLimit", "RequestMetrics", "Service", "Settings", "TokenCheck",
           "batch_function", "build_app", "error_response", "open_service", "read_body"]


@dataclass
class Settings:
    """What `vitpose serve`'s flags set (see `vitpose.cli.serve`)."""

    model_name: str
    max_body: int = 20 * 2**20
    max_pixels: int | None = None  # None: $VITPOSE_MAX_PIXELS or vitpose.files' default
    timeout: float = 60.0
    token: str | None = None
    mark_below: float = 0.3
    mark_by: str = "auto"  # what mark_below compares: p where the model is calibrated (MARK_BY)
    max_in_flight: int = 64  # requests being answered at once (each holds a body and a decoded image)
    body_timeout: float = 10.0  # seconds a request body may go without a byte arriving
    max_pixels_in_flight: int | None = None  # None: twice the pixel limit (limits.default_pixel_budget)
    pixel_wait: float = 2.0  # seconds a request waits for --max-pixels-in-flight before its 503
    max_boxes: int = 1000  # boxes of one request (each one crop through the network)
    details: dict = field(default_factory=dict)  # device, precision, flip test, ... for /v1/model


class Service:
    """The loaded model, its batch thread, the metrics and the settings: what the endpoints share
    (`open_service` builds one for a predictor)."""

    def __init__(self, predictor, spec, settings: Settings, runner: BatchRunner, metrics: Metrics,
                 task_images: TaskImages):
        self.predictor = predictor
        self.skeleton = predictor.skeleton
        self.spec = spec
        self.settings = settings
        self.runner = runner
        self.metrics = metrics
        self.task_images = task_images
        budget = settings.max_pixels_in_flight
        self.budget = PixelBudget(default_pixel_budget(settings.max_pixels) if budget is None else budget,
                                  settings.pixel_wait)

    async def poses(self, image: np.ndarray, boxes, receive=None):
        """The image's `Poses`, computed in a batch with other requests' images. `receive`: the
        request's, once its body was read; a client that closes its connection cancels the job."""
        if boxes is None and self.predictor.detector is None:
            raise RequestError(400, "this server has no person detector (--detector none): send boxes")
        future = self.runner.submit(image, boxes)
        answer = asyncio.wrap_future(future)  # cancelling it cancels the job: its remaining slices are dropped
        gone = asyncio.ensure_future(client_gone(receive)) if receive is not None else None
        try:
            done, _ = await asyncio.wait([answer] + ([gone] if gone else []), timeout=self.settings.timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            if gone is not None:
                gone.cancel()
        if answer in done:
            return answer.result()
        answer.cancel()
        if gone is not None and gone in done:
            raise RequestError(499, "the client closed the connection; its poses were not computed")
        raise RequestError(504, f"no answer within the request timeout of {self.settings.timeout:g} s "
                                f"(--timeout); the server is busy")

    async def decoded_poses(self, data: bytes, name: str, boxes, receive=None):
        """(the `Poses`, (height, width)) of an encoded image, decoded within the pixel budget (held
        until its poses are computed: the decoded image lives that long)."""
        try:
            check_pixel_limit(np.frombuffer(data, np.uint8), name, self.settings.max_pixels)
        except ImageTooLargeError as e:
            raise RequestError(413, str(e)) from None
        async with self.budget.hold(header_pixels(data, self.settings.max_pixels)):
            image = await run_in_threadpool(decode, data, name, self.settings.max_pixels)
            return await self.poses(image, boxes, receive), image.shape[:2]


class _CountedPasses:
    """The predictor as `predict_chunk` calls it, counting the forward passes of each call into
    `metrics`: its crops (the boxes given, or the people the detector found) in slices of the
    predictor's `batch_size`, timed by its own timer's "pose" stage. A view around the predictor:
    the predictor itself is never changed."""

    def __init__(self, predictor, metrics: Metrics):
        self.predictor = predictor
        self.metrics = metrics

    def __call__(self, images, boxes=None, **options):
        timer = getattr(self.predictor, "timer", None)
        before = timer.seconds.get("pose", 0.0) if timer is not None else 0.0
        start = time.perf_counter()
        poses = self.predictor(images, boxes=boxes, **options)
        seconds = timer.seconds.get("pose", 0.0) - before if timer is not None else time.perf_counter() - start
        given = boxes if boxes is not None else [None] * len(poses)
        crops = sum(len(b) if b is not None else len(p) for b, p in zip(given, poses))
        self.metrics.pipeline_call(crops, self.predictor.batch_size, seconds)
        return poses


def batch_function(predictor, metrics: Metrics):
    """`run_batch(images, boxes, labels, failures)` for a `BatchRunner`: the project's one chunk
    rule (`predict_chunk`: the batch in one call of the pipeline, else image by image) on BGR images,
    forward passes counted into `metrics`."""
    counted = _CountedPasses(predictor, metrics)

    def run_batch(images, boxes, labels, failures):
        return predict_chunk(counted, images, boxes, labels, failures, channels="bgr")

    return run_batch


def open_service(predictor, spec, settings: Settings, *, max_wait: float,
                 task_images: TaskImages | None = None) -> Service:
    """The service of a predictor: its batch thread (batches of up to the predictor's `batch_size`
    crops, one forward pass) and the metrics. The predictor is used as it was opened."""
    metrics = Metrics()
    runner = BatchRunner(batch_function(predictor, metrics), predictor.batch_size, max_wait)
    return Service(predictor, spec, settings, runner, metrics, task_images if task_images is not None else TaskImages())


# ----------------------------------------------------------------------------------------------
# Request parts


async def _form(headers: Headers, body: bytes) -> dict:
    async def stream():
        yield body
        yield b""

    try:
        form = await MultiPartParser(headers, stream(), max_files=4, max_fields=16, max_part_size=2**20).parse()
    except MultiPartException as e:
        raise RequestError(400, f"the multipart form could not be read ({e.message})") from None
    fields = {}
    for key, value in form.multi_items():
        if key in fields:
            raise RequestError(400, f"form field {key!r} is given twice")
        if isinstance(value, UploadFile):
            fields[key] = (await value.read(), value.filename)
            await value.close()
        else:
            fields[key] = value
    return fields


def _option(fields: dict, query, name: str, default=None):
    value = fields.get(name, query.get(name))
    if isinstance(value, tuple):
        raise RequestError(400, f"form field {name!r} must be text, not a file")
    return default if value is None else value


def parse_boxes(text, box_format: str, max_boxes: int | None = None):
    """`boxes` (JSON text) -> (M, 5) float32 xyxy + score, or None; RequestError names the problem
    (413 for more than `max_boxes`)."""
    if text is None:
        return None
    if box_format not in ("xyxy", "xywh"):
        raise RequestError(400, f"box_format must be 'xyxy' or 'xywh', got {box_format!r}")
    try:
        rows = json.loads(text)
    except ValueError:
        raise RequestError(400, f"boxes must be JSON, e.g. [[x1, y1, x2, y2], ...]; got {str(text)[:80]!r}") from None
    if max_boxes is not None and isinstance(rows, list) and len(rows) > max_boxes:
        raise RequestError(413, f"{len(rows)} boxes, over the limit of {max_boxes} per request (--max-boxes); "
                                f"send them in several requests")
    if not isinstance(rows, list) or not all(
            isinstance(row, list) and len(row) in (4, 5)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in row)
            for row in rows):
        raise RequestError(400, f"boxes must be a list of [x1, y1, x2, y2] or [x1, y1, x2, y2, score] finite "
                                f"numbers ({box_format}); got {str(text)[:80]!r}")
    try:
        found = caller_boxes(np.asarray(rows, np.float32).reshape(len(rows), -1) if rows else [], box_format)
    except (ValueError, DataError) as e:
        raise RequestError(422, f"boxes: {e}") from None
    return found.as_array()


def decode(data: bytes, name: str, max_pixels: int | None) -> np.ndarray:
    """Image bytes -> BGR uint8, as `vitpose predict` reads a file; RequestError (4xx) otherwise."""
    if not data:
        raise RequestError(400, "the body is empty: send an image (raw bytes, or the 'image' field of a form)")
    buf = np.frombuffer(data, np.uint8)
    try:
        check_pixel_limit(buf, name, max_pixels)
        return decode_image(buf, name, max_pixels=max_pixels)
    except ImageTooLargeError as e:
        raise RequestError(413, str(e)) from None
    except DataError as e:
        raise RequestError(422, str(e)) from None


def _file_name(name) -> str:
    name = Path(str(name or "")).name
    if not name or len(name) > 255 or any(ord(c) < 32 for c in name):
        return "image"
    return name


# ----------------------------------------------------------------------------------------------
# Endpoints


def _service(request: Request) -> Service:
    return request.app.state.service


async def predict(request: Request) -> Response:
    service = _service(request)
    start = time.perf_counter()
    body = await read_body(request, service.settings.max_body, service.settings.body_timeout)
    content_type = request.headers.get("content-type", "")
    fields, upload_name = {}, None
    if content_type.lower().startswith("multipart/form-data"):
        fields = await _form(request.headers, body)
        if "image" not in fields or not isinstance(fields["image"], tuple):
            raise RequestError(400, "the form has no file field 'image'")
        body, upload_name = fields.pop("image")
    query = request.query_params
    fmt = _option(fields, query, "format", "coco")
    if fmt not in FORMATS:
        raise RequestError(400, f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    mark_below, mark_by = parse_marking(_option(fields, query, "mark_below", service.settings.mark_below),
                                        _option(fields, query, "mark_below_by", service.settings.mark_by))
    boxes = parse_boxes(_option(fields, query, "boxes"), _option(fields, query, "box_format", "xyxy"),
                        service.settings.max_boxes)
    name = _file_name(_option(fields, query, "file_name", upload_name))
    poses, (height, width) = await service.decoded_poses(body, name, boxes, request.receive)
    image_id = image_ids([name])[0][0]
    records, nonfinite = image_records(poses, name, image_id, (height, width) if fmt != "coco" else None)
    if fmt in ("labelstudio", "cvat"):
        return Response(render_records(records, fmt, service.skeleton, mark_below, mark_by),
                        media_type="application/json" if fmt == "labelstudio" else "application/xml")
    return JSONResponse({"records": records, "file_name": name, "image_id": image_id, "width": width,
                         "height": height, "nonfinite": nonfinite, "model": service.settings.model_name,
                         "seconds": round(time.perf_counter() - start, 6)})


async def health(request: Request) -> Response:
    service = _service(request)
    in_flight, limit = service.metrics.in_flight, service.settings.max_in_flight
    saturated = in_flight >= limit or service.budget.limit > 0 and service.budget.in_use >= service.budget.limit
    return JSONResponse({"status": "saturated" if saturated else "ok", "model": service.settings.model_name,
                         "in_flight": in_flight, "max_in_flight": limit, "saturated": saturated,
                         "pixels_in_flight": service.budget.in_use, "max_pixels_in_flight": service.budget.limit})


async def model_info(request: Request) -> Response:
    service = _service(request)
    skeleton = service.skeleton
    return JSONResponse({
        "model": service.settings.model_name,
        "spec": service.spec.to_dict() if service.spec is not None else None,
        "calibration": calibration_summary(getattr(service.predictor, "calibration", None)),
        "skeleton": {"name": skeleton.name, "keypoint_names": list(skeleton.keypoint_names),
                     "limbs": [list(pair) for pair in skeleton.skeleton],
                     "keypoint_colors": [list(c) for c in skeleton.keypoint_colors],
                     "link_colors": [list(c) for c in skeleton.link_colors]},
        "settings": {"max_batch": service.runner.max_batch, "max_wait_ms": 1000 * service.runner.max_wait,
                     "max_body_bytes": service.settings.max_body, "timeout_s": service.settings.timeout,
                     "mark_below": service.settings.mark_below, "mark_below_by": service.settings.mark_by,
                     "body_timeout_s": service.settings.body_timeout,
                     "max_boxes": service.settings.max_boxes, "max_pixels_in_flight": service.budget.limit,
                     **service.settings.details},
    })


async def metrics(request: Request) -> Response:
    return PlainTextResponse(_service(request).metrics.render(), media_type="text/plain; version=0.0.4")


async def page(request: Request) -> Response:
    return HTMLResponse(resources.files("vitpose.serve").joinpath("page/index.html").read_text(encoding="utf-8"))


# --- Label Studio's ML backend ----------------------------------------------------------------


async def _json_body(request: Request, service: Service) -> dict:
    # JSON only: a web page can send a text/plain body to a local server without asking first
    if request.headers.get("content-type", "").partition(";")[0].strip().lower() != "application/json":
        raise RequestError(415, f"{request.url.path} reads JSON: send 'Content-Type: application/json'")
    body = await read_body(request, service.settings.max_body, service.settings.body_timeout)
    try:
        data = json.loads(body or b"null")
    except (ValueError, RecursionError):  # nested beyond Python's recursion limit: no JSON it reads either
        raise RequestError(400, "the body must be JSON") from None
    if not isinstance(data, dict):
        raise RequestError(400, f"the body must be a JSON object, got {type(data).__name__}")
    return data


async def ls_health(request: Request) -> Response:
    return JSONResponse({"status": "UP", "model_class": "vitpose", "model": _service(request).settings.model_name})


async def ls_setup(request: Request) -> Response:
    service = _service(request)
    data = await _json_body(request, service)
    labelling_names(data.get("schema"), service.skeleton.keypoint_names)  # a config it cannot answer: now
    service.task_images.set_up(data.get("hostname"), data.get("access_token"),
                               may_replace=service.settings.token is not None)
    return JSONResponse({"model_version": MODEL_VERSION})


async def ls_predict(request: Request) -> Response:
    service = _service(request)
    data = await _json_body(request, service)
    tasks = data.get("tasks")
    if not isinstance(tasks, list):
        raise RequestError(400, "'tasks' must be a list of Label Studio tasks")
    names = labelling_names(data.get("label_config"), service.skeleton.keypoint_names)
    settings = service.settings

    async def one(t: int, task) -> dict:
        where = f"task {task.get('id', f'[{t}]')}" if isinstance(task, dict) else f"task [{t}]"
        if not isinstance(task, dict) or not isinstance(task.get("data"), dict):
            raise RequestError(400, f"{where}: must be an object with 'data'")
        url = task["data"].get(names.data_key)
        raw, name = await run_in_threadpool(service.task_images.read, url, where)
        try:
            poses, shape = await service.decoded_poses(raw, name, None, request.receive)
        except LimitError as e:
            raise LimitError(e.http_status, f"{where}: {e}", e.headers) from None
        except RequestError as e:
            raise RequestError(e.http_status, f"{where}: {e}") from None
        records, _ = image_records(poses, name, image_ids([name])[0][0], shape)
        answer = labelstudio_tasks(records, service.skeleton, settings.mark_below, settings.mark_by,
                                   **names.writer_names())
        return answer[0]["predictions"][0] if answer else {"model_version": MODEL_VERSION, "score": 0.0, "result": []}

    results = []
    for t, task in enumerate(tasks):  # one task at a time: its image decoded within the pixel budget
        try:
            results.append(await one(t, task))
        except LimitError:
            raise  # the server is full: the whole request again later (503 with Retry-After)
        except UserError as e:  # a task that fails gets no prediction, the others theirs
            error_line(request.method, request.url.path, e.http_status, f"no prediction: {e}")
            results.append(e)
    if results and all(isinstance(r, UserError) for r in results):
        raise results[0]
    return JSONResponse({"results": [{"error": str(r)} if isinstance(r, UserError) else r for r in results],
                         "model_version": MODEL_VERSION})


async def ls_config(request: Request) -> Response:
    return Response(labelling_config(_service(request).skeleton.keypoint_names), media_type="application/xml")


async def ls_webhook(request: Request) -> Response:
    return JSONResponse({"status": "ok"})  # Label Studio's events: acknowledged, nothing to do with them


async def openapi(request: Request) -> Response:
    return JSONResponse(openapi_schema())


@dataclass(frozen=True)
class Endpoint:
    """A route and what the middleware does around it."""

    path: str
    method: str
    handler: Callable
    name: str  # its label in /metrics
    auth: bool = True  # needs the token (--token)
    counts_in_flight: bool = False  # holds a body and an image: counted against --max-in-flight


ENDPOINTS = (
    Endpoint("/", "GET", page, "page", auth=False),
    Endpoint("/v1/predict", "POST", predict, "predict", counts_in_flight=True),
    Endpoint("/v1/health", "GET", health, "health", auth=False),
    Endpoint("/v1/model", "GET", model_info, "model"),
    Endpoint("/metrics", "GET", metrics, "metrics"),
    Endpoint("/openapi.json", "GET", openapi, "openapi"),
    Endpoint("/v1/labelstudio-config", "GET", ls_config, "labelstudio_config"),
    Endpoint("/health", "GET", ls_health, "labelstudio_health", auth=False),
    Endpoint("/setup", "POST", ls_setup, "labelstudio_setup"),
    Endpoint("/predict", "POST", ls_predict, "labelstudio_predict", counts_in_flight=True),
    # Label Studio posts its events here without the backend's auth; open, as it reads nothing
    Endpoint("/webhook", "POST", ls_webhook, "labelstudio_webhook", auth=False),
)


# ----------------------------------------------------------------------------------------------
# The seams: errors and middleware


def error_response(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    """The one error answer: `{"error": one line}` (a 401 says how to authenticate)."""
    headers = {**({"WWW-Authenticate": 'Bearer realm="vitpose"'} if status == 401 else {}), **(headers or {})}
    return JSONResponse({"error": message.splitlines()[0] if message else "error"}, status_code=status,
                        headers=headers)


async def _user_error(request: Request, exc: UserError) -> Response:
    return error_response(exc.http_status, str(exc), getattr(exc, "headers", None))


async def _internal_error(request: Request, exc: Exception) -> Response:
    # Starlette's error middleware raises it on after this answer: uvicorn logs its traceback, once
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", exc.headers)


def token_matches(authorization: str, token: str) -> bool:
    """`Bearer TOKEN`, or Basic with TOKEN as the password (Label Studio's backend auth)."""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "basic":
        try:
            value = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")[2]
        except (binascii.Error, ValueError):
            value = ""
    elif scheme.lower() != "bearer":
        value = ""
    return bool(value) and hmac.compare_digest(value.strip().encode(), token.encode())


class _AroundEndpoints:
    """ASGI middleware around the requests of `ENDPOINTS` (others, a 404 or a 405, pass untouched)."""

    def __init__(self, app, service: Service):
        self.app = app
        self.service = service
        self.endpoints = {(e.method, e.path): e for e in ENDPOINTS}

    async def __call__(self, scope, receive, send) -> None:
        endpoint = None
        if scope["type"] == "http":
            method = "GET" if scope["method"] == "HEAD" else scope["method"]
            endpoint = self.endpoints.get((method, scope["path"]))
        if endpoint is None:
            await self.app(scope, receive, send)
        else:
            await self.around(endpoint, scope, receive, send)

    async def around(self, endpoint: Endpoint, scope, receive, send) -> None:
        raise NotImplementedError


class RequestMetrics(_AroundEndpoints):
    """Every answer timed and counted by endpoint and status (`Metrics.request`); an exception
    going out to the error handler is its 500."""

    async def around(self, endpoint, scope, receive, send) -> None:
        start, status = time.perf_counter(), 500

        async def send_status(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.service.metrics.request(endpoint.name, status, time.perf_counter() - start)


class InFlightLimit(_AroundEndpoints):
    """At most `--max-in-flight` requests of the endpoints that hold an image; beyond it 503 at once."""

    async def around(self, endpoint, scope, receive, send) -> None:
        if not endpoint.counts_in_flight:
            await self.app(scope, receive, send)
            return
        metrics, limit = self.service.metrics, self.service.settings.max_in_flight
        if metrics.in_flight >= limit:
            busy = error_response(503, f"busy: {limit} requests are being answered (--max-in-flight); try again",
                                  {"Retry-After": "1"})
            await busy(scope, receive, send)
            return
        metrics.started(+1)  # no await between the check and this: the event loop runs one at a time
        try:
            await self.app(scope, receive, send)
        finally:
            metrics.started(-1)


class TokenCheck(_AroundEndpoints):
    """With `--token`, 401 for a request without it (the page and the health checks are open)."""

    async def around(self, endpoint, scope, receive, send) -> None:
        token = self.service.settings.token
        if endpoint.auth and token is not None and not token_matches(Headers(scope=scope).get("authorization", ""),
                                                                     token):
            refused = error_response(401, "missing or wrong token: send 'Authorization: Bearer TOKEN' "
                                          "(vitpose serve --token)")
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)


def build_app(service: Service) -> Starlette:
    """The application of `service`: the routes of `ENDPOINTS`, the middleware (outermost first:
    metrics, in-flight limit, token) and the error handlers (see the module docstring)."""
    routes = [Route(e.path, e.handler, methods=[e.method]) for e in ENDPOINTS]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await run_in_threadpool(service.runner.close)  # after the requests in flight: their jobs are done

    middleware = [Middleware(ErrorLog), *(Middleware(cls, service=service)
                                          for cls in (RequestMetrics, InFlightLimit, TokenCheck))]
    handlers = {UserError: _user_error, HTTPException: _http_error, Exception: _internal_error}
    app = Starlette(routes=routes, middleware=middleware, exception_handlers=handlers, lifespan=lifespan)
    app.state.service = service
    return app
