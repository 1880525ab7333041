"""Checks made before the first training step, so that a bad file stops the run in seconds.

The datasets already checked every record and box when they were built (`DataError` names the
file, record and field). What is left is the images: a corrupt validation image would otherwise
be found only at the first validation, hours in, and would crash every resume there again.
"""

from __future__ import annotations

import numpy as np

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
