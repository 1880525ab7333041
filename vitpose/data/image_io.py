"""Image decoding with OpenCV, with checks that turn bad files into DataError.

Policy (what MMPose's `LoadImage` does, made explicit):
- Images are decoded with `cv2.IMREAD_COLOR`, the flag behind MMPose's `color_type='color'`:
  grayscale files are replicated to three equal channels, 4-channel (alpha) files lose the
  alpha channel, CMYK JPEGs are converted. The result is always uint8 BGR (H, W, 3).
- The decoded size must equal the `width`/`height` of the image record, because boxes and
  keypoints are in that frame; a mismatch (wrong record, EXIF-rotated file) raises.
- A JPEG must start with SOI (FF D8) and end with EOI (FF D9), allowing trailing padding.
  OpenCV decodes a truncated JPEG "successfully" as a partly grey image with only a stderr
  warning, so the markers are checked before decoding; the same goes for PNG's IEND chunk.

Reduced decoding (`reduce` = 2, 4 or 8) uses libjpeg's DCT scaling through
`cv2.IMREAD_REDUCED_COLOR_{2,4,8}`: each reduced pixel i averages full-resolution pixels
[f*i, f*i + f), so its centre sits at full-resolution x = f*i + (f-1)/2 (which
`transforms.source_matrix` folds into the warp). Only JPEGs are reduced; other formats are decoded at full size
(OpenCV resizes those with a different pixel-centre rule).

Files are read through `vitpose.files` (numpy buffers: any file name the OS allows), and an image
whose header says it is over the pixel limit (`vitpose.files.DEFAULT_MAX_PIXELS`, or
$VITPOSE_MAX_PIXELS) is refused before it is decoded. Reading and decoding are `vitpose.files`'
one image reader (`read_image_file`, `decode_bytes`); this module names the record and the field
as the data layer does: its errors are `ImageDataError`s (a DataError and an ImageReadError).
"""

import contextlib

import numpy as np

from vitpose.files import ImageReadError, ImageTooLargeError
from vitpose.files import images as one_reader

from .errors import ImageDataError, ImageDataTooLargeError

is_jpeg = one_reader.is_jpeg


@contextlib.contextmanager
def _named(path, record):
    """The one reader's ImageReadError as the data layer names it: the file, the record, the field."""
    try:
        yield
    except ImageTooLargeError as e:
        raise ImageDataTooLargeError(str(e), record=record) from None  # the message names the file
    except ImageReadError as e:
        raise ImageDataError(e.reason, file=path, record=record, field="file_name") from None


def read_bytes(path, record=None) -> np.ndarray:
    """The file's bytes as a uint8 array (what cv2.imdecode takes); any file name the OS allows."""
    with _named(path, record):
        return one_reader.read_encoded(path)


def check_complete(buf: np.ndarray, path, record=None) -> None:
    """Raise ImageDataError when a JPEG or PNG byte stream is cut short (truncated download)."""
    with _named(path, record):
        one_reader.check_complete(buf, path)


def _check_size(img: np.ndarray, reduce: int, expected_size, path, record) -> None:
    w, h = int(expected_size[0]), int(expected_size[1])
    want = (-(-h // reduce), -(-w // reduce))  # libjpeg rounds reduced sizes up
    if img.shape[:2] != want:
        got = (img.shape[1] * reduce, img.shape[0] * reduce) if reduce > 1 else img.shape[1::-1]
        raise ImageDataError(f"decoded image is {got[0]}x{got[1]} but its record says {w}x{h}",
                             file=path, record=record, field="width/height")


def decode_image(buf: np.ndarray, path="<bytes>", record=None, reduce: int = 1,
                 expected_size=None, max_pixels: int | None = None) -> np.ndarray:
    """Decode bytes to uint8 BGR (H, W, 3), optionally at 1/`reduce` resolution (JPEG only).

    expected_size: (width, height) of the full-resolution image from its record; the decoded
    size is checked against it (ceil(W / reduce) for reduced JPEG decoding).
    max_pixels: the pixel limit checked on the header before decoding (`vitpose.files`; None:
    $VITPOSE_MAX_PIXELS or `files.DEFAULT_MAX_PIXELS`).
    """
    with _named(path, record):
        img, reduce = one_reader.decode_bytes(buf, path, reduce, max_pixels)
    if expected_size is not None:
        _check_size(img, reduce, expected_size, path, record)
    return img


def load_image(path, record=None, reduce: int = 1, expected_size=None, max_pixels: int | None = None):
    """Read and decode one image file; returns (image BGR uint8, the reduction actually used)."""
    with _named(path, record):
        img, reduce = one_reader.read_image_file(path, reduce, max_pixels)
    if expected_size is not None:
        _check_size(img, reduce, expected_size, path, record)
    return img, reduce


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
        raise ImageDataError("image file not found", file=path, record=record, field="image") from None
    except (UnidentifiedImageError, OSError) as e:
        raise ImageDataError(f"image header unreadable: {e}", file=path, record=record, field="image") from None
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
