"""Camera calibration files: the TOML that aniposelib's `CameraGroup.dump` and Pose2Sim's calibration
write, read into `Camera`s, and the camera model the triangulation uses.

Both tools write one table per camera (`[cam_0]`, `[cam_01]`, ...) and a `[metadata]` table:
`name`, `size` [width, height], `matrix` (3x3 intrinsics), `distortions` (OpenCV's k1 k2 p1 p2
[k3 ...]; aniposelib 5 values, Pose2Sim 4; a fisheye camera's 4 are OpenCV's fisheye k1..k4),
`rotation` (Rodrigues vector) and `translation`, world to camera (x_cam = R X + t), and
`fisheye` (Pose2Sim always, aniposelib for its fisheye cameras). Every table but `metadata` is a
camera, in the file's order. The world's unit is the calibration's (Pose2Sim: metres; aniposelib:
the board's unit).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from vitpose.errors import UserError

DISTORTION_LENGTHS = (0, 4, 5, 8, 12, 14)  # what cv2.undistortPoints takes


class CalibrationError(UserError):
    """A calibration file that cannot be read or misses a camera's field (one line naming the file)."""


@dataclass(frozen=True)
class Camera:
    """One calibrated camera: intrinsics `matrix` (3, 3), `distortions`, world-to-camera `rotation`
    (3, 3) and `translation` (3,), `size` (width, height) or None, `fisheye`."""

    name: str
    matrix: np.ndarray
    distortions: np.ndarray
    rotation: np.ndarray
    translation: np.ndarray
    size: tuple[int, int] | None = None
    fisheye: bool = False

    @property
    def focal(self) -> np.ndarray:
        """(fx, fy): normalised image units to pixels."""
        return np.array([self.matrix[0, 0], self.matrix[1, 1]])

    def extrinsics(self) -> np.ndarray:
        """[R | t], (3, 4): world to camera."""
        return np.concatenate([self.rotation, self.translation[:, None]], 1)

    def normalized(self, pixels: np.ndarray) -> np.ndarray:
        """Pixels (..., 2) -> undistorted normalised image coordinates (..., 2) (NaN stays NaN)."""
        flat = np.asarray(pixels, np.float64).reshape(-1, 2)
        out = np.full_like(flat, np.nan)
        ok = np.isfinite(flat).all(1)
        if ok.any():
            points = np.ascontiguousarray(flat[ok])[:, None, :]
            if self.fisheye:
                undistorted = cv2.fisheye.undistortPoints(points, self.matrix, self.distortions[:4])
            else:
                undistorted = cv2.undistortPoints(points, self.matrix, self.distortions)
            out[ok] = undistorted[:, 0, :]
        return out.reshape(np.shape(pixels))

    def project(self, points: np.ndarray) -> np.ndarray:
        """World points (..., 3) -> pixels (..., 2), distortion applied (OpenCV's model)."""
        flat = np.asarray(points, np.float64).reshape(-1, 3)
        out = np.full((len(flat), 2), np.nan)
        ok = np.isfinite(flat).all(1)
        if ok.any():
            rvec = cv2.Rodrigues(self.rotation)[0]
            objects = np.ascontiguousarray(flat[ok])[:, None, :]
            if self.fisheye:
                projected = cv2.fisheye.projectPoints(objects, rvec, self.translation, self.matrix,
                                                      self.distortions[:4])[0]
            else:
                projected = cv2.projectPoints(objects, rvec, self.translation, self.matrix, self.distortions)[0]
            out[ok] = projected[:, 0, :]
        return out.reshape(*np.shape(points)[:-1], 2)


def read_calibration(path) -> list[Camera]:
    """The cameras of an aniposelib or Pose2Sim calibration TOML, in the file's order."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CalibrationError(f"--calibration {path}: cannot read it ({e.strerror or e})") from None
    tables = parse_toml(text, path)
    cameras = [_camera(path, key, table) for key, table in tables.items()
               if key != "metadata" and isinstance(table, dict)]
    if not cameras:
        raise CalibrationError(f"--calibration {path}: no camera tables ([cam_0], [cam_01], ...); is it "
                               f"the calibration TOML aniposelib or Pose2Sim wrote?")
    return cameras


def parse_toml(text: str, path: Path) -> dict:
    """The file's tables; Python's tomllib where it exists (3.11+), else `_toml_subset`."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return _toml_subset(text, path)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CalibrationError(f"--calibration {path}: not valid TOML ({e})") from None


# TOML's words as Python literals (a NaN is read as None, which becomes NaN in a float array).
_WORDS = {"true": "True", "false": "False", "nan": "None", "inf": "1e999"}


def _toml_subset(text: str, path: Path) -> dict:
    """What the two tools write: `[table]` lines and `key = value` with strings, numbers, booleans
    and (nested, possibly multi-line) arrays. Python 3.10 has no TOML reader and these files need
    no more."""
    tables: dict = {}
    current, pending, start = tables, "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip() if '"' not in raw else raw.strip()
        if not line:
            continue
        if not pending and re.fullmatch(r"\[[^\[\]]+\]", line):
            current = tables.setdefault(line[1:-1].strip().strip('"'), {})
            continue
        pending, start = (pending + " " + line, start) if pending else (line, number)
        if pending.count("[") > pending.count("]"):
            continue
        key, sep, value = pending.partition("=")
        pending = ""
        if not sep:
            raise CalibrationError(f"--calibration {path}:{start}: expected key = value")
        value = re.sub(r"\b(true|false|nan|inf)\b", lambda m: _WORDS[m.group(1)], value.strip())
        try:
            current[key.strip().strip('"')] = ast.literal_eval(value)
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
            raise CalibrationError(f"--calibration {path}:{start}: cannot read the value {value!r}") from None
    return tables


def _array(path: Path, key: str, table: dict, field: str, shape: tuple | None, lengths=None) -> np.ndarray:
    if field not in table:
        raise CalibrationError(f"--calibration {path}: [{key}] has no '{field}'")
    try:
        value = np.asarray(table[field], np.float64)
    except (TypeError, ValueError):
        value = None
    if value is None or (shape is not None and value.shape != shape) or (lengths is not None and (
            value.ndim != 1 or len(value) not in lengths)) or not np.isfinite(value).all():
        want = f"shape {shape}" if shape is not None else f"{' or '.join(map(str, lengths))} numbers"
        raise CalibrationError(f"--calibration {path}: [{key}] '{field}' must be finite numbers of {want}")
    return value


def _camera(path: Path, key: str, table: dict) -> Camera:
    fisheye = bool(table.get("fisheye", False))
    matrix = _array(path, key, table, "matrix", (3, 3))
    if not (matrix[0, 0] > 0 and matrix[1, 1] > 0):  # a zero focal length projects every point to the centre
        raise CalibrationError(f"--calibration {path}: [{key}] 'matrix' has focal lengths {matrix[0, 0]:g}, "
                               f"{matrix[1, 1]:g}; a camera's are > 0 pixels (fx at [0][0], fy at [1][1])")
    lengths = (4,) if fisheye else DISTORTION_LENGTHS
    distortions = _array(path, key, table, "distortions", None, lengths) if "distortions" in table else np.zeros(0)
    rvec = _array(path, key, table, "rotation", (3,))
    translation = _array(path, key, table, "translation", (3,))
    size = None
    if "size" in table:
        size_values = _array(path, key, table, "size", (2,))
        size = (int(size_values[0]), int(size_values[1]))
    return Camera(name=str(table.get("name", key)), matrix=matrix, distortions=distortions,
                  rotation=cv2.Rodrigues(rvec)[0], translation=translation, size=size, fisheye=fisheye)


def calibration_text(cameras: list[Camera], flavour: str = "aniposelib") -> str:
    """The TOML of `cameras` as aniposelib's `CameraGroup.dump` (flavour "aniposelib": `[cam_0]`,
    5 distortions) or Pose2Sim (`[cam_01]`, 4 distortions, `fisheye`) writes it."""
    def array(values) -> str:
        values = np.asarray(values, np.float64)
        if values.ndim > 1:
            return "[ " + ", ".join(array(row) for row in values) + ",]"
        return "[ " + ", ".join(repr(float(v)) for v in values) + ",]"

    lines = []
    for i, camera in enumerate(cameras):
        pose2sim = flavour == "pose2sim"
        lines.append(f"[cam_{i + 1:02d}]" if pose2sim else f"[cam_{i}]")
        lines.append(f'name = "{camera.name}"')
        if camera.size is not None:
            lines.append(f"size = {array(camera.size)}")
        lines.append(f"matrix = {array(camera.matrix)}")
        lines.append(f"distortions = {array(camera.distortions[:4] if pose2sim else camera.distortions)}")
        lines.append(f"rotation = {array(cv2.Rodrigues(camera.rotation)[0][:, 0])}")
        lines.append(f"translation = {array(camera.translation)}")
        if pose2sim or camera.fisheye:
            lines.append(f"fisheye = {'true' if camera.fisheye else 'false'}")
        lines.append("")
    lines += ["[metadata]", "adjusted = false", "error = 0.0", ""]
    return "\n".join(lines)
