"""A small synthetic COCO keypoint set, written in MMPose's directory layout.

`synthetic_scene.py` draws each scene (what is drawn, and how left and right are told apart); this
module writes the scenes as a COCO keypoint set, with detections and a stamp on the folder.

Files
-----
``make_coco(root, num_images, seed, split)`` writes

- ``annotations/person_keypoints_{split}2017.json``: images, annotations (bbox = the figure's
  extent clipped to the image, area = bbox area -- COCO's is the segmentation area, about half of
  that, so OKS here is a little more lenient -- num_keypoints = count of v > 0) and the person
  category with COCO's keypoint names and 1-based skeleton;
- ``{split}2017/{image_id:012d}.jpg``;
- ``person_detection_results/{split}_detections.json``: COCO detection results made from the GT
  boxes (a few % jitter, scores that fall with truncation/occlusion, a few missed people) plus
  low-score false positives.

Other skeletons
---------------
``make_coco(..., dataset_info=info)`` labels the same people with another skeleton whose keypoints
are named like COCO's (any subset, in any order: e.g. a 5-point head/wrists/ankles skeleton):
the images and boxes are the COCO set's, the annotations hold just those keypoints, and
``categories[0]`` lists their names and the skeleton's limbs (1-based). Then a model of K != 17
can be trained and evaluated end to end on a CPU (configs/demo_k5.yaml).

Everything is a pure function of (seed, split, image index, arguments): the same call writes the
same bytes, and the first n images of a larger set are the n images of a smaller one.

A folder of the user's is never written over: `claim_synthetic_root(root)` (what `train.py` calls
before it writes the set a config asks for) accepts only a new or empty folder, which it stamps with
``synthetic.json`` before the first image, or a folder that carries that stamp. A `data.root` that
holds anything else (the user's own COCO-layout set, complete or not) is refused with one line and
nothing is written into it.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from vitpose.coco_meta import KEYPOINT_NAMES, NUM_KEYPOINTS, PERSON_CATEGORY_ID, SKELETON
from vitpose.data.errors import DataError
from vitpose.data.geometry import bbox_xyxy2xywh
from vitpose.data.synthetic_scene import PEOPLE_PER_IMAGE_P, K, SyntheticImage, synthesize_image
from vitpose.errors import UserError
from vitpose.files import write_atomic

__all__ = ["SyntheticCoco", "SyntheticImage", "image_rng", "make_coco", "synthesize_image"]

# Detections made from the ground truth (`_detections`): a few people missed, some false positives.
P_MISSED_DETECTION = 0.03
FALSE_POSITIVES_PER_IMAGE = 0.4  # mean of a Poisson count


@dataclass(frozen=True)
class SyntheticCoco:
    """Where `make_coco` wrote a split (the arguments CocoKeypoints and CocoEvaluator take)."""

    root: Path
    ann_file: Path
    img_dir: Path
    det_file: Path


# ---------------------------------------------------------------------------------------------
# Files


def image_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """The random stream of image `index` (`synthesize_image`, then its detections).

    One stream per (seed, split, image): splits differ for the same seed, and image i does not
    depend on how many images are made.
    """
    return np.random.default_rng([seed, zlib.crc32(split.encode()), index])


def _detections(rng: np.random.Generator, image_id: int, bboxes: np.ndarray, num_visible: np.ndarray,
                width: int, height: int, num_keypoints: int = NUM_KEYPOINTS) -> list[dict]:
    """Detector-like boxes for one image: jittered GT boxes and some low-score false positives.

    num_visible: each person's labelled keypoints, of num_keypoints."""
    dets = []
    for box, n in zip(bboxes, num_visible):
        x, y, w, h = box
        if w < 1 or h < 1 or rng.random() < P_MISSED_DETECTION:
            continue
        cx = x + w / 2 + rng.normal(0, 0.03) * w
        cy = y + h / 2 + rng.normal(0, 0.03) * h
        w, h = w * np.exp(rng.normal(0, 0.04)), h * np.exp(rng.normal(0, 0.04))
        score = rng.uniform(0.75, 1.0) * (0.55 + 0.45 * n / num_keypoints)
        dets.append(_det_record(image_id, cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, score, width, height))
    for _ in range(int(rng.poisson(FALSE_POSITIVES_PER_IMAGE))):
        w, h = rng.uniform(0.1, 0.4) * width, rng.uniform(0.2, 0.7) * height
        x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
        dets.append(_det_record(image_id, x, y, x + w, y + h, rng.uniform(0.02, 0.3), width, height))
    dets.sort(key=lambda d: -d["score"])
    return dets


def _det_record(image_id, x0, y0, x1, y1, score, width, height) -> dict:
    xyxy = np.clip(np.array([x0, y0, x1, y1], np.float64), 0, [width, height, width, height])
    return {"image_id": image_id, "category_id": PERSON_CATEGORY_ID,
            "bbox": [round(float(v), 2) for v in bbox_xyxy2xywh(xyxy)],
            "score": round(float(score), 4)}


def _person_category(names=KEYPOINT_NAMES, skeleton=SKELETON) -> dict:
    return {"supercategory": "person", "id": PERSON_CATEGORY_ID, "name": "person",
            "keypoints": list(names),
            "skeleton": [[a + 1, b + 1] for a, b in skeleton]}


# Keypoints COCO does not have, placed halfway between two COCO joints (a skeleton that shares
# some joints with COCO and adds new ones: the fine-tuning evidence, configs/demo_k7.yaml). A
# midpoint is labelled only where both ends are, with the lower of their visibilities.
# The forearms' midpoints make the 21-keypoint set of configs/demo_hand21.yaml (a K of MMPose's hand sets).
MIDPOINTS = {"neck": ("left_shoulder", "right_shoulder"), "mid_hip": ("left_hip", "right_hip"),
             "left_forearm": ("left_elbow", "left_wrist"), "right_forearm": ("right_elbow", "right_wrist")}


def keypoint_columns(dataset_info) -> list:
    """The COCO-17 column of each keypoint of a skeleton named with COCO's names (None: all 17);
    a pair of columns for a keypoint of MIDPOINTS."""
    if dataset_info is None:
        return list(range(NUM_KEYPOINTS))
    unknown = [n for n in dataset_info.keypoint_names if n not in K and n not in MIDPOINTS]
    if unknown:
        raise ValueError(f"make_coco draws COCO's people: the skeleton {dataset_info.name!r} names keypoints it "
                         f"cannot place ({', '.join(unknown)}); use names from {', '.join(KEYPOINT_NAMES)} "
                         f"or {', '.join(MIDPOINTS)}")
    return [K[n] if n in K else (K[MIDPOINTS[n][0]], K[MIDPOINTS[n][1]]) for n in dataset_info.keypoint_names]


def _skeleton_labels(keypoints: np.ndarray, columns: list) -> np.ndarray:
    """(P, len(columns), 3) COCO (x, y, v) labels of the columns from (P, 17, 3) ones."""
    if all(isinstance(c, int) for c in columns):
        return keypoints[:, columns]
    out = np.zeros((keypoints.shape[0], len(columns), 3), keypoints.dtype)
    for j, column in enumerate(columns):
        if isinstance(column, int):
            out[:, j] = keypoints[:, column]
            continue
        a, b = keypoints[:, column[0]], keypoints[:, column[1]]
        v = np.minimum(a[:, 2], b[:, 2])
        out[:, j, :2] = np.where(v[:, None] > 0, (a[:, :2] + b[:, :2]) / 2, 0.0)
        out[:, j, 2] = v
    return out


STAMP_NAME = "synthetic.json"  # marks a folder this project created for a synthetic set


class SyntheticRootError(DataError, UserError):
    """The synthetic set would be written into a folder this project did not create."""


def claim_synthetic_root(root, num_images: int | None = None) -> Path:
    """Make sure the synthetic set may be written into `root`; stamp a new or empty folder as ours.

    Raises SyntheticRootError (one line; nothing written) when `root` is a file, or a folder that
    holds files but no `STAMP_NAME`: that is the user's data, never to be overwritten.
    """
    root = Path(root)
    asked = f" (data.synthetic_train_images: {num_images})" if num_images is not None else ""
    if root.exists() and not root.is_dir():
        raise SyntheticRootError(f"data.root {root} is a file; the synthetic set{asked} needs a folder")
    if (root / STAMP_NAME).is_file():
        return root
    held = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    if held:
        shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
        raise SyntheticRootError(
            f"data.root {root} holds files this project did not write ({shown}; no {STAMP_NAME}), so the "
            f"synthetic set the config asks for{asked} is not written there and nothing was changed. To "
            f"train on your own data there, set data.synthetic_train_images: 0 and data.synthetic_val_images: 0; "
            f"for the synthetic set, point data.root at a new folder")
    root.mkdir(parents=True, exist_ok=True)
    write_atomic(root / STAMP_NAME, "{}")  # ours from now on, even if the writing is interrupted
    return root


def _write_json(path: Path, obj) -> None:
    write_atomic(path, json.dumps(obj, separators=(",", ":")))


def make_coco(root, num_images: int, seed: int, split: str = "train", image_size=(320, 240),
              max_people: int = 4, jpeg_quality: int = 90, dataset_info=None) -> SyntheticCoco:
    """Writes a synthetic COCO keypoint split under `root` in MMPose's layout; returns the paths.

    `image_size` is (width, height). Image ids run 1..num_images; file names are the id in 12
    digits. Same arguments -> same bytes.
    dataset_info: a `DatasetInfo` whose keypoints are named like COCO's (a subset, any order):
        the annotations hold those keypoints only (see "Other skeletons" above). None: COCO-17.
    """
    if num_images < 1:
        raise ValueError(f"make_coco: num_images must be >= 1, got {num_images}")
    if not 1 <= max_people <= len(PEOPLE_PER_IMAGE_P):
        raise ValueError(f"make_coco: max_people must be in 1..{len(PEOPLE_PER_IMAGE_P)}, got {max_people}")
    columns = keypoint_columns(dataset_info)
    width, height = (int(s) for s in image_size)
    if width < 32 or height < 32:
        raise ValueError(f"make_coco: image_size (width, height) must be at least 32x32, got {image_size}")

    root = Path(root)
    ann_dir, img_dir, det_dir = root / "annotations", root / f"{split}2017", root / "person_detection_results"
    for d in (ann_dir, img_dir, det_dir):
        d.mkdir(parents=True, exist_ok=True)

    images, annotations, detections = [], [], []
    for index in range(num_images):
        rng = image_rng(seed, split, index)
        sample = synthesize_image(rng, width, height, max_people)
        image_id = index + 1
        file_name = f"{image_id:012d}.jpg"
        ok, jpg = cv2.imencode(".jpg", sample.image, [cv2.IMWRITE_JPEG_QUALITY, int(jpeg_quality)])
        if not ok:
            raise RuntimeError(f"make_coco: JPEG encoding failed for {img_dir / file_name}")
        (img_dir / file_name).write_bytes(jpg.tobytes())
        images.append({"id": image_id, "file_name": file_name, "width": width, "height": height})

        labels = _skeleton_labels(sample.keypoints, columns)
        num_visible = (labels[:, :, 2] > 0).sum(1)
        for kp, box, n in zip(labels, sample.bboxes, num_visible):
            if box[2] < 1 or box[3] < 1:  # entirely outside the image: not a person in it
                continue
            flat = kp.copy()
            flat[:, :2] = np.round(flat[:, :2], 2)
            annotations.append({
                "id": len(annotations) + 1,
                "image_id": image_id,
                "category_id": PERSON_CATEGORY_ID,
                "bbox": [round(float(c), 2) for c in box],
                "area": round(float(box[2] * box[3]), 2),
                "iscrowd": 0,
                "num_keypoints": int(n),
                "keypoints": [int(c) if j % 3 == 2 else float(c) for j, c in enumerate(flat.reshape(-1))],
            })
        detections += _detections(rng, image_id, sample.bboxes, num_visible, width, height, len(columns))

    ann_file = ann_dir / f"person_keypoints_{split}2017.json"
    det_file = det_dir / f"{split}_detections.json"
    _write_json(ann_file, {
        "info": {"description": f"vitpose synthetic COCO keypoints ({split}, seed {seed})", "version": "1.0"},
        "licenses": [],
        "images": images,
        "annotations": annotations,
        "categories": [_person_category() if dataset_info is None else
                       _person_category(dataset_info.keypoint_names, dataset_info.skeleton)],
    })
    _write_json(det_file, detections)
    return SyntheticCoco(root=root, ann_file=ann_file, img_dir=img_dir, det_file=det_file)

