"""The server's console: one line on stderr for every error it answers.

A client (Label Studio above all) often shows only "422 Client Error ... for url"; the line here
says which request it was and why: `vitpose serve: POST /predict 422: task 7: ...`. `ErrorLog` is
ASGI middleware around the whole application (the routes' errors, the middleware's own 401 and
503, and 404 / 405), reading the `{"error": ...}` answer it lets through; `error_line` prints one
line for what is answered without an error status (a task of Label Studio's `/predict` that gets
no prediction while the others do).
"""

from __future__ import annotations

import json
import sys

__all__ = ["ErrorLog", "error_line"]

_MAX_BODY = 64 * 1024  # an error answer is one line of JSON; more is not read for the console


def error_line(method: str, path: str, status: int, message: str) -> None:
    first = (message.splitlines() or [""])[0]
    print(f"vitpose serve: {method} {path} {status}: {first}", file=sys.stderr, flush=True)


class ErrorLog:
    """ASGI middleware: every answer with a status >= 400 is one console line (`error_line`)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status, body = 0, bytearray()

        async def watch(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status >= 400:
                if len(body) < _MAX_BODY:
                    body.extend(message.get("body", b"")[:_MAX_BODY])
                if not message.get("more_body", False):
                    error_line(scope["method"], scope["path"], status, _message(bytes(body)))
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as e:  # a bug: answered 500 by Starlette's outermost error middleware
            if status == 0:
                error_line(scope["method"], scope["path"], 500, f"internal error: {type(e).__name__}: {e}")
            raise


def _message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", "replace").strip() or "(no body)"
