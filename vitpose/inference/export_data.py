"""The COCO keypoint sets the export's gates run on, found one way for every flag that names one.

- `coco_set(source, flag)`: (annotation file, image folder) of a set named as a folder (MMPose's
  layout, or one COCO JSON beside its images) or as its .json file, or given as that pair. A path
  that is not there, or a folder that holds no single COCO file, is one `GateDataError` naming the
  flag and the path. `--gate-data` (the crops of the numeric gate, the held-out set of the int8 AP
  gate) and `--calibration` (int8 static, `vitpose.inference.quantize.calibration_crops`) both go
  through it.
- `validation_set(cfg, where)`: a training config's validation set, the int8 gate's default (the
  config given with `--config`, else the one the model file records).
- `gate_crops(data, input_size, count)`: real crops for the numeric gate, the validation pipeline's.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from vitpose.inference.export_errors import GateDataError

__all__ = ["coco_set", "existing_path", "gate_crops", "validation_set"]

MMPOSE_VAL_ANN = Path("annotations") / "person_keypoints_val2017.json"
COCO_HINT = ("a COCO keypoint folder (annotations/person_keypoints_val2017.json + val2017/, or one COCO JSON beside "
             "its images) or its JSON file")


def existing_path(source, flag: str = "--gate-data") -> Path:
    """`source` as a Path that is there; else one GateDataError naming the flag, the path and what to give."""
    source = Path(source)
    if not source.exists():
        role = flag.lstrip("-").replace("-", " ")  # "gate data", "calibration"
        kind = "file" if source.suffix.lower() == ".json" else "folder"
        also = ", or a folder of images" if flag == "--calibration" else ""
        raise GateDataError(f"{flag}: {role} {kind} not found: {source} (give {COCO_HINT}{also})")
    return source


def coco_set(source, flag: str = "--gate-data") -> tuple[Path, Path]:
    """(annotation file, image folder) of a COCO keypoint set named as a .json file (its images
    beside it, or MMPose's `annotations/person_keypoints_<split>.json` -> `<split>/`) or a folder
    (MMPose's layout, or one COCO JSON beside its images), or given as that pair (a config's
    validation set). `flag`: the flag the user named it with, for the one-line error."""
    if isinstance(source, tuple):
        return Path(source[0]), Path(source[1])
    source = existing_path(source, flag)
    if source.is_file():
        if source.suffix.lower() != ".json":
            raise GateDataError(f"{flag} {source}: not a COCO keypoint JSON file; give {COCO_HINT}")
        return source, _coco_images_folder(source)
    if (source / MMPOSE_VAL_ANN).is_file():
        return source / MMPOSE_VAL_ANN, source / "val2017"
    # A COCO annotation file is a JSON object; detection results beside it (coco-mini's) are a list.
    objects = [p for p in sorted(source.glob("*.json")) if _first_char(p) == "{"]
    if len(objects) == 1:
        return objects[0], source
    raise GateDataError(
        f"{flag} {source}: expected {MMPOSE_VAL_ANN.as_posix()} (+ val2017/) or one COCO annotation JSON beside its "
        f"images; found {len(objects)} JSON objects: {[p.name for p in objects]}")


def _coco_images_folder(ann_file: Path) -> Path:
    """Where the images of a COCO file named on its own lie: beside it, or MMPose's layout
    (annotations/person_keypoints_<split>.json -> <split>/)."""
    if ann_file.parent.name == "annotations":
        split = ann_file.stem.split("_")[-1]
        if (ann_file.parent.parent / split).is_dir():
            return ann_file.parent.parent / split
    return ann_file.parent


def _first_char(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read(4096).lstrip()[:1].decode("ascii", errors="replace")


def validation_set(cfg, where: str) -> tuple[Path, Path]:
    """(annotation file, image folder) of a training config's validation set: `data.root` /
    `data.val_ann` and `data.val_images`, as training reads them (the demo's synthetic set too,
    which its first training run wrote there). `where`: the config's name in the error, e.g.
    "--config demo" or "best.pth (the training config it records)"."""
    root = Path(cfg.data.root)
    ann_file, img_dir = root / cfg.data.val_ann, root / cfg.data.val_images
    if not ann_file.is_file():
        raise GateDataError(f"{where}: its validation annotations {ann_file} do not exist; give the held-out set "
                            f"with --gate-data")
    return ann_file, img_dir


def _crops_from(ann_file: Path, img_dir: Path, input_size, count: int, source: str):
    from vitpose.data.coco import CocoKeypoints

    dataset = CocoKeypoints(ann_file, img_dir, train=False, input_size=input_size,
                            heatmap_size=(input_size[0] // 4, input_size[1] // 4))
    if len(dataset) == 0:
        raise GateDataError(f"--gate-data {source}: no person instances with keypoints in {ann_file}")
    samples = [dataset[i] for i in range(min(count, len(dataset)))]
    crops = torch.stack([s["image"] for s in samples])
    labels = [f"image {s['image_id']} instance {s['id']}" for s in samples]
    return crops, labels


def gate_crops(data: str | Path | tuple | None = None, input_size: Sequence[int] = (192, 256), count: int = 8):
    """Real crops for the gate: (uint8 RGB crops (N, 3, h, w), one label per crop, source name).

    The validation pipeline (`CocoKeypoints(train=False)`: GT boxes, padding 1.25, UDP warp) on
    `data`, a COCO keypoint set (`coco_set`: MMPose's layout, a folder with one COCO JSON beside its
    images such as coco-mini, a .json file, or an (annotation file, image folder) pair); None: 6
    images of the synthetic set (`make_coco`, seed 0) in a temporary folder. At most `count` crops.
    """
    input_size = (int(input_size[0]), int(input_size[1]))
    if data is not None:
        ann_file, img_dir = coco_set(data, "--gate-data")
        source = str(data[0] if isinstance(data, tuple) else data)
        crops, labels = _crops_from(ann_file, img_dir, input_size, count, source)
        return crops, labels, source
    from vitpose.data.synthetic import make_coco

    with tempfile.TemporaryDirectory(prefix="vitpose-gate-") as tmp:
        synthetic = make_coco(tmp, num_images=6, seed=0, split="val")
        crops, labels = _crops_from(synthetic.ann_file, synthetic.img_dir, input_size, count, "synthetic set")
    return crops, labels, "the synthetic set (make_coco seed 0)"
