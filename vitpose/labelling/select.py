"""Which frames to label next: rank images or video frames by what a label would teach the model.

Signals (each in [0, 1], per person; a frame counts its most doubtful person):

- **confidence**: 1 - the mean keypoint score of the flip-averaged prediction. A model that finds
  no clear heatmap peak has not learnt what the frame shows (occlusion, blur, an unusual pose).
  A model with a calibration (`vitpose calibrate`) gives each keypoint `p`, the probability that it
  is right: then the mean p is the confidence (a peak's height is not a probability; p is).
- **flip**: 1 - OKS between the plain forward and the mirrored forward flipped back
  (`TopDown.flip_views`, the two halves of the flip test). A model sure of a pose gives the same
  pose both ways; where they part it is unsure of left and right or of the place itself. Free: the
  flip test runs both views anyway.
- **jump** (videos): 1 - the best OKS of the person with the people of the frame before. Bodies move
  little between frames, so a pose that jumps is a pose the model got wrong in one of them. Not
  across a cut (consecutive thumbnails correlated below 0.8): there the people are others.

A frame's uncertainty is the mean of its signals (jump only in videos). Ranking by uncertainty
alone picks the same hard moment N times (a video holds many near-identical frames), so the
choice is greedy and **diverse**: each pick takes the frame of the highest uncertainty x
novelty, novelty = min(1, distance to the nearest frame already chosen / r), with features a
frame's small grey thumbnail (appearance) and its doubtful person's pose in box coordinates, and
r half the median distance between frames; `diversity` (0..1) weighs the novelty (0: uncertainty
alone). Weights are not learnt: each signal is a plain, explainable quantity (docs/labelling.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vitpose.errors import UserError
from vitpose.inference.pipeline import IMAGE_SUFFIXES, coco_records, read_records
from vitpose.inference.writers import ResultsFile
from vitpose.labelling.similarity import oks

__all__ = ["FrameScore", "choose_frames", "settle_jumps", "frame_feature", "iter_frames", "keypoint_confidence",
           "labelled_names", "score_frame", "select_frames"]

THUMBNAIL = (8, 8)  # (w, h) of the appearance feature: coarse enough that a shifted copy is near
CUT_CORRELATION = 0.8  # consecutive thumbnails correlated less than this: a cut, no jump is measured


@dataclass
class FrameScore:
    """One frame's ranking facts (a line of the progress file)."""

    item: str  # the task's image name (a video frame: STEM_FRAME.jpg)
    frame: int | None
    width: int
    height: int
    uncertainty: float
    signals: dict
    feature: list
    records: list = field(default_factory=list)  # the flip-averaged predictions, COCO records

    def line(self) -> dict:
        return {"item": self.item, "frame": self.frame, "width": self.width, "height": self.height,
                "uncertainty": self.uncertainty, "signals": self.signals, "feature": self.feature,
                "records": self.records}

    @classmethod
    def from_line(cls, line: dict) -> FrameScore:
        return cls(line["item"], line["frame"], line["width"], line["height"], line["uncertainty"],
                   line["signals"], line["feature"], line["records"])


def score_frame(views, sigmas, previous: np.ndarray | None = None, video: bool = False):
    """Uncertainty of one frame from its `FlipViews`: (uncertainty, signals of its most doubtful
    person, that person's index or None). `previous`: the keypoints (P, K, 2) of the frame before
    (videos; None for the first frame)."""
    poses = views.poses
    if not len(poses):
        return 0.0, {}, None
    boxes = poses.boxes
    area = np.maximum((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]), 1.0)
    signals = {"confidence": 1.0 - np.clip(keypoint_confidence(poses), 0, 1).mean(-1),
               "flip": 1.0 - oks(views.plain, views.mirrored, area, sigmas)}
    if video:
        if previous is not None and len(previous):
            pairs = oks(poses.keypoints[:, None], np.asarray(previous)[None], area[:, None], sigmas)
            signals["jump"] = 1.0 - pairs.max(1)
        else:
            signals["jump"] = np.zeros(len(poses))
    per_person = np.mean([values for values in signals.values()], axis=0)
    hardest = int(np.argmax(per_person))
    return float(per_person[hardest]), {name: round(float(v[hardest]), 4) for name, v in signals.items()}, hardest


def keypoint_confidence(poses) -> np.ndarray:
    """(M, K) float64: a calibrated model's `keypoint_p` (the probability each keypoint is right),
    else the raw keypoint scores (a model without a calibration, as before)."""
    p = getattr(poses, "keypoint_p", None)
    return np.asarray(poses.keypoint_scores if p is None else p, np.float64)


def thumbnail(image: np.ndarray) -> np.ndarray:
    """The frame's small grey thumbnail, zero mean and unit norm (a dot product is a correlation)."""
    import cv2

    grey = cv2.resize(image.mean(-1).astype(np.float32), THUMBNAIL, interpolation=cv2.INTER_AREA).ravel()
    grey -= grey.mean()
    return grey / max(float(np.linalg.norm(grey)), 1e-6)


def frame_feature(image: np.ndarray, views, hardest: int | None) -> np.ndarray:
    """A frame's diversity feature: its `thumbnail` and the doubtful person's pose in box
    coordinates (scaled to unit norm over the keypoints; zeros without one)."""
    grey = thumbnail(image)
    k = views.poses.keypoints.shape[1] if views.poses.keypoints.ndim == 3 else 0
    pose = np.zeros(2 * k, np.float32)
    if hardest is not None:
        x1, y1, x2, y2 = views.poses.boxes[hardest]
        size = np.array([max(x2 - x1, 1.0), max(y2 - y1, 1.0)])
        relative = (views.poses.keypoints[hardest] - [x1, y1]) / size  # (K, 2), ~[0, 1]
        pose = (relative.ravel() / np.sqrt(k)).astype(np.float32)
    return np.concatenate([grey, pose])


def settle_jumps(scores: list[FrameScore]) -> list[float]:
    """Uncertainties with a video's jumps made two-sided: a jump between frames t-1 and t is
    either frame's error, so frame t keeps min(its jump from t-1, frame t+1's jump from it);
    the frame that parts from both neighbours is the outlier (the frame after it is not).
    A frame whose next one was not scored right after it keeps its own jump."""
    out = []
    for n, score in enumerate(scores):
        signals = dict(score.signals)
        following = scores[n + 1] if n + 1 < len(scores) else None
        if "jump" in signals and following is not None and following.frame is not None and score.frame is not None \
                and "jump" in following.signals and following.signals.get("after") == score.frame:
            signals["jump"] = min(signals["jump"], following.signals["jump"])
        values = [v for k, v in signals.items() if k != "after"]
        out.append(float(np.mean(values)) if values else 0.0)
    return out


def choose_frames(uncertainty, features, count: int, diversity: float = 0.5) -> list[int]:
    """Greedy: each pick is the frame of the highest uncertainty x ((1 - diversity) + diversity x
    novelty), novelty = min(1, distance to the nearest chosen frame / r), r = half the median
    distance between frames (so near-copies of a chosen frame score ~0). Ties: the earlier frame."""
    u = np.asarray(uncertainty, np.float64)
    f = np.asarray(features, np.float64).reshape(len(u), -1)
    count = min(int(count), len(u))
    if count <= 0:
        return []
    radius = 0.5 * _median_distance(f)
    nearest = np.full(len(u), np.inf)
    chosen: list[int] = []
    for _ in range(count):
        novelty = np.ones(len(u)) if radius <= 0 else np.minimum(1.0, nearest / radius)
        gain = u * ((1.0 - diversity) + diversity * novelty)
        gain[chosen] = -np.inf
        pick = int(np.argmax(gain))
        chosen.append(pick)
        nearest = np.minimum(nearest, np.linalg.norm(f - f[pick], axis=1))
    return chosen


def _median_distance(f: np.ndarray, samples: int = 4096) -> float:
    """The median distance between two different frames (a fixed sample of pairs for many frames)."""
    n = len(f)
    if n < 2:
        return 0.0
    rng = np.random.default_rng(0)
    i, j = rng.integers(0, n, samples), rng.integers(0, n, samples)
    keep = i != j
    return float(np.median(np.linalg.norm(f[i[keep]] - f[j[keep]], axis=1))) if keep.any() else 0.0


# ---------------------------------------------------------------------------------------------
# Sources


def frame_name(video: Path, frame: int) -> str:
    """The image name of a video frame in the task file (and in the COCO file imported back)."""
    return f"{video.stem}_{frame:06d}.jpg"


def iter_frames(source: Path, kind: str, every: int = 1, skip=frozenset()) -> Iterator[tuple[str, int | None, object]]:
    """(name, frame index or None, RGB uint8 image) of a folder of images, one image, or every
    `every`-th frame of a video; names in `skip` are passed by without decoding."""
    if kind == "video":
        yield from _video_frames(source, every, skip)
        return
    paths = (sorted(p for p in source.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
             if kind == "dir" else [source])
    if not paths:
        raise UserError(f"SRC {source}: no images (looked for {', '.join(IMAGE_SUFFIXES)})")
    from vitpose.files import read_image

    for path in paths:
        if path.name in skip:
            continue
        yield path.name, None, np.ascontiguousarray(read_image(path)[:, :, ::-1])


def _video_frames(source: Path, every: int, skip):
    """Every `every`-th frame not in `skip`, read by the one frame reader (the others passed by
    undecoded; a frame that fails to decode is skipped, as `vitpose predict` skips it)."""
    from vitpose.run.sources import FrameReader

    reader = FrameReader(source, keep=lambda index: not index % every and frame_name(source, index) not in skip)
    for frame in reader:
        yield frame_name(source, frame.index), frame.index, np.ascontiguousarray(frame.bgr[:, :, ::-1])


def labelled_names(path: Path) -> set[str]:
    """The image file names (base names) of a COCO file's `images`: `--exclude`."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"--exclude {path}: not a readable COCO JSON file ({e})") from None
    images = doc.get("images") if isinstance(doc, dict) else None
    if not isinstance(images, list):
        raise UserError(f"--exclude {path}: field 'images' missing; give the COCO keypoint file of the labelled "
                        f"frames (what `vitpose import-annotations` writes)")
    names = set()
    for i, image in enumerate(images):
        name = image.get("file_name") if isinstance(image, dict) else None
        if not isinstance(name, str) or not name:
            raise UserError(f"--exclude {path}: images[{i}]: field 'file_name' must be a file name")
        names.add(Path(name).name)
    return names


# ---------------------------------------------------------------------------------------------
# The run


def select_frames(predictor, source: Path, kind: str, progress: Path, *, boxes=None, every: int = 1,
                  skip=frozenset(), resume: bool = False, stop=None, on_frame=None) -> tuple[list[FrameScore], bool]:
    """Score every frame of `source` (skipping `skip`), each frame's line streamed to `progress`
    (JSON Lines, `ResultsFile`: an interrupted run keeps what it finished and `resume=True`
    continues it). Returns (the frames' scores, completed). `boxes`: a `BoxTable` (`--boxes`), else
    the predictor's detector. `stop()` -> True ends the run after the current frame."""
    results = ResultsFile(progress, "item", resume=resume)
    scores = [FrameScore.from_line(line) for line in read_records(progress)] if results.done else []
    video = kind == "video"
    previous = _keypoints_of(scores[-1].records) if scores and video else None
    previous_thumb = np.asarray(scores[-1].feature[:THUMBNAIL[0] * THUMBNAIL[1]]) if scores and video else None
    previous_frame = scores[-1].frame if scores else None
    completed = False
    try:
        for name, frame, image in iter_frames(source, kind, every, skip | results.done):
            if stop is not None and stop():
                break
            given = None if boxes is None else _boxes_for(boxes, name, frame)
            views = predictor.flip_views(image, given)  # given None: the predictor's detector
            thumb = thumbnail(image)
            if previous_thumb is not None and float(thumb @ previous_thumb) < CUT_CORRELATION:
                previous = None  # a cut: the people of the frame before are not these people
            previous_thumb = thumb
            uncertainty, signals, hardest = score_frame(views, predictor.skeleton.sigmas, previous, video)
            if video and previous is not None and signals:
                signals["after"] = previous_frame  # the frame the jump was measured from
            records, _ = coco_records(views.poses, image_id=frame if video else None, file_name=name)
            for record in records:
                record.update(width=int(image.shape[1]), height=int(image.shape[0]))
            score = FrameScore(name, frame, int(image.shape[1]), int(image.shape[0]), round(uncertainty, 6), signals,
                               [round(float(v), 5) for v in frame_feature(image, views, hardest)], records)
            results.write([score.line()])
            scores.append(score)
            previous = views.poses.keypoints if video else None
            previous_frame = frame
            if on_frame is not None:
                on_frame(score)
        else:
            completed = True
    finally:
        results.close(completed)
    return scores, completed


def _boxes_for(table, name: str, frame: int | None) -> np.ndarray:
    if frame is not None and table.keyed_by("frame"):
        found = table.lookup("frame", frame)
    elif table.keyed_by("file_name"):
        found = table.lookup("file_name", name)
    elif table.keyed_by("image_id") and frame is None and Path(name).stem.isascii() and Path(name).stem.isdigit():
        found = table.lookup("image_id", int(Path(name).stem))  # COCO names: the image id is the number
    else:
        raise UserError(f"--boxes {table.path}: its records need 'frame' (videos), 'file_name' or a COCO "
                        f"'image_id' (images) to be matched to {name}")
    return found.as_array()


def _keypoints_of(records: list) -> np.ndarray:
    rows = [np.asarray([v if v is not None else np.nan for v in r["keypoints"]], np.float64).reshape(-1, 3)[:, :2]
            for r in records]
    return np.stack(rows) if rows else np.zeros((0, 0, 2))
