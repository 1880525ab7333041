"""What `vitpose predict --json` writes for one image, for every caller that must write the same.

`image_records(poses, file_name, image_id, image_size)` is the records of one image (COCO keypoint
results, `coco_records`), with the image's width and height added when a pre-annotation format
needs them; `render_records(records, fmt, skeleton, mark_below, mark_by)` turns records into the
text of `--format labelstudio | cvat` (`vitpose.data.annotation_formats`' writers; `mark_by`: what
the threshold compares, the calibrated `p` where the records carry it by default). `vitpose predict` and
`vitpose serve` both call these two, so the server's answer for an image and the command's file for
it cannot drift apart.
"""

from __future__ import annotations

import json
import math

from vitpose.errors import UsageError, UserError
from vitpose.inference.pipeline import coco_records

__all__ = ["FORMATS", "MarkingError", "image_records", "labelstudio_tasks", "parse_marking",
           "render_records", "rescored"]

FORMATS = ("coco", "labelstudio", "cvat")


class MarkingError(UsageError):
    """A request's `mark_below` / `mark_below_by` that is not one (the server answers 400)."""

    http_status = 400


def parse_marking(mark_below, mark_by) -> tuple[float, str]:
    """A request's (or a form's) threshold and what it compares, checked: (float, one of
    `vitpose.data.annotation_draft.MARK_BY`)."""
    from vitpose.data.annotation_draft import MARK_BY

    try:
        mark_below = float(mark_below)
    except (TypeError, ValueError):
        raise MarkingError(f"mark_below must be a number, got {mark_below!r}") from None
    if not math.isfinite(mark_below):  # NaN marks nothing and infinity everything, silently
        raise MarkingError(f"mark_below (--mark-below) must be a finite number, got {mark_below}")
    if mark_by not in MARK_BY:
        raise MarkingError(f"mark_below_by must be one of {', '.join(MARK_BY)}, got {mark_by!r}")
    return mark_below, mark_by


def image_records(poses, file_name: str, image_id: int, image_size=None, rescore: str = "none") -> tuple[list[dict], int]:
    """The records of one image's `Poses` -> (records, non-finite values written as null).

    image_size: (height, width) of the image (an image's `.shape[:2]`) to add as `width` and
    `height` (the pre-annotation formats place points in percent of the image); None: COCO only.
    rescore: "calibrated" scores each person from its calibrated p (`rescored`).
    """
    records, nonfinite = rescored(*coco_records(poses, image_id=image_id, file_name=file_name), rescore)
    if image_size is not None:
        height, width = int(image_size[0]), int(image_size[1])
        records = [{**r, "width": width, "height": height} for r in records]
    return records, nonfinite


def rescored(records: list[dict], nonfinite: int, mode: str = "none") -> tuple[list[dict], int]:
    """`coco_records`' answer with the instance scores of `--rescore` (`mode`: "none", as it is; "calibrated":
    `vitpose.evaluation.rescoring.rescored_records`, from the calibrated p)."""
    if mode == "none":
        return records, nonfinite
    from vitpose.evaluation.rescoring import rescored_records

    return rescored_records(records), nonfinite


def _check_keypoint_count(records: list[dict], skeleton, fmt: str) -> None:
    K = len(records[0]["keypoints"]) // 3 if records else skeleton.num_keypoints
    if K != skeleton.num_keypoints:
        raise UserError(f"--format {fmt}: the model predicts {K} keypoints but the skeleton {skeleton.name!r} "
                        f"names {skeleton.num_keypoints}; give the model's training config with --config")


def labelstudio_tasks(records: list[dict], skeleton, mark_below: float, mark_by: str = "auto", **names) -> list[dict]:
    """Label Studio tasks with predictions of the records (`names`: the labelling config's control
    and object names, `to_labelstudio_tasks`' keywords)."""
    from vitpose.data import annotation_formats

    _check_keypoint_count(records, skeleton, "labelstudio")
    return annotation_formats.to_labelstudio_tasks(records, skeleton.keypoint_names, mark_below=mark_below,
                                                   mark_by=mark_by, **names)


def render_records(records: list[dict], fmt: str, skeleton, mark_below: float, mark_by: str = "auto") -> str:
    """records (with width and height) -> the text of `--format labelstudio` (JSON tasks) or `cvat` (XML)."""
    from vitpose.data import annotation_formats

    if fmt == "labelstudio":
        return json.dumps(labelstudio_tasks(records, skeleton, mark_below, mark_by), indent=1)
    if fmt == "cvat":
        _check_keypoint_count(records, skeleton, fmt)
        return annotation_formats.to_cvat_xml(records, skeleton.keypoint_names, skeleton.skeleton,
                                              mark_below=mark_below, mark_by=mark_by)
    raise ValueError(f"format must be 'labelstudio' or 'cvat', got {fmt!r}")
