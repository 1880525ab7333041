"""Files: the one atomic writer, output paths checked before the work, images through numpy buffers.

- `vitpose.files.atomic`: every file this project writes (results, checkpoints, configs, exports,
  drawings) is written to a temporary file beside its target, fsynced and renamed into place
  (`atomic_path`, `atomic_file`, `write_atomic`, `staged_files`, `replace_dir`, `create_exclusive`);
  a full or read-only disk is one `OutputWriteError`.
- `vitpose.files.outputs`: devices and pipes told apart from files (`stream_kind`, `open_stream`)
  and an output flag checked before any work (`check_output`, `OutputPathError`).
- `vitpose.files.images`: the one reader of an image file (`read_image`, through numpy buffers:
  any file name the OS allows), `write_image`, and the pixel limit read from the header before
  decoding (`check_pixel_limit`, `DEFAULT_MAX_PIXELS`, `$VITPOSE_MAX_PIXELS`); every unreadable
  image is an `ImageReadError`.
- `vitpose.files.paths`: `as_path` (str, bytes or PathLike) and `opencv_path` (an ASCII-named link
  for the video files OpenCV opens only by path, when their names are not UTF-8).

Every name is importable from `vitpose.files` itself.
"""

from .atomic import (
    OutputWriteError,
    atomic_file,
    atomic_path,
    create_exclusive,
    create_private,
    free_space,
    fsync_dir,
    readable_mode,
    rename_into_place,
    replace_dir,
    staged_files,
    write_atomic,
    write_error,
)
from .images import (
    DEFAULT_MAX_PIXELS,
    MAX_PIXELS_ENV,
    ImageReadError,
    ImageTooLargeError,
    check_pixel_limit,
    decode_bytes,
    image_header_size,
    max_pixels_limit,
    read_bytes,
    read_image,
    read_image_file,
    write_image,
)
from .outputs import (
    BLOCK_DEVICE,
    STDERR,
    STDOUT,
    STREAM,
    OutputPathError,
    check_output,
    open_stream,
    refuse_stream,
    stream_kind,
)
from .paths import TEMP_SUFFIX, as_path, opencv_can_open, opencv_path

__all__ = ["BLOCK_DEVICE", "DEFAULT_MAX_PIXELS", "MAX_PIXELS_ENV", "STDERR", "STDOUT", "STREAM", "TEMP_SUFFIX",
           "ImageReadError", "ImageTooLargeError", "OutputPathError", "OutputWriteError", "as_path", "atomic_file",
           "atomic_path", "check_output", "check_pixel_limit", "create_exclusive", "create_private", "decode_bytes",
           "free_space", "fsync_dir", "image_header_size", "max_pixels_limit", "open_stream", "opencv_can_open",
           "opencv_path", "read_bytes", "read_image", "read_image_file", "readable_mode", "refuse_stream",
           "rename_into_place", "replace_dir", "staged_files", "stream_kind", "write_atomic", "write_error",
           "write_image"]
