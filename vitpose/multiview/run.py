"""`vitpose triangulate`'s work: calibration and JSON Lines in, one .trc per person and the CSV of
reprojection errors out (`triangulate_files(TriangulateOptions) -> TriangulateSummary`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vitpose.coco_meta import KEYPOINT_NAMES
from vitpose.errors import UsageError
from vitpose.files import check_output, write_atomic
from vitpose.multiview.association import associate
from vitpose.multiview.calibration import CalibrationError, read_calibration
from vitpose.multiview.refine import refine_track
from vitpose.multiview.trc import errors_csv, trc_text
from vitpose.multiview.triangulation import triangulate
from vitpose.multiview.views import read_views

# The body's limbs of COCO-17 whose lengths `--refine` holds constant (the face's links are too
# short for a length to mean much).
COCO_LIMBS = ((5, 7), (7, 9), (6, 8), (8, 10), (11, 13), (13, 15), (12, 14), (14, 16), (5, 6), (11, 12),
              (5, 11), (6, 12))


@dataclass(frozen=True)
class TriangulateOptions:
    """What `vitpose triangulate` was asked: the files, the calibration and the method's settings."""

    views: tuple[Path, ...]
    calibration: Path
    out: Path
    errors: Path | None = None  # default: OUT with the suffix .errors.csv
    cameras: tuple[str, ...] = ()  # the calibration's camera of each file, by name (default: in order)
    fps: float = 30.0
    units: str = "m"
    up: str = "z"
    min_score: float = 0.3
    max_error: float | None = 15.0
    max_epipolar: float = 40.0
    match: str = "auto"
    refine: bool = False
    cutoff: float = 6.0
    max_gap: int = 10
    keypoint_names: tuple[str, ...] = ()


@dataclass
class TriangulateSummary:
    written: list = field(default_factory=list)
    points: int = 0
    missing: int = 0
    mean_error: float = float("nan")

    def lines(self) -> list[str]:
        return [f"{self.points} points triangulated, {self.missing} left out (fewer than two views that agree), "
                f"mean reprojection error {self.mean_error:.2f} px", *(f"written: {p}" for p in self.written)]


def errors_path(options: TriangulateOptions) -> Path:
    return options.errors or options.out.with_suffix(".errors.csv")


def person_path(out: Path, person: int, people: int) -> Path:
    """OUT for one person; OUT_2, OUT_3, ... beside it for the others."""
    return out if person == 0 or people == 1 else out.with_name(f"{out.stem}_{person + 1}{out.suffix}")


def _repeated(names) -> str | None:
    seen = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def chosen_cameras(options: TriangulateOptions) -> list:
    """The calibration's camera of each file: `cameras` by name, else in the file's order."""
    cameras = read_calibration(options.calibration)
    twice = _repeated(options.cameras) or _repeated([str(Path(v).resolve()) for v in options.views])
    if twice:
        flag = "--cameras names" if _repeated(options.cameras) else "the files name"
        raise UsageError(f"{flag} {twice} twice: each camera is one file of its own")
    if options.cameras:
        by_name = {c.name: c for c in cameras}
        unknown = [n for n in options.cameras if n not in by_name]
        if unknown:
            raise CalibrationError(f"--calibration {options.calibration} has no camera named {unknown[0]!r} "
                                   f"(it has {', '.join(by_name)}); check --cameras")
        cameras = [by_name[n] for n in options.cameras]
    centres = [-c.rotation.T @ c.translation for c in cameras]
    for a in range(len(cameras)):
        for b in range(a + 1, len(cameras)):
            if np.linalg.norm(centres[a] - centres[b]) <= 1e-9 * (1 + np.linalg.norm(centres[a])):
                raise CalibrationError(f"--calibration {options.calibration}: cameras {cameras[a].name!r} and "
                                       f"{cameras[b].name!r} are at the same place: no baseline to triangulate from")
    if len(cameras) != len(options.views):
        raise UsageError(f"{len(options.views)} JSON Lines files for the {len(cameras)} cameras of --calibration "
                         f"{options.calibration}: give one file per camera, in its order (or name them with --cameras)")
    return cameras


def marker_names(options: TriangulateOptions, count: int) -> list[str]:
    if options.keypoint_names:
        if len(options.keypoint_names) != count:
            raise UsageError(f"--keypoint-names has {len(options.keypoint_names)} names; the records have {count} keypoints")
        return list(options.keypoint_names)
    return list(KEYPOINT_NAMES) if count == len(KEYPOINT_NAMES) else [f"keypoint{i + 1}" for i in range(count)]


def triangulate_files(options: TriangulateOptions) -> TriangulateSummary:
    """Read, associate, triangulate (and refine) every person, write the .trc files and the CSV."""
    inputs = [options.calibration, *options.views]
    check_output(options.out, "--out", "file", inputs)
    check_output(errors_path(options), "--errors", "file", [*inputs, options.out])  # nor the .trc written first
    cameras = chosen_cameras(options)
    views = [read_views(path) for path in options.views]
    counts = [len(next(iter(view.values()))[0].weights) for view in views]
    if len(set(counts)) > 1:
        other = next(i for i, n in enumerate(counts) if n != counts[0])
        raise UsageError(f"{options.views[other]}: {counts[other]} keypoints a record, {options.views[0]} has "
                         f"{counts[0]}: the cameras' poses must come from the same model")
    for view in views:
        for detections in view.values():
            for d in detections:
                d.weights = np.where(d.weights >= options.min_score, d.weights, 0.0)
    people = associate(views, cameras, options.match, options.max_epipolar)
    names = marker_names(options, counts[0])
    summary, csv_parts = TriangulateSummary(), []
    extrinsics = np.stack([c.extrinsics() for c in cameras])
    focal = np.stack([c.focal for c in cameras])
    all_errors = []
    for index, person in enumerate(people):
        frames, normalized, _, weights = person.arrays()
        t, c, k, _ = normalized.shape
        result = triangulate(normalized.transpose(0, 2, 1, 3).reshape(t * k, c, 2),
                             weights.transpose(0, 2, 1).reshape(t * k, c), extrinsics, focal, options.max_error)
        points, errors, used = (result.points.reshape(t, k, 3), result.errors.reshape(t, k, c),
                                result.used.reshape(t, k, c))
        summary.points += int(np.isfinite(points).all(-1).sum())
        summary.missing += int((~np.isfinite(points).all(-1)).sum())
        all_errors.append(errors[used])
        if options.refine:
            frames, points = refined(options, frames, points, errors, used, weights, limbs=COCO_LIMBS if k == 17 else ())
        path = person_path(options.out, index, len(people))
        write_atomic(path, trc_text(points, names, frames, options.fps, options.units, options.up, path.name))
        summary.written.append(path)
        csv_parts.append(errors_csv(frames, points, _on_frames(errors, frames, person.frames),
                                    _on_frames(used, frames, person.frames), names, index + 1))
    if not people:
        raise UsageError("no person is seen by two cameras in any frame: check that the files are the calibration's "
                         "cameras in its order (--cameras), and --max-epipolar")
    text = csv_parts[0] + "".join(part.split("\n", 1)[1] for part in csv_parts[1:])
    write_atomic(errors_path(options), text)
    summary.written.append(errors_path(options))
    joined = np.concatenate(all_errors) if all_errors else np.zeros(0)
    summary.mean_error = float(joined.mean()) if joined.size else float("nan")
    return summary


def _on_frames(values: np.ndarray, frames: np.ndarray, observed: list) -> np.ndarray:
    """Per-frame values (of the observed frames) laid on `frames` (NaN / False where not observed)."""
    out = np.zeros((len(frames), *values.shape[1:]), values.dtype)
    if values.dtype != bool:
        out[:] = np.nan
    index = {f: i for i, f in enumerate(observed)}
    for row, frame in enumerate(frames):
        if frame in index:
            out[row] = values[index[frame]]
    return out


def refined(options: TriangulateOptions, frames, points, errors, used, weights, limbs):
    """The track on every frame from its first to its last, smoothed, gaps filled, limbs held."""
    span = np.arange(frames.min(), frames.max() + 1)
    dense = np.full((len(span), *points.shape[1:]), np.nan)
    dense[frames - frames.min()] = points
    with np.errstate(invalid="ignore"):
        mean_error = np.nansum(errors, -1) / used.sum(-1)
        confidence = np.where(used, weights.transpose(0, 2, 1), 0.0).sum(-1) / (1 + (mean_error / 5.0) ** 2)
    dense_confidence = np.zeros(dense.shape[:2])
    dense_confidence[frames - frames.min()] = np.nan_to_num(confidence)
    return span, refine_track(dense, dense_confidence, options.fps, options.cutoff, options.max_gap, limbs)
