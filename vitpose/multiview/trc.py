"""OpenSim's marker file (.trc, as Pose2Sim writes it) and the per-point reprojection errors (CSV).

The .trc: tab-separated; `PathFileType 4 (X/Y/Z) NAME`, the names and values of DataRate,
CameraRate, NumFrames, NumMarkers, Units, OrigDataRate, OrigDataStartFrame, OrigNumFrames; then
`Frame# Time NAME1 (two empty cells) NAME2 ...`, `X1 Y1 Z1 X2 ...`, and one row per frame
(Frame# 1-based, Time in seconds); a point that could not be triangulated is empty cells, as
pandas (and so Pose2Sim) writes a NaN. OpenSim's world is Y up: with `up="z"` (the calibration's
world is Z up, as Pose2Sim's and a board on the floor give) the columns are (Y, Z, X) of the world,
Pose2Sim's `zup2yup`; with `up="y"` the world's X, Y, Z as they are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vitpose.errors import UserError

AXES = {"z": (1, 2, 0), "y": (0, 1, 2)}


def trc_text(points: np.ndarray, names, frames, fps: float, units: str = "m", up: str = "z",
             file_name: str = "points.trc") -> str:
    """The .trc of points (T, K, 3) in the world's frame at the given frame numbers (0-based)."""
    frames = np.asarray(frames, int)
    columns = points[..., list(AXES[up])]
    first = int(frames[0]) + 1 if len(frames) else 1
    last = int(frames[-1]) + 1 if len(frames) else 0
    lines = [f"PathFileType\t4\t(X/Y/Z)\t{file_name}",
             "DataRate\tCameraRate\tNumFrames\tNumMarkers\tUnits\tOrigDataRate\tOrigDataStartFrame\tOrigNumFrames",
             "\t".join(map(str, [_number(fps), _number(fps), len(frames), len(names), units, _number(fps), first, last])),
             "Frame#\tTime\t" + "\t\t\t".join(names) + "\t\t\t",
             "\t\t" + "\t".join(f"X{i + 1}\tY{i + 1}\tZ{i + 1}" for i in range(len(names))),
             ""]
    for frame, row in zip(frames, columns.reshape(len(frames), -1)):
        cells = ["" if not np.isfinite(v) else f"{v:.6f}" for v in row]
        lines.append("\t".join([str(frame + 1), f"{frame / fps:.6f}", *cells]))
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def read_trc(path, up: str = "z") -> tuple[list[str], np.ndarray, np.ndarray, dict]:
    """A .trc -> (marker names, frame numbers 0-based, points (T, K, 3) in the world's frame, header)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    if len(lines) < 5 or not lines[0].startswith("PathFileType"):
        raise UserError(f"{path}: not a .trc file (no PathFileType line)")
    header = dict(zip(lines[1].split("\t"), lines[2].split("\t")))
    names = [n for n in lines[3].split("\t")[2:] if n]
    rows = [line.split("\t") for line in lines[5:] if line.strip()]
    frames = np.array([int(r[0]) - 1 for r in rows], int)
    values = np.array([[float(c) if c.strip() else np.nan for c in r[2:2 + 3 * len(names)]]
                       + [np.nan] * max(0, 3 * len(names) - len(r) + 2) for r in rows], np.float64)
    columns = values.reshape(len(rows), len(names), 3)
    points = np.empty_like(columns)
    points[..., list(AXES[up])] = columns
    return names, frames, points, header


def errors_csv(frames, points: np.ndarray, errors: np.ndarray, used: np.ndarray, names, person: int = 1) -> str:
    """One row per triangulated point: person, frame, keypoint, x, y, z (the world's frame), the mean
    reprojection error in pixels over the views used, and how many views."""
    rows = ["person,frame,keypoint,x,y,z,reprojection_error_px,views"]
    with np.errstate(invalid="ignore"):
        mean = np.nansum(errors, -1) / used.sum(-1)
    for t, frame in enumerate(frames):
        for k, name in enumerate(names):
            if np.isfinite(points[t, k]).all():
                x, y, z = points[t, k]
                rows.append(f"{person},{frame},{name},{x:.6f},{y:.6f},{z:.6f},{mean[t, k]:.3f},{int(used[t, k].sum())}")
    return "\n".join(rows) + "\n"
