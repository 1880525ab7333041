"""Checks made before the first training step, so that a bad file stops the run in seconds.

The datasets already checked every record and box when they were built (`DataError` names the
file, record and field). What is left is the images: a corrupt validation image would otherwise
be found only at the first validation, hours in, and would crash every resume there again.
"""

from __future__ import annotations

import numpy as np

from vitpose.builders import build_dataset_info
from vitpose.config import Config
from vitpose.data import check as C
from vitpose.data.metainfo import DatasetInfo

SAMPLE_IMAGES = 64  # "sample": this many distinct images, spread evenly over the set


def describe_dataset(name: str, dataset) -> str:
    """One line: instances, and the records dropped by the filters, by reason."""
    dropped = getattr(dataset, "dropped", None) or {}
    detail = ", ".join(f"{reason} {count}" for reason, count in dropped.items()) or "none"
    return f"{name} set: {len(dataset)} instances from {dataset.ann_file} (records dropped: {detail})"


def check_val_images(dataset, mode: str = "sample") -> int:
    """Decode the validation images ("sample": a spread of SAMPLE_IMAGES, "all", "off").

    Raises DataError (file, record, field) on the first unreadable or wrongly sized image;
    returns how many images were checked.
    """
    if mode == "off" or len(dataset) == 0:
        return 0
    first_instance = {}
    for i in range(len(dataset)):
        first_instance.setdefault(str(dataset.image_path(i)), i)
    instances = list(first_instance.values())
    if mode == "sample" and len(instances) > SAMPLE_IMAGES:
        instances = [instances[j] for j in np.linspace(0, len(instances) - 1, SAMPLE_IMAGES).round().astype(int)]
    for i in instances:
        dataset.read_image(i)  # DataError naming the file and the record if it cannot be decoded
    return len(instances)


FAST_IMAGES = 16  # training images decoded by the training preflight


def check_datasets(info: DatasetInfo, model_keypoints: int, train_set=None, val_set=None,
                   images: str = "sample", image_limit: int = C.SAMPLE_IMAGES) -> C.CheckReport:
    """Every check on the sets given (either may be None); see vitpose/data/check.py."""
    report = C.CheckReport()
    file_k = (train_set or val_set).index.num_keypoints if (train_set or val_set) is not None else None
    report.add(*C.check_skeleton(info, model_keypoints, file_k))
    for name, dataset in (("train", train_set), ("val", val_set)):
        if dataset is None:
            continue
        report.add(C.Finding(f"{name} set", C.OK, f"{len(dataset)} instances, {len(dataset.index.image_ids)} images "
                                                  f"from {dataset.bbox_file or dataset.ann_file}; dropped "
                                                  f"{dataset.dropped or 'none'}"))
        findings, table = C.check_keypoints(dataset, info, name)
        report.add(*findings)
        if dataset.index.has_keypoints:
            finding, histogram = C.box_size_histogram(dataset, name)
            report.add(finding)
            report.blocks += [table, histogram]
        report.add(*C.check_targets(dataset))
        report.add(*C.check_images(dataset, images, name, limit=image_limit))
    return report


def preflight(cfg: Config, train_set) -> C.CheckReport:
    """The fast checks `vitpose train` runs before the first step (the training set only, FAST_IMAGES
    images). The caller prints `report.format()` and calls `report.raise_on_error()`."""
    info = getattr(train_set, "dataset_info", None) or build_dataset_info(cfg)
    return check_datasets(info, cfg.model.num_keypoints, train_set=train_set, image_limit=FAST_IMAGES)
