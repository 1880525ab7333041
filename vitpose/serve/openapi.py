"""The OpenAPI 3.0 description of `vitpose serve`'s routes, written by hand (`openapi_schema()`,
served at `/openapi.json`). tests/test_serve_security.py keeps it equal to the application's
routes: every route has its path and method here, and nothing else is here.
"""

from __future__ import annotations

__all__ = ["OPEN", "openapi_schema"]

OPEN: list = []  # `security` of an operation that needs no token

_ERROR = {"description": "an error: one line", "content": {"application/json": {"schema": {
    "type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}}}}
_JSON = {"description": "JSON", "content": {"application/json": {"schema": {"type": "object"}}}}
_IMAGE_OPTIONS = [
    {"name": "boxes", "in": "query", "schema": {"type": "string"},
     "description": "JSON [[x1, y1, x2, y2(, score)], ...]; [] for nobody; default: the server's detector"},
    {"name": "box_format", "in": "query", "schema": {"type": "string", "enum": ["xyxy", "xywh"]}},
    {"name": "format", "in": "query", "schema": {"type": "string", "enum": ["coco", "labelstudio", "cvat"]}},
    {"name": "file_name", "in": "query", "schema": {"type": "string"}},
    {"name": "mark_below", "in": "query", "schema": {"type": "number", "minimum": 0, "maximum": 1}},
    {"name": "mark_below_by", "in": "query", "schema": {"type": "string", "enum": ["auto", "score", "p"]},
     "description": "what mark_below compares: p where the model is calibrated (auto), or score, or p"},
]
_FORM = {"type": "object", "required": ["image"], "properties": {
    "image": {"type": "string", "format": "binary"}, "boxes": {"type": "string"}, "box_format": {"type": "string"},
    "format": {"type": "string"}, "file_name": {"type": "string"}, "mark_below": {"type": "string"},
    "mark_below_by": {"type": "string"}}}


def _operation(summary: str, ok: dict, *, body: dict | None = None, parameters=(), open_: bool = False) -> dict:
    operation = {"summary": summary, "responses": {"200": ok, "4XX": _ERROR, "5XX": _ERROR}}
    if body is not None:
        operation["requestBody"] = {"required": True, "content": body}
    if parameters:
        operation["parameters"] = list(parameters)
    if open_:
        operation["security"] = OPEN
    return operation


def _json_body(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def openapi_schema() -> dict:
    """The schema: one operation per route of `vitpose.serve.app.ENDPOINTS`."""
    text = {"description": "text", "content": {"text/plain": {"schema": {"type": "string"}}}}
    tasks = {"type": "object", "required": ["tasks"], "properties": {
        "tasks": {"type": "array", "items": {"type": "object"}}, "label_config": {"type": "string"},
        "project": {"type": "string"}, "params": {"type": "object"}}}
    setup = {"type": "object", "properties": {"schema": {"type": "string"}, "hostname": {"type": "string"},
                                              "access_token": {"type": "string"}, "project": {"type": "string"}}}
    paths = {
        "/": {"get": _operation("the page", {"description": "HTML", "content": {"text/html": {}}}, open_=True)},
        "/v1/predict": {"post": _operation(
            "poses of one image (raw body or the form field 'image')", _JSON, parameters=_IMAGE_OPTIONS,
            body={"application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                  "multipart/form-data": {"schema": _FORM}})},
        "/v1/health": {"get": _operation("liveness and requests in flight", _JSON, open_=True)},
        "/v1/model": {"get": _operation(
            "the model's spec, calibration (whether records carry p and visibility), skeleton and the server's settings",
            _JSON)},
        "/v1/labelstudio-config": {"get": _operation(
            "the Label Studio labelling config of the model's keypoints",
            {"description": "XML", "content": {"application/xml": {"schema": {"type": "string"}}}})},
        "/metrics": {"get": _operation("Prometheus metrics", text)},
        "/openapi.json": {"get": _operation("this schema", _JSON)},
        "/health": {"get": _operation("Label Studio: health", _JSON, open_=True)},
        "/setup": {"post": _operation("Label Studio: connect a project", _JSON, body=_json_body(setup))},
        "/predict": {"post": _operation("Label Studio: predictions of tasks", _JSON, body=_json_body(tasks))},
        "/webhook": {"post": _operation("Label Studio: its events (acknowledged, not used)", _JSON, open_=True)},
    }
    return {"openapi": "3.0.3",
            "info": {"title": "vitpose serve", "version": "1",
                     "description": "Poses over HTTP; with --token every operation without `security: []` needs "
                                    "'Authorization: Bearer TOKEN' (or Basic with the token as password)."},
            "paths": paths,
            "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                               "basic": {"type": "http", "scheme": "basic"}}},
            "security": [{"bearer": []}, {"basic": []}]}
