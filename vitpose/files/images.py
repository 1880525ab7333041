"""Images through numpy buffers, and the one reader of an image file.

- `read_image` / `write_image`: images are read with `np.fromfile` + `cv2.imdecode` and written with
  `cv2.imencode` + an atomic write, never through OpenCV's path functions, so any file name the OS
  allows (bytes that are not UTF-8 included: pass `bytes`, or the `str` that `os.fsdecode` makes
  of them) works; OpenCV's `imread`/`imwrite` crash or fail on such names.
- One reader: `read_image_file(path, reduce, max_pixels)` (the file's bytes, then `decode_bytes`) is
  the only place where this project reads and decodes an image file, and `decode_bytes` the only
  `cv2.imdecode` of an encoded image: `read_image` here and the data layer's `load_image` /
  `decode_image` (`vitpose.data.image_io`, which names the record and the field too) are thin
  wrappers of it. Every unreadable image is an `ImageReadError` (one line naming the file): missing,
  unreadable, empty, cut short (a JPEG without its end-of-image marker, a PNG without its IEND
  chunk: OpenCV would decode them "successfully" as partly grey images with only a warning on
  stderr) or not decodable.
- Decoding is `cv2.IMREAD_COLOR` (MMPose's `color_type='color'`): grey files replicated to three
  channels, alpha dropped, CMYK JPEGs converted, EXIF orientation applied; always uint8 BGR
  (H, W, 3). Reduced decoding (`reduce` = 2, 4 or 8) uses libjpeg's DCT scaling through
  `cv2.IMREAD_REDUCED_COLOR_{2,4,8}`, for JPEGs only (other formats are decoded at full size).
- Pixel limit: before decoding, the image's size is read from its header (PNG's IHDR, JPEG's SOF
  marker; Pillow's lazy header reading for other formats) and an image over the limit is refused
  (`ImageTooLargeError`, one line with the size, the limit and how to raise it). The limit is
  `DEFAULT_MAX_PIXELS` (150 megapixels: 450 MB as BGR uint8, more than any common camera's sensor),
  overridden per call with `max_pixels=` or for a whole run with the environment variable
  `VITPOSE_MAX_PIXELS` (0 = no limit). A 570 KB PNG can otherwise decode to 30000x20000 pixels
  and take gigabytes.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

from vitpose.errors import UserError

from .atomic import write_atomic
from .paths import as_path

DEFAULT_MAX_PIXELS = 150_000_000
MAX_PIXELS_ENV = "VITPOSE_MAX_PIXELS"
REDUCTIONS = (1, 2, 4, 8)  # the `reduce` factors libjpeg decodes at directly
_JPEG_SOI = b"\xff\xd8"
_JPEG_EOI = b"\xff\xd9"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_IEND = b"IEND\xaeB`\x82"
# Bytes some writers leave after the end marker; anything else there means a damaged file.
_TRAILING_PADDING = b"\x00\r\n\t "


class ImageReadError(UserError):
    """An image file is missing, unreadable, cut short or not an image (one line naming the file).

    The base of every unreadable image: the data layer's image errors (`vitpose.data.errors.ImageDataError`)
    are ImageReadErrors too. `reason` is the message without the file's name."""

    def __init__(self, message: str, *, reason: str | None = None):
        super().__init__(message)
        self.reason = message if reason is None else reason

    @classmethod
    def of(cls, path, reason: str) -> ImageReadError:
        """'PATH: reason'."""
        return cls(f"{as_path(path)}: {reason}", reason=reason)


class ImageTooLargeError(ImageReadError):
    """An image's header says it is larger than the pixel limit; it was not decoded."""


def read_bytes(path) -> np.ndarray:
    """The file's bytes as a uint8 array (what cv2.imdecode takes). Raises OSError as open() does."""
    with open(as_path(path), "rb") as f:
        return np.fromfile(f, dtype=np.uint8)


_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # frame headers (DHT, JPG, DAC are not)
_JPEG_STANDALONE = frozenset(range(0xD0, 0xDA)) | {0x01}  # RSTn, SOI, EOI, TEM: no length field


def _jpeg_size(data: memoryview) -> tuple[int, int] | None:
    i = 2
    while i + 9 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _JPEG_STANDALONE:
            i += 2
            continue
        if marker in _JPEG_SOF:
            height = int.from_bytes(data[i + 5:i + 7], "big")
            width = int.from_bytes(data[i + 7:i + 9], "big")
            return (width, height) if height else None  # height 0: defined later by a DNL marker
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return None


def _pillow_size(buf: np.ndarray, max_pixels: int) -> tuple[int, int] | None:
    import io

    from PIL import Image  # lazily: only formats other than PNG and JPEG need it

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(memoryview(buf))) as img:
                return tuple(int(v) for v in img.size)
    except Image.DecompressionBombError:
        # Pillow refuses headers over its own limit (2 x Image.MAX_IMAGE_PIXELS) without saying the size
        bomb = 2 * int(Image.MAX_IMAGE_PIXELS or 0)
        return (bomb + 1, 1) if 0 < max_pixels <= bomb else None
    except Exception:  # not a format Pillow knows: OpenCV may still decode it
        return None


def image_header_size(buf: np.ndarray, max_pixels: int = 0) -> tuple[int, int] | None:
    """(width, height) from an encoded image's header without decoding it; None if unknown."""
    data = memoryview(buf).cast("B")
    head = bytes(data[:24])
    if head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR":
        return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    if head[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    return _pillow_size(buf, max_pixels)


def max_pixels_limit(max_pixels: int | None = None) -> int:
    """The pixel limit in force: `max_pixels` if given, else $VITPOSE_MAX_PIXELS, else the default
    (0 = no limit)."""
    if max_pixels is not None:
        return int(max_pixels)
    value = os.environ.get(MAX_PIXELS_ENV, "").strip()
    if not value:
        return DEFAULT_MAX_PIXELS
    try:
        return int(float(value))
    except ValueError:
        raise UserError(f"{MAX_PIXELS_ENV}={value!r} is not a number of pixels (e.g. 300000000; 0 = no limit)") from None


def check_pixel_limit(buf: np.ndarray, path, max_pixels: int | None = None) -> None:
    """Raise ImageTooLargeError when the header of the encoded image `buf` says it is over the limit."""
    limit = max_pixels_limit(max_pixels)
    if limit <= 0:
        return
    size = image_header_size(buf, limit)
    if size is None or size[0] * size[1] <= limit:
        return
    width, height = size
    raise ImageTooLargeError.of(
        path, f"the image is {width}x{height} ({width * height / 1e6:.0f} megapixels, "
        f"{width * height * 3 / 2**30:.1f} GiB decoded), over the limit of {limit / 1e6:g} megapixels; "
        f"not decoded. To read it, raise the limit: {MAX_PIXELS_ENV}={width * height} (0 = no limit) "
        f"or max_pixels= in Python")


def is_jpeg(buf: np.ndarray) -> bool:
    return buf.size >= 2 and bytes(buf[:2]) == _JPEG_SOI


def check_complete(buf: np.ndarray, path) -> None:
    """Raise ImageReadError when a JPEG or PNG byte stream is cut short (a truncated download)."""
    head = bytes(buf[:8])
    tail = bytes(buf[-4096:]).rstrip(_TRAILING_PADDING)
    if head[:2] == _JPEG_SOI and not tail.endswith(_JPEG_EOI):
        raise ImageReadError.of(path, "JPEG is truncated or corrupt: no end-of-image marker (FF D9)")
    if head == _PNG_SIGNATURE and not tail.endswith(_PNG_IEND):
        raise ImageReadError.of(path, "PNG is truncated or corrupt: no IEND chunk at the end")


def decode_bytes(buf: np.ndarray, path="<bytes>", reduce: int = 1,
                 max_pixels: int | None = None) -> tuple[np.ndarray, int]:
    """Decode an encoded image to uint8 BGR (H, W, 3), at 1/`reduce` resolution for a JPEG; returns
    (image, the reduction used: 1 for other formats). Checked first: complete (`check_complete`),
    within the pixel limit (`check_pixel_limit`). `path` names the image in messages."""
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {list(REDUCTIONS)}, got {reduce}")
    if buf.size == 0:
        raise ImageReadError.of(path, "image is empty")
    check_complete(buf, path)
    check_pixel_limit(buf, path, max_pixels)
    import cv2

    if reduce > 1 and not is_jpeg(buf):
        reduce = 1
    flags = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
             8: cv2.IMREAD_REDUCED_COLOR_8}
    try:
        image = cv2.imdecode(buf, flags[reduce])
    except cv2.error:  # OpenCV asserts on some malformed buffers instead of returning None
        image = None
    if image is None:
        raise ImageReadError.of(path, "image could not be decoded (corrupt or unsupported format)")
    return image, reduce


def read_encoded(path) -> np.ndarray:
    """An image file's bytes, refused when missing, unreadable or empty (ImageReadError)."""
    try:
        buf = read_bytes(path)
    except FileNotFoundError:
        raise ImageReadError.of(path, "image file not found") from None
    except OSError as e:
        raise ImageReadError.of(path, f"image file unreadable ({e.strerror or e})") from None
    if buf.size == 0:
        raise ImageReadError.of(path, "image file is empty")
    return buf


def read_image_file(path, reduce: int = 1, max_pixels: int | None = None) -> tuple[np.ndarray, int]:
    """The one reader of an image file: (uint8 BGR (H, W, 3), the reduction used) (`decode_bytes`)."""
    return decode_bytes(read_encoded(path), path, reduce, max_pixels)


def read_image(path, max_pixels: int | None = None):
    """Read an image file as uint8 BGR (H, W, 3) (cv2.IMREAD_COLOR: grey replicated, alpha dropped,
    EXIF orientation applied), refusing one over the pixel limit before decoding.

    Raises ImageReadError (missing, unreadable, cut short, not an image) or ImageTooLargeError, one line each.
    """
    return read_image_file(path, max_pixels=max_pixels)[0]


def write_image(path, image, params=()) -> Path:
    """Encode `image` (BGR or grey uint8) in the format of `path`'s suffix and write it atomically.

    Raises ValueError when OpenCV has no encoder for the suffix or the encoding fails.
    """
    import cv2

    path = as_path(path)
    suffix = path.suffix.lower()
    try:
        ok, encoded = cv2.imencode(suffix, image, list(params))
    except cv2.error:
        ok = False
    if not ok:
        raise ValueError(f"{path}: cannot encode an image as {suffix!r} (use .jpg or .png)")
    write_atomic(path, encoded.tobytes())
    return path
