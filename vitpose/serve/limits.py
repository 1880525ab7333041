"""What keeps slow and greedy clients of `vitpose serve` from starving the others.

- `read_body(request, limit, timeout)`: the body, refused (413) as soon as it is known to be over
  `--max-body-mb`, and given up (408, the connection closed) when no byte of it arrived for
  `--body-timeout` seconds: a client that sends headers and part of a body and stalls frees its
  `--max-in-flight` slot after that long. One that trickles (a byte now and then) is given up
  once it is past `--body-timeout` plus a second per `MIN_BODY_RATE` bytes it sent.
- `PixelBudget(limit, wait)`: the pixels of the images decoded or being decoded at once
  (`--max-pixels-in-flight`), counted from each image's header before it is decoded. A request
  that would go over it waits up to `wait` seconds for others to finish, then gets 503 with
  `Retry-After`: decoding memory is bounded by the budget (about 6 bytes a pixel: the decoded BGR
  image and the pipeline's RGB copy), not by the number of requests. A request holds its pixels
  until its poses are computed; the batch thread lets go of a job's image when the job is done.
- `client_gone(receive)`: returns when the client of a request whose body was read has closed
  its connection (its poses are then not computed).

Each refusal is a `RequestError` (one line naming the flag) that may carry headers for its answer
(`LimitError.headers`: `Retry-After`, `Connection: close`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np

from vitpose.files import image_header_size, max_pixels_limit
from vitpose.serve.labelstudio import RequestError

__all__ = ["MIN_BODY_RATE", "LimitError", "PixelBudget", "client_gone", "default_pixel_budget", "header_pixels", "read_body"]


MIN_BODY_RATE = 16 * 1024  # bytes a second a body must average after its first --body-timeout seconds


class LimitError(RequestError):
    """A refusal by one of the server's limits, with headers for its answer."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(status, message)
        self.headers = dict(headers or {})


async def read_body(request, limit: int, timeout: float | None = None) -> bytes:
    """The body, refused (413) as soon as it is known to exceed `limit` bytes, and 408 (the
    connection closed) when `timeout` seconds pass without a byte of it (None: no timeout)."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.strip().isdigit():
            raise RequestError(400, f"Content-Length {length!r} is not a number of bytes")
        if int(length) > limit:
            raise RequestError(413, f"the body is {int(length)} bytes, over the limit of {limit} (--max-body-mb)")
    chunks, size, more = [], 0, True
    start = time.monotonic()
    while more:
        # no byte for `timeout` seconds, or past `timeout` plus a second per MIN_BODY_RATE bytes received
        left = None if timeout is None else min(timeout, start + timeout + size / MIN_BODY_RATE - time.monotonic())
        try:
            if left is not None and left <= 0:
                raise asyncio.TimeoutError
            message = await asyncio.wait_for(request.receive(), left)
        except asyncio.TimeoutError:
            raise LimitError(408, f"the body did not arrive in time: {size} bytes in {time.monotonic() - start:.0f} s "
                                  f"(--body-timeout {timeout:g} s, then at least {MIN_BODY_RATE // 1024} KB/s)",
                             {"Connection": "close"}) from None
        if message["type"] == "http.disconnect":
            raise RequestError(400, "the client closed the connection before its body arrived")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise LimitError(413, f"the body is over the limit of {limit} bytes (--max-body-mb)",
                             {"Connection": "close"})
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def default_pixel_budget(max_pixels: int | None) -> int:
    """`--max-pixels-in-flight`'s default: twice the pixel limit in force (300 megapixels for the
    default limit; twice the default limit when there is none)."""
    from vitpose.files import DEFAULT_MAX_PIXELS

    limit = max_pixels_limit(max_pixels)
    return 2 * (limit if limit > 0 else DEFAULT_MAX_PIXELS)


def header_pixels(data: bytes, max_pixels: int | None) -> int | None:
    """The pixels an encoded image's header says it has; None when the header does not say."""
    if not data:
        return 0
    size = image_header_size(np.frombuffer(data, np.uint8), max_pixels_limit(max_pixels))
    return None if size is None else size[0] * size[1]


class PixelBudget:
    """At most `limit` pixels of images held at once (0: no limit); see the module docstring.
    Used from the event loop only."""

    def __init__(self, limit: int, wait: float):
        self.limit = int(limit)
        self.wait = float(wait)
        self.in_use = 0
        self._changed: asyncio.Condition | None = None

    @contextlib.asynccontextmanager
    async def hold(self, pixels: int | None):
        """Hold `pixels` (None, a header that does not say: the whole budget) while the block runs."""
        if self.limit <= 0:
            yield
            return
        pixels = self.limit if pixels is None else int(pixels)
        if pixels > self.limit:
            raise RequestError(413, f"the image is {pixels / 1e6:.0f} megapixels, over the {self.limit / 1e6:g} "
                                    f"megapixels decoded at once (--max-pixels-in-flight)")
        if self._changed is None:
            self._changed = asyncio.Condition()
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.in_use + pixels <= self.limit), self.wait)
            except asyncio.TimeoutError:
                raise LimitError(503, f"busy: {self.in_use / 1e6:.0f} megapixels are being decoded or answered "
                                      f"(--max-pixels-in-flight {self.limit}); try again",
                                 {"Retry-After": str(max(1, round(self.wait)))}) from None
            self.in_use += pixels
        try:
            yield
        finally:
            async with self._changed:
                self.in_use -= pixels
                self._changed.notify_all()


async def client_gone(receive) -> None:
    """Returns when the client closes its connection (call it only once the body was read: the
    server's next message is then the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass
