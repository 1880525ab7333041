"""Annotation tools in and out: Label Studio and CVAT exports -> a COCO keypoint file, and
predictions -> pre-annotations those tools import for correction.

In (`vitpose import-annotations`):

- `read_labelstudio(path, skeleton=None)`: Label Studio's JSON export of a keypoint project
  (docs/annotations.md §2): `keypointlabels` results, x/y in percent of `original_width` /
  `original_height`, grouped into people by their `rectanglelabels` region (`parentID`, else the
  rectangle that contains the point).
- `read_cvat(path, skeleton=None, label=None)`: CVAT's XML ("CVAT for images 1.1" with
  `<skeleton>` shapes, and the `<track>` skeletons of "CVAT for video 1.1"), docs/annotations.md §3.
- both return a `Draft`; `to_coco(draft)` makes the COCO keypoint file: `categories[0]` names the
  keypoints and the limbs (1-based, as COCO), so `vitpose.data.dataset_info(path)` reads the
  skeleton from it. Visibility: occluded -> 1, outside or absent -> 0 (with x = y = 0), else 2.

Out (`vitpose predict --format labelstudio|cvat`): `to_labelstudio_tasks(records, ...)` and
`to_cvat_xml(records, ...)` take COCO-style prediction records (`file_name`, `width`, `height`,
`keypoints` flat x, y, score, `bbox` [x, y, w, h], `score`, and a calibrated model's `p` and
`visibility`) and mark the keypoints below a threshold instead of dropping them (docs/annotations.md
§4; by `p` where the records carry it, `MARK_BY`). The calibrated fields go out as each tool marks
a point's state (Label Studio: the per-region occlusion choice, `meta.p`; CVAT: `occluded` /
`outside`, the `p_permille` attribute) and come back from the readers (`DraftPerson.p`, the COCO
file's `p`; docs/calibration.md §5.2, §5.3).

A malformed export raises `AnnotationFormatError`: one line naming the file, the task or image
and the field. That includes what a tool's UI cannot make but an edited or API-made export can hold:
a keypoint outside its image, an image size no camera makes, one image in two tasks / `<image>`
elements, an image URL without a file name, and a file of the other tool (docs/annotations.md §1).

`vitpose.data.annotation_draft` holds the Draft and `to_coco`, `vitpose.data.labelstudio` and
`vitpose.data.cvat` each tool's reader and writer; every name is importable from here too.
"""

from __future__ import annotations

__all__ = ["AnnotationFormatError", "Draft", "DraftImage", "DraftPerson", "FORMATS", "read_export",
           "read_labelstudio", "read_cvat", "to_coco", "to_labelstudio_tasks", "to_cvat_xml",
           "labelstudio_file_name", "labelstudio_image_url", "DEFAULT_MARK_BELOW", "MARK_BY", "CVAT_DECIMALS", "EDGE_TOLERANCE_PX",
           "MAX_IMAGE_SIDE", "OCCLUDED_WORD"]

from .annotation_draft import (
    DEFAULT_MARK_BELOW,
    EDGE_TOLERANCE_PX,
    MARK_BY,
    MAX_IMAGE_SIDE,
    AnnotationFormatError,
    Draft,
    DraftImage,
    DraftPerson,
    to_coco,
)
from .cvat import CVAT_DECIMALS, read_cvat, to_cvat_xml
from .labelstudio import (
    OCCLUDED_WORD,
    labelstudio_file_name,
    labelstudio_image_url,
    read_labelstudio,
    to_labelstudio_tasks,
)

FORMATS = ("labelstudio", "cvat")


def read_export(path, fmt: str, skeleton=None, label: str | None = None) -> Draft:
    """The draft of an export file in `fmt` ("labelstudio" or "cvat")."""
    if fmt == "labelstudio":
        return read_labelstudio(path, skeleton)
    if fmt == "cvat":
        return read_cvat(path, skeleton, label)
    raise AnnotationFormatError(f"unknown annotation format {fmt!r}; one of {', '.join(FORMATS)}", field="--format")
