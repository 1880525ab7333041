"""The one error type of the data layer: bad files and bad records, named precisely."""

from vitpose.errors import UserError
from vitpose.files import ImageReadError, ImageTooLargeError


class DataError(UserError, ValueError):
    """A data file or record that cannot be used as it is.

    The message names the file, the record (annotation id, image id or list index) and the
    field, so that the bad entry can be found and fixed without a debugger. The parts are also
    kept as attributes for callers that want to react to them.
    """

    def __init__(self, message, *, file=None, record=None, field=None):
        parts = []
        if file is not None:
            parts.append(f"file {file}")
        if record is not None:
            parts.append(f"record {record}")
        if field is not None:
            parts.append(f"field {field!r}")
        where = ", ".join(parts)
        super().__init__(f"{message} ({where})" if where else message)
        self.file = None if file is None else str(file)
        self.record = record
        self.field = field


class ImageDataError(DataError, ImageReadError):
    """An image file that cannot be read, named as the data layer names things (the file, the record,
    the field): a DataError and an ImageReadError (`vitpose.files`' one family of unreadable images)."""


class ImageDataTooLargeError(ImageDataError, ImageTooLargeError):
    """An image over the pixel limit, not decoded (`vitpose.files.check_pixel_limit`)."""
