"""Image decoding with OpenCV, with checks that turn bad files into DataError.

Policy (what MMPose's `LoadImage` does, made explicit):
- Images are decoded with `cv2.IMREAD_COLOR`, the flag behind MMPose's `color_type='color'`:
  grayscale files are replicated to three equal channels, 4-channel (alpha) files lose the
  alpha channel, CMYK JPEGs are converted. The result is always uint8 BGR (H, W, 3).
- The decoded size must equal the `width`/`height` of the image record, because boxes and
  keypoints are in that frame; a mismatch (wrong record, EXIF-rotated file) raises.
- A JPEG must start with SOI (FF D8) and end with EOI (FF D9), allowing trailing padding.
  OpenCV decodes a truncated JPEG "successfully" as a partly grey image with only a stderr
  warning, so the markers are checked here; the same goes for PNG's IEND chunk.

Reduced decoding (`reduce` = 2, 4 or 8) uses libjpeg's DCT scaling through
`cv2.IMREAD_REDUCED_COLOR_{2,4,8}`: each reduced pixel i averages full-resolution pixels
[f*i, f*i + f), so its centre sits at full-resolution x = f*i + (f-1)/2 (which
`transforms.source_matrix` folds into the warp). Only JPEGs are reduced; other formats are decoded at full size
(OpenCV resizes those with a different pixel-centre rule).

Files are read through `vitpose.files` (numpy buffers: any file name the OS allows), and an image
whose header says it is over the pixel limit (`vitpose.files.DEFAULT_MAX_PIXELS`, or
$VITPOSE_MAX_PIXELS) is refused with a DataError before it is decoded.
"""

import cv2
import numpy as np

from vitpose.files import ImageTooLargeError, check_pixel_limit
from vitpose.files import read_bytes as read_file_bytes

from .errors import DataError

_REDUCED_FLAGS = {
    1: cv2.IMREAD_COLOR,
    2: cv2.IMREAD_REDUCED_COLOR_2,
    4: cv2.IMREAD_REDUCED_COLOR_4,
    8: cv2.IMREAD_REDUCED_COLOR_8,
}
_JPEG_SOI = b"\xff\xd8"
_JPEG_EOI = b"\xff\xd9"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_IEND = b"IEND\xaeB`\x82"
# Bytes some writers leave after the end marker; anything else there means a damaged file.
_TRAILING_PADDING = b"\x00\r\n\t "


def read_bytes(path, record=None) -> np.ndarray:
    """The file's bytes as a uint8 array (what cv2.imdecode takes); any file name the OS allows."""
    try:
        buf = read_file_bytes(path)
    except FileNotFoundError:
        raise DataError("image file not found", file=path, record=record, field="file_name") from None
    except OSError as e:
        raise DataError(f"image file unreadable: {e}", file=path, record=record, field="file_name") from None
    if buf.size == 0:
        raise DataError("image file is empty", file=path, record=record, field="file_name")
    return buf


def is_jpeg(buf: np.ndarray) -> bool:
    return buf.size >= 2 and bytes(buf[:2]) == _JPEG_SOI


def check_complete(buf: np.ndarray, path, record=None) -> None:
    """Raise DataError when a JPEG or PNG byte stream is cut short (truncated download)."""
    head = bytes(buf[:8])
    tail = bytes(buf[-4096:]).rstrip(_TRAILING_PADDING)
    if head[:2] == _JPEG_SOI:
        if not tail.endswith(_JPEG_EOI):
            raise DataError("JPEG is truncated or corrupt: no end-of-image marker (FF D9)",
                            file=path, record=record, field="file_name")
    elif head == _PNG_SIGNATURE:
        if not tail.endswith(_PNG_IEND):
            raise DataError("PNG is truncated or corrupt: no IEND chunk at the end",
                            file=path, record=record, field="file_name")


def decode_image(buf: np.ndarray, path="<bytes>", record=None, reduce: int = 1,
                 expected_size=None, max_pixels: int | None = None) -> np.ndarray:
    """Decode bytes to uint8 BGR (H, W, 3), optionally at 1/`reduce` resolution (JPEG only).

    expected_size: (width, height) of the full-resolution image from its record; the decoded
    size is checked against it (ceil(W / reduce) for reduced JPEG decoding).
    max_pixels: the pixel limit checked on the header before decoding (`vitpose.files`; None:
    $VITPOSE_MAX_PIXELS or `files.DEFAULT_MAX_PIXELS`).
    """
    check_complete(buf, path, record)
    try:
        check_pixel_limit(buf, path, max_pixels)
    except ImageTooLargeError as e:
        raise DataError(str(e), record=record) from None  # the message names the file
    if reduce not in _REDUCED_FLAGS:
        raise ValueError(f"reduce must be one of {sorted(_REDUCED_FLAGS)}, got {reduce}")
    if reduce > 1 and not is_jpeg(buf):
        reduce = 1
    img = cv2.imdecode(buf, _REDUCED_FLAGS[reduce])
    if img is None:
        raise DataError("image could not be decoded (corrupt or unsupported format)",
                        file=path, record=record, field="file_name")
    if expected_size is not None:
        w, h = int(expected_size[0]), int(expected_size[1])
        want = (-(-h // reduce), -(-w // reduce))  # libjpeg rounds reduced sizes up
        if img.shape[:2] != want:
            got = (img.shape[1] * reduce, img.shape[0] * reduce) if reduce > 1 else img.shape[1::-1]
            raise DataError(f"decoded image is {got[0]}x{got[1]} but its record says {w}x{h}",
                            file=path, record=record, field="width/height")
    return img


def load_image(path, record=None, reduce: int = 1, expected_size=None, max_pixels: int | None = None):
    """Read and decode one image file; returns (image BGR uint8, the reduction actually used)."""
    buf = read_bytes(path, record)
    if reduce > 1 and not is_jpeg(buf):
        reduce = 1
    return decode_image(buf, path, record, reduce, expected_size, max_pixels), reduce


# EXIF orientations that rotate by 90 degrees: OpenCV applies them on decoding, so the decoded
# image is the header's size transposed.
_EXIF_ORIENTATION = 0x0112
_TRANSPOSING_ORIENTATIONS = (5, 6, 7, 8)


def read_image_size(path, record=None) -> tuple[int, int]:
    """(width, height) of the image OpenCV would decode, read from the file's header only.

    For annotation formats without image sizes (MPII). Pillow reads the header lazily (no pixel
    decoding); an EXIF orientation that turns the image by 90 degrees swaps the two, as OpenCV's
    IMREAD_COLOR applies it.
    """
    from PIL import Image, UnidentifiedImageError  # noqa: PLC0415 - only the MPII format needs it

    try:
        with Image.open(path) as img:
            width, height = img.size
            orientation = img.getexif().get(_EXIF_ORIENTATION, 1)
    except FileNotFoundError:
        raise DataError("image file not found", file=path, record=record, field="image") from None
    except (UnidentifiedImageError, OSError) as e:
        raise DataError(f"image header unreadable: {e}", file=path, record=record, field="image") from None
    if orientation in _TRANSPOSING_ORIENTATIONS:
        width, height = height, width
    return int(width), int(height)


def exif_orientation(path) -> int:
    """The EXIF orientation of an image file (1: upright or none; 2-8: OpenCV turns or mirrors the
    pixels on decoding), read from the header only; 1 when the header cannot be read."""
    from PIL import Image  # noqa: PLC0415

    try:
        with Image.open(path) as img:
            orientation = img.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # noqa: BLE001 - any unreadable header: the decoder reports the file itself
        return 1
    return orientation if isinstance(orientation, int) and 1 <= orientation <= 8 else 1


__all__ = ["read_bytes", "check_complete", "decode_image", "load_image", "is_jpeg", "read_image_size",
           "exif_orientation"]
