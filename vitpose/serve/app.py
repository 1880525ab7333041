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
  `GET /metrics` (Prometheus text: `vitpose.serve.batching.Metrics`), `GET /` (the page).
- Label Studio's ML backend: `POST /setup`, `POST /predict`, `GET /health`
  (`vitpose.serve.labelstudio`).

Limits: the body (`--max-body-mb`, checked on Content-Length and while reading), the pixel limit
(`vitpose.files`, read from the image's header before decoding), a per-request timeout, the
requests answered at once (`--max-in-flight`, beyond it 503: the memory they hold is bounded). With
`--token`, every endpoint but `/`, `/v1/health` and `/health` needs `Authorization: Bearer TOKEN`
(or HTTP Basic with the token as password: what Label Studio sends to a backend).
Images are decoded as `vitpose predict` decodes files (`vitpose.data.image_io.decode_image`: BGR,
truncation and pixel checks), so the server's records for an image equal the command's.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import hmac
import json
import math
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers, UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from vitpose.data.errors import DataError
from vitpose.data.image_io import decode_image
from vitpose.files import ImageTooLargeError, check_pixel_limit
from vitpose.inference.pipeline import caller_boxes, image_ids
from vitpose.inference.records import FORMATS, image_records, labelstudio_tasks, render_records
from vitpose.serve.batching import BatchRunner, Metrics
from vitpose.serve.labelstudio import MODEL_VERSION, RequestError, TaskImages, labelling_names

__all__ = ["Service", "Settings", "build_app"]


@dataclass
class Settings:
    """What `vitpose serve`'s flags set (see `vitpose.cli.serve`)."""

    model_name: str
    max_body: int = 20 * 2**20
    max_pixels: int | None = None  # None: $VITPOSE_MAX_PIXELS or vitpose.files' default
    timeout: float = 60.0
    token: str | None = None
    mark_below: float = 0.3
    max_in_flight: int = 64  # requests being answered at once (each holds a body and a decoded image)
    details: dict = field(default_factory=dict)  # device, precision, flip test, ... for /v1/model


class Service:
    """The loaded model, its batch thread, the metrics and the settings: what the endpoints share."""

    def __init__(self, predictor, spec, settings: Settings, runner: BatchRunner, metrics: Metrics,
                 task_images: TaskImages):
        self.predictor = predictor
        self.skeleton = predictor.skeleton
        self.spec = spec
        self.settings = settings
        self.runner = runner
        self.metrics = metrics
        self.task_images = task_images

    async def poses(self, image: np.ndarray, boxes):
        """The image's `Poses`, computed in a batch with other requests' images."""
        if boxes is None and self.predictor.detector is None:
            raise RequestError(400, "this server has no person detector (--detector none): send boxes")
        future = self.runner.submit(image, boxes)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.settings.timeout)
        except asyncio.TimeoutError:
            future.cancel()
            raise RequestError(504, f"no answer within the request timeout of {self.settings.timeout:g} s "
                                    f"(--timeout); the server is busy") from None
        except (ValueError, DataError) as e:  # the pipeline's refusal of this image's boxes
            raise RequestError(422, str(e)) from None


# ----------------------------------------------------------------------------------------------
# Request parts


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to exceed `limit` bytes."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.strip().isdigit():
            raise RequestError(400, f"Content-Length {length!r} is not a number of bytes")
        if int(length) > limit:
            raise RequestError(413, f"the body is {int(length)} bytes, over the limit of {limit} (--max-body-mb)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"the body is over the limit of {limit} bytes (--max-body-mb)")
        chunks.append(chunk)
    return b"".join(chunks)


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


def parse_boxes(text, box_format: str):
    """`boxes` (JSON text) -> (M, 5) float32 xyxy + score, or None; RequestError names the problem."""
    if text is None:
        return None
    if box_format not in ("xyxy", "xywh"):
        raise RequestError(400, f"box_format must be 'xyxy' or 'xywh', got {box_format!r}")
    try:
        rows = json.loads(text)
    except ValueError:
        raise RequestError(400, f"boxes must be JSON, e.g. [[x1, y1, x2, y2], ...]; got {str(text)[:80]!r}") from None
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
    return np.concatenate([found.boxes, found.scores[:, None]], axis=1)


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


def endpoint(name: str, auth: bool = True, counts_in_flight: bool = False):
    """Timing, metrics, the token check and the one error shape around a handler."""

    def wrap(handler):
        @functools.wraps(handler)
        async def run(request: Request):
            service: Service = request.app.state.service
            start = time.perf_counter()
            if counts_in_flight and service.metrics.in_flight >= service.settings.max_in_flight:
                response = error_response(503, f"busy: {service.settings.max_in_flight} requests are being answered "
                                               f"(--max-in-flight); try again")
                service.metrics.request(name, response.status_code, time.perf_counter() - start)
                return response
            if counts_in_flight:  # no await between the check and this: the event loop runs one at a time
                service.metrics.started(+1)
            try:
                if auth:
                    check_token(request, service.settings.token)
                response = await handler(request, service)
            except RequestError as e:
                response = error_response(e.status, str(e))
            except Exception as e:  # noqa: BLE001 - the server keeps serving; the client gets one line
                response = error_response(500, f"internal error: {type(e).__name__}: {e}")
            finally:
                if counts_in_flight:
                    service.metrics.started(-1)
            service.metrics.request(name, response.status_code, time.perf_counter() - start)
            return response

        return run

    return wrap


def error_response(status: int, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": 'Bearer realm="vitpose"'} if status == 401 else None
    return JSONResponse({"error": message.splitlines()[0] if message else "error"}, status_code=status,
                        headers=headers)


def check_token(request: Request, token: str | None) -> None:
    """`Authorization: Bearer TOKEN`, or Basic with TOKEN as the password (Label Studio's backend auth)."""
    if token is None:
        return
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() == "basic":
        try:
            value = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")[2]
        except (binascii.Error, ValueError):
            value = ""
    elif scheme.lower() != "bearer":
        value = ""
    if not value or not hmac.compare_digest(value.strip().encode(), token.encode()):
        raise RequestError(401, "missing or wrong token: send 'Authorization: Bearer TOKEN' (vitpose serve --token)")


@endpoint("predict", counts_in_flight=True)
async def predict(request: Request, service: Service) -> Response:
    start = time.perf_counter()
    body = await read_body(request, service.settings.max_body)
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
    mark_below = _option(fields, query, "mark_below", service.settings.mark_below)
    try:
        mark_below = float(mark_below)
    except ValueError:
        raise RequestError(400, f"mark_below must be a number, got {mark_below!r}") from None
    boxes = parse_boxes(_option(fields, query, "boxes"), _option(fields, query, "box_format", "xyxy"))
    name = _file_name(_option(fields, query, "file_name", upload_name))
    image = await run_in_threadpool(decode, body, name, service.settings.max_pixels)
    poses = await service.poses(image, boxes)
    image_id = image_ids([name])[0][0]
    records, nonfinite = image_records(poses, name, image_id, image.shape[:2] if fmt != "coco" else None)
    if fmt == "labelstudio":
        return Response(render_records(records, fmt, service.skeleton, mark_below), media_type="application/json")
    if fmt == "cvat":
        return Response(render_records(records, fmt, service.skeleton, mark_below), media_type="application/xml")
    return JSONResponse({"records": records, "file_name": name, "image_id": image_id, "width": image.shape[1],
                         "height": image.shape[0], "nonfinite": nonfinite, "model": service.settings.model_name,
                         "seconds": round(time.perf_counter() - start, 6)})


@endpoint("health", auth=False)
async def health(request: Request, service: Service) -> Response:
    return JSONResponse({"status": "ok", "model": service.settings.model_name,
                         "in_flight": service.metrics.in_flight})


@endpoint("model")
async def model_info(request: Request, service: Service) -> Response:
    skeleton = service.skeleton
    return JSONResponse({
        "model": service.settings.model_name,
        "spec": service.spec.to_dict() if service.spec is not None else None,
        "skeleton": {"name": skeleton.name, "keypoint_names": list(skeleton.keypoint_names),
                     "limbs": [list(pair) for pair in skeleton.skeleton],
                     "keypoint_colors": [list(c) for c in skeleton.keypoint_colors],
                     "link_colors": [list(c) for c in skeleton.link_colors]},
        "settings": {"max_batch": service.runner.max_batch, "max_wait_ms": 1000 * service.runner.max_wait,
                     "max_body_bytes": service.settings.max_body, "timeout_s": service.settings.timeout,
                     "mark_below": service.settings.mark_below, **service.settings.details},
    })


@endpoint("metrics")
async def metrics(request: Request, service: Service) -> Response:
    return PlainTextResponse(service.metrics.render(), media_type="text/plain; version=0.0.4")


@endpoint("page", auth=False)
async def page(request: Request, service: Service) -> Response:
    return HTMLResponse(resources.files("vitpose.serve").joinpath("page/index.html").read_text(encoding="utf-8"))


# --- Label Studio's ML backend ----------------------------------------------------------------


async def _json_body(request: Request, service: Service) -> dict:
    body = await read_body(request, service.settings.max_body)
    try:
        data = json.loads(body or b"null")
    except ValueError:
        raise RequestError(400, "the body must be JSON") from None
    if not isinstance(data, dict):
        raise RequestError(400, f"the body must be a JSON object, got {type(data).__name__}")
    return data


@endpoint("labelstudio_health", auth=False)
async def ls_health(request: Request, service: Service) -> Response:
    return JSONResponse({"status": "UP", "model_class": "vitpose", "model": service.settings.model_name})


@endpoint("labelstudio_setup")
async def ls_setup(request: Request, service: Service) -> Response:
    data = await _json_body(request, service)
    labelling_names(data.get("schema"), service.skeleton.keypoint_names)  # a config it cannot answer: now
    service.task_images.set_up(data.get("hostname"), data.get("access_token"))
    return JSONResponse({"model_version": MODEL_VERSION})


@endpoint("labelstudio_predict", counts_in_flight=True)
async def ls_predict(request: Request, service: Service) -> Response:
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
            image = await run_in_threadpool(decode, raw, name, settings.max_pixels)
        except RequestError as e:
            raise RequestError(e.status, f"{where}: {e}") from None
        poses = await service.poses(image, None)
        records, _ = image_records(poses, name, image_ids([name])[0][0], image.shape[:2])
        answer = labelstudio_tasks(records, service.skeleton, settings.mark_below, **names.writer_names())
        return answer[0]["predictions"][0] if answer else {"model_version": MODEL_VERSION, "score": 0.0, "result": []}

    results = await asyncio.gather(*(one(t, task) for t, task in enumerate(tasks)))
    return JSONResponse({"results": list(results), "model_version": MODEL_VERSION})


async def _not_found(request: Request, exc: HTTPException) -> Response:
    return error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")


def build_app(service: Service) -> Starlette:
    routes = [
        Route("/", page, methods=["GET"]),
        Route("/v1/predict", predict, methods=["POST"]),
        Route("/v1/health", health, methods=["GET"]),
        Route("/v1/model", model_info, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/health", ls_health, methods=["GET"]),
        Route("/setup", ls_setup, methods=["POST"]),
        Route("/predict", ls_predict, methods=["POST"]),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await run_in_threadpool(service.runner.close)  # after the requests in flight: their jobs are done

    app = Starlette(routes=routes, exception_handlers={HTTPException: _not_found}, lifespan=lifespan)
    app.state.service = service
    return app
