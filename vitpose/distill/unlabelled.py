"""The people of the unlabelled frames a distillation trains on, found once before the run.

`prepare_unlabelled(cfg)` turns each `distill.unlabeled` source (a folder of images, one image, or a
video: every `distill.frame_step`-th frame, saved as images under the work dir) into a COCO file of
person instances, and lists them in the work dir's manifest (`vitpose.engine.distill.UNLABELLED_MANIFEST`),
which the session reads into the training set. A person's box comes from `distill.unlabeled_boxes`:

- `full-frame`: the whole frame (one person per frame: a single-subject video);
- a detector's name (`vitpose.inference.detect`, as `vitpose predict --detector`);
- a COCO detection results file (records keyed by `image_id` for frames named by COCO ids, or by
  `file_name`; what `vitpose predict --boxes` reads): e.g. a detector run once elsewhere.

The teacher then refines every box: it predicts the person's keypoints in it (flip test on), a box
whose confident keypoints are too few is dropped (a false detection), and the box becomes the
extent of the confident keypoints, padded. Those keypoints are written to the file too, but only to
place the crop and the half-body augmentation: the training set gives them no weight (the teacher's
heatmaps of each augmented crop are the target). Same sources, boxes and teacher: the files are
reused (a resumed run trains on the same instances).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from vitpose.config import Config
from vitpose.engine.distill import UNLABELLED_MANIFEST, file_sha256, teacher_source
from vitpose.errors import UsageError
from vitpose.files import read_image, write_atomic, write_image
from vitpose.inference.detect import DEFAULT_SCORE_THRESHOLD
from vitpose.inference.pipeline import read_boxes_file
from vitpose.run.sources import FrameReader, classify_source, list_images

KEYPOINT_THRESHOLD = 0.3  # a keypoint the teacher is sure of (the usual display threshold)
MIN_KEYPOINT_FRACTION = 0.3  # fewer confident keypoints than this share of K: not a person
BOX_PADDING = 0.15  # each side, as a share of the keypoints' extent (a GT box holds the limbs' width)
FLAG = "--unlabeled"


def prepare_unlabelled(cfg: Config, device=None) -> Path | None:
    """Write (or reuse) the COCO files of `cfg.distill.unlabeled`; returns the manifest (None: no sources)."""
    if not cfg.distill.unlabeled:
        return None
    folder = Path(cfg.train.work_dir) / UNLABELLED_MANIFEST.parent
    manifest = Path(cfg.train.work_dir) / UNLABELLED_MANIFEST
    teacher = teacher_source(cfg)
    want = {"sources": [str(Path(s).expanduser().resolve()) for s in cfg.distill.unlabeled],
            "boxes": cfg.distill.unlabeled_boxes, "frame_step": cfg.distill.frame_step,
            "teacher_sha256": file_sha256(teacher) if Path(teacher).is_file() else teacher}
    stamp = folder / "stamp.json"
    if manifest.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == want:
        return manifest
    from vitpose.inference.door import open_predictor

    boxes = cfg.distill.unlabeled_boxes
    table = read_boxes_file(boxes, "--unlabeled-boxes") if Path(boxes).is_file() else None
    detector = "none" if table is not None else boxes
    predictor = open_predictor(teacher, device=device or cfg.train.device, detector=detector,
                               detector_threshold=DEFAULT_SCORE_THRESHOLD)
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, source in enumerate(want["sources"]):
        img_dir, frames = source_frames(Path(source), folder / f"frames_{i}", cfg.distill.frame_step)
        coco = pseudo_coco(predictor, frames, table)
        count = len(coco["annotations"])
        if count == 0:
            raise UsageError(f"{FLAG} {source}: the teacher found nobody in its {len(coco['images'])} frame(s) "
                             f"with the boxes of --unlabeled-boxes {boxes}; give frames with people or other boxes")
        path = folder / f"set_{i}.json"
        write_atomic(path, json.dumps(coco))
        print(f"unlabelled {source}: {count} people in {len(coco['images'])} frames (boxes: {boxes}, "
              f"refined by the teacher) -> {path}")
        entries.append({"annotations": str(path.resolve()), "images": str(img_dir.resolve())})
    write_atomic(manifest, json.dumps(entries, indent=1))
    write_atomic(stamp, json.dumps(want))
    return manifest


def source_frames(source: Path, frame_dir: Path, step: int):
    """(the folder the file names are under, an iterator of (file name, RGB image)) of one source."""
    kind = classify_source(source)
    if kind == "video":
        frame_dir.mkdir(parents=True, exist_ok=True)
        return frame_dir, _video_frames(source, frame_dir, step)
    if kind == "webcam" or not source.exists():
        raise UsageError(f"{FLAG} {source}: not a folder of images, an image or a video file")
    paths = list_images([source])
    root = source if kind == "dir" else source.parent
    return root, ((p.name, np.ascontiguousarray(read_image(p)[:, :, ::-1])) for p in paths)


def _video_frames(source: Path, frame_dir: Path, step: int):
    for frame in FrameReader(source, keep=lambda index: index % step == 0):
        name = f"{source.stem}_{frame.index:06d}.jpg"
        write_image(frame_dir / name, frame.bgr)
        yield name, np.ascontiguousarray(frame.bgr[:, :, ::-1])


def frame_boxes(table, name: str, image_size):
    """The boxes of one frame from a detection file (None: the predictor's detector finds them)."""
    if table is None:
        return None
    stem = Path(name).stem
    if table.keyed_by("image_id") and stem.isdigit():
        found = table.lookup("image_id", int(stem), image_size)
    elif table.keyed_by("file_name"):
        found = table.lookup("file_name", name, image_size)
    else:
        raise UsageError(f"--unlabeled-boxes {table.path}: its records give image_id, but {name!r} is not named "
                         f"by a COCO id; add 'file_name' to its records")
    keep = found.scores >= DEFAULT_SCORE_THRESHOLD
    return np.concatenate([found.boxes[keep], found.scores[keep, None]], axis=1)


def refined_instance(keypoints: np.ndarray, scores: np.ndarray, image_size) -> tuple[list, list] | None:
    """(box xywh, COCO keypoints) of one person from the teacher's prediction, or None when its
    confident keypoints are too few (not a person)."""
    sure = scores >= KEYPOINT_THRESHOLD
    if sure.sum() < max(2, int(np.ceil(MIN_KEYPOINT_FRACTION * len(scores)))):
        return None
    lo, hi = keypoints[sure].min(axis=0), keypoints[sure].max(axis=0)
    pad = BOX_PADDING * (hi - lo) + 2.0
    x0, y0 = np.maximum(lo - pad, 0)
    x1, y1 = np.minimum(hi + pad, np.asarray(image_size, np.float64) - 1)
    if x1 <= x0 or y1 <= y0:
        return None
    flat = []
    for (x, y), s in zip(keypoints, sure):
        flat += [round(float(x), 2), round(float(y), 2), 2] if s else [0, 0, 0]
    return [round(float(v), 2) for v in (x0, y0, x1 - x0, y1 - y0)], flat


def pseudo_coco(predictor, frames, table) -> dict:
    """A COCO keypoint file of the frames' people as the teacher sees them."""
    images, annotations = [], []
    for image_id, (name, rgb) in enumerate(frames, start=1):
        height, width = rgb.shape[:2]
        images.append({"id": image_id, "file_name": name, "width": width, "height": height})
        boxes = frame_boxes(table, name, (width, height))
        poses = predictor(rgb, boxes=boxes) if boxes is None or len(boxes) else None
        if poses is None:
            continue
        for keypoints, scores in zip(poses.keypoints, poses.keypoint_scores):
            found = refined_instance(np.asarray(keypoints, np.float64), np.asarray(scores), (width, height))
            if found is None:
                continue
            box, flat = found
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": 1, "iscrowd": 0,
                                "bbox": box, "area": box[2] * box[3], "keypoints": flat,
                                "num_keypoints": sum(1 for v in flat[2::3] if v)})
    names = list(predictor.skeleton.keypoint_names) if getattr(predictor, "skeleton", None) else []
    category = {"id": 1, "name": "person", "supercategory": "person", "keypoints": names, "skeleton": []}
    return {"images": images, "annotations": annotations, "categories": [category]}


__all__ = ["prepare_unlabelled", "pseudo_coco", "refined_instance", "source_frames"]
