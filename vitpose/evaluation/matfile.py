"""Read numeric arrays from a MATLAB level-5 MAT-file (what MATLAB writes by default up to -v7).

MPII's head boxes ship as `mpii_gt_val.mat`; MMPose reads it with `scipy.io.loadmat`. SciPy is not
a dependency of this project, so this is a small reader for the part of the format such files use
(docs/evaluation.md §8.3): a 128-byte header, then data elements, each a tag (type, byte count) and
its data padded to 8 bytes, or a "small" element packed into the 8-byte tag; zlib-compressed
elements (miCOMPRESSED) hold one element; a matrix (miMATRIX) holds its flags and class, its
dimensions, its name and its real part, stored column-major, possibly in a smaller integer type
than its class (MATLAB stores a double array of small integers as uint8, say). Numeric matrices of
every class are read (as the class's NumPy dtype, like scipy); cells, structs, strings and sparse
matrices are skipped, and complex ones refused. Version 7.3 files are HDF5 and are refused with a
hint.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from vitpose.errors import UserError

HEADER_BYTES = 128
MI_MATRIX, MI_COMPRESSED = 14, 15
# Data types of element contents (miINT8 ... miUINT64) -> NumPy type (byte order added later).
DATA_TYPES = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 9: "f8", 12: "i8", 13: "u8"}
# Array classes (mxDOUBLE_CLASS ... mxUINT64_CLASS) -> the dtype scipy.io.loadmat returns.
NUMERIC_CLASSES = {6: "f8", 7: "f4", 8: "i1", 9: "u1", 10: "i2", 11: "u2", 12: "i4", 13: "u4", 14: "i8", 15: "u8"}
COMPLEX_FLAG = 0x0800


class MatFileError(UserError, ValueError):
    """A file this reader cannot read (names the file and what is wrong)."""


def _byte_order(header: bytes, path: Path) -> str:
    if header[:19] == b"MATLAB 7.3 MAT-file" or header[124:126] == b"\x00\x02":
        raise MatFileError(f"{path}: a MATLAB 7.3 (HDF5) MAT-file; save it with -v7 (or -v6) in MATLAB, "
                           f"or convert its array to .npz")
    if not header.startswith(b"MATLAB 5.0 MAT-file"):
        raise MatFileError(f"{path}: not a MATLAB level-5 MAT-file (its header does not start with "
                           f"'MATLAB 5.0 MAT-file')")
    indicator = header[126:128]
    if indicator == b"IM":
        return "<"
    if indicator == b"MI":
        return ">"
    raise MatFileError(f"{path}: unreadable endian indicator {indicator!r} in the header")


def _elements(buffer: bytes, order: str, path: Path):
    """(data type, data bytes) of each element in `buffer`."""
    pos = 0
    while pos + 8 <= len(buffer):
        first, second = np.frombuffer(buffer, f"{order}u4", 2, pos)
        if first >> 16:  # small element: byte count in the upper half, data in the tag's last 4 bytes
            dtype, size = int(first & 0xFFFF), int(first >> 16)
            yield dtype, buffer[pos + 4:pos + 4 + size]
            pos += 8
            continue
        dtype, size = int(first), int(second)
        if pos + 8 + size > len(buffer):
            raise MatFileError(f"{path}: truncated (an element of {size} bytes runs past the end)")
        yield dtype, buffer[pos + 8:pos + 8 + size]
        # Compressed elements are not padded; every other element is padded to 8 bytes.
        pos += 8 + (size if dtype == MI_COMPRESSED else -(-size // 8) * 8)


def _numbers(dtype: int, data: bytes, order: str, path: Path) -> np.ndarray:
    if dtype not in DATA_TYPES:
        raise MatFileError(f"{path}: unsupported data type {dtype} in a numeric array")
    return np.frombuffer(data, np.dtype(DATA_TYPES[dtype]).newbyteorder(order))


def _matrix(data: bytes, order: str, path: Path) -> tuple[str, np.ndarray | None]:
    """(name, array) of one miMATRIX element; array None for non-numeric classes."""
    parts = list(_elements(data, order, path))
    if len(parts) < 3:
        raise MatFileError(f"{path}: a matrix element without flags, dimensions and name")
    flags = _numbers(parts[0][0], parts[0][1], order, path)
    array_class, complex_ = int(flags[0]) & 0xFF, bool(int(flags[0]) & COMPLEX_FLAG)
    dims = tuple(int(d) for d in _numbers(parts[1][0], parts[1][1], order, path))
    name = parts[2][1].decode("ascii", "replace")
    if array_class not in NUMERIC_CLASSES:
        return name, None
    if complex_:
        raise MatFileError(f"{path}: variable {name!r} is complex; only real arrays are read")
    values = _numbers(parts[3][0], parts[3][1], order, path) if len(parts) > 3 else np.zeros(0)
    if values.size != int(np.prod(dims)):
        raise MatFileError(f"{path}: variable {name!r} holds {values.size} values for dimensions {dims}")
    return name, values.astype(NUMERIC_CLASSES[array_class]).reshape(dims, order="F")


def read_mat_arrays(path) -> dict[str, np.ndarray]:
    """{variable name: array} of the numeric variables of a level-5 MAT-file (like
    `scipy.io.loadmat`, without its `__header__` entries; 2-D and higher shapes as stored)."""
    path = Path(path)
    raw = path.read_bytes()
    if len(raw) < HEADER_BYTES:
        raise MatFileError(f"{path}: too short for a MAT-file ({len(raw)} bytes)")
    order = _byte_order(raw[:HEADER_BYTES], path)
    arrays = {}
    for dtype, data in _elements(raw[HEADER_BYTES:], order, path):
        if dtype == MI_COMPRESSED:
            try:
                data = zlib.decompress(data)
            except zlib.error as e:
                raise MatFileError(f"{path}: a compressed element does not decompress ({e})") from None
            inner = list(_elements(data, order, path))
            if not inner:
                continue
            dtype, data = inner[0]
        if dtype == MI_MATRIX:
            name, array = _matrix(data, order, path)
            if array is not None:
                arrays[name] = array
    return arrays


__all__ = ["MatFileError", "read_mat_arrays"]
