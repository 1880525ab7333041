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
`keypoints` flat x, y, score, `bbox` [x, y, w, h], `score`) and mark the keypoints whose score is
below a threshold instead of dropping them (docs/annotations.md §4).

A malformed export raises `AnnotationFormatError`: one line naming the file, the task or image
and the field.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse
from xml.sax.saxutils import quoteattr

from ..errors import UserError
from .errors import DataError
from .metainfo import DatasetInfo, dataset_info

__all__ = ["AnnotationFormatError", "Draft", "DraftImage", "DraftPerson", "FORMATS", "read_export",
           "read_labelstudio", "read_cvat", "to_coco", "to_labelstudio_tasks", "to_cvat_xml",
           "DEFAULT_MARK_BELOW"]

FORMATS = ("labelstudio", "cvat")
DEFAULT_MARK_BELOW = 0.3  # keypoint scores below this are marked for the annotator's attention
OCCLUDED_WORD = "occluded"  # a per-region Label Studio choice containing it marks the point occluded
CVAT_DECIMALS = 2  # CVAT writes coordinates with "{:.2f}" (docs/annotations.md §3)


class AnnotationFormatError(DataError, UserError):
    """An export that cannot be read as it is; the message names the task or image and the field."""


# ---------------------------------------------------------------------------- the draft


@dataclass
class DraftPerson:
    """One labelled person: keypoint name -> (x, y, v) in pixels, and the box when the tool has one."""

    keypoints: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    bbox: list[float] | None = None  # [x, y, w, h]
    where: str = ""  # the task / image / region, for messages


@dataclass
class DraftImage:
    file_name: str
    width: int
    height: int
    people: list[DraftPerson] = field(default_factory=list)


@dataclass
class Draft:
    """What an export holds, before it is laid out in a skeleton's keypoint order."""

    source: str
    tool: str
    images: list[DraftImage] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # keypoint names in the tool's order
    limbs: list[tuple[str, str]] = field(default_factory=list)
    category: str = "person"
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count (tasks, images, people)

    def skip(self, reason: str, count: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + count

    def add_name(self, name: str) -> None:
        if name not in self.names:
            self.names.append(name)


def read_export(path, fmt: str, skeleton=None, label: str | None = None) -> Draft:
    """The draft of an export file in `fmt` ("labelstudio" or "cvat")."""
    if fmt == "labelstudio":
        return read_labelstudio(path, skeleton)
    if fmt == "cvat":
        return read_cvat(path, skeleton, label)
    raise AnnotationFormatError(f"unknown annotation format {fmt!r}; one of {', '.join(FORMATS)}", field="--format")


def _number(value, fail, what: str) -> float:
    """A finite number from a JSON or XML value, else `fail(message, field)`."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number):
        fail(f"must be a finite number, got {value!r}", what)
    return number


# ---------------------------------------------------------------------------- Label Studio in


def _load_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AnnotationFormatError("export file not found", file=path) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AnnotationFormatError(f"not readable JSON ({e}); export the project as Label Studio 'JSON'",
                                    file=path) from None


def labelstudio_file_name(url: str) -> str:
    """The image's file name in a task's data URL (docs/annotations.md §2.3): the `d` parameter of
    a local-storage URL (`/data/local-files/?d=dir/a.jpg` -> dir/a.jpg), else the URL's last path
    part (`/data/upload/3/5e3b2f1a-a.jpg` -> 5e3b2f1a-a.jpg, the name Label Studio stored)."""
    parsed = urlparse(url)
    local = parse_qs(parsed.query).get("d")
    if local:
        return local[0]
    return unquote(Path(parsed.path).name)


def read_labelstudio(path, skeleton=None) -> Draft:
    """A Label Studio JSON export (a list of tasks) -> Draft (docs/annotations.md §2)."""
    path = Path(path)
    tasks = _load_json(path)
    if isinstance(tasks, dict):
        tasks = [tasks]
    if not isinstance(tasks, list):
        raise AnnotationFormatError("a Label Studio JSON export is a list of tasks", file=path)
    draft = Draft(source=str(path), tool="Label Studio")
    for t, task in enumerate(tasks):
        where = f"task {task.get('id', f'[{t}]')}" if isinstance(task, dict) else f"task [{t}]"

        def fail(message, field_name, where=where):
            raise AnnotationFormatError(message, file=path, record=where, field=field_name)

        if not isinstance(task, dict):
            fail(f"must be an object, got {type(task).__name__}", "task")
        annotations = task.get("annotations") or []
        if not isinstance(annotations, list):
            fail("must be a list", "annotations")
        done = [a for a in annotations if isinstance(a, dict) and not a.get("was_cancelled")]
        if not done:
            draft.skip("tasks without an annotation (not labelled yet)")
            continue
        if len(done) > 1:
            draft.skip("tasks with several annotations (the last one was used)")
        image_url = _labelstudio_image_url(task, fail)
        result = done[-1].get("result")
        if not isinstance(result, list):
            fail("must be a list of regions", "annotations[-1].result")
        image = _labelstudio_image(result, labelstudio_file_name(image_url), draft, fail)
        if image is not None:
            draft.images.append(image)
    if not draft.images:
        raise AnnotationFormatError(f"no labelled task among {len(tasks)} ({draft.skipped or 'none skipped'}); "
                                    "export the project as 'JSON' (not JSON-MIN) after annotating", file=path,
                                    field="annotations")
    return _apply_skeleton(draft, skeleton)


def _labelstudio_image_url(task: dict, fail) -> str:
    data = task.get("data")
    if not isinstance(data, dict):
        fail("missing or not an object", "data")
    urls = [v for v in data.values() if isinstance(v, str)]
    url = data.get("image", data.get("img"))
    if not isinstance(url, str):
        if len(urls) != 1:
            fail(f"no image URL: expected data.image (or one string field), got keys {sorted(data)}", "data.image")
        url = urls[0]
    return url


def _labelstudio_size(result: list, fail) -> tuple[int, int] | None:
    sizes = set()
    for r, region in enumerate(result):
        if isinstance(region, dict) and region.get("type") in ("keypointlabels", "rectanglelabels"):
            w = _number(region.get("original_width"), fail, f"result[{r}].original_width")
            h = _number(region.get("original_height"), fail, f"result[{r}].original_height")
            if w <= 0 or h <= 0 or w != int(w) or h != int(h):
                fail(f"image size must be positive whole pixels, got {w} x {h}", f"result[{r}].original_width")
            sizes.add((int(w), int(h)))
    if len(sizes) > 1:
        fail(f"regions disagree on the image size: {sorted(sizes)}", "result[].original_width")
    return sizes.pop() if sizes else None


def _labelstudio_image(result: list, file_name: str, draft: Draft, fail) -> DraftImage | None:
    """One task's regions -> DraftImage: rectangles are people, keypoints join their rectangle."""
    size = _labelstudio_size(result, fail)
    if size is None:
        draft.skip("tasks with no keypoint or rectangle region")
        return None
    width, height = size
    occluded = {region.get("id") for region in result if isinstance(region, dict)
                and region.get("type") == "choices" and any(
                    OCCLUDED_WORD in str(c).lower() for c in (region.get("value") or {}).get("choices") or [])}
    boxes, points = {}, []
    for r, region in enumerate(result):
        if not isinstance(region, dict):
            fail(f"must be an object, got {type(region).__name__}", f"result[{r}]")
        kind, value = region.get("type"), region.get("value")
        if kind not in ("rectanglelabels", "keypointlabels"):
            continue  # choices, relations, text areas: not geometry
        if not isinstance(value, dict):
            fail("missing or not an object", f"result[{r}].value")
        x = _number(value.get("x"), fail, f"result[{r}].value.x") / 100 * width
        y = _number(value.get("y"), fail, f"result[{r}].value.y") / 100 * height
        if kind == "rectanglelabels":
            if _number(value.get("rotation", 0), fail, f"result[{r}].value.rotation") != 0:
                fail("a rotated rectangle cannot be a COCO box; draw it unrotated", f"result[{r}].value.rotation")
            w = _number(value.get("width"), fail, f"result[{r}].value.width") / 100 * width
            h = _number(value.get("height"), fail, f"result[{r}].value.height") / 100 * height
            boxes[region.get("id", f"[{r}]")] = DraftPerson(bbox=[x, y, w, h], where=f"rectangle {region.get('id')}")
            continue
        labels = value.get("keypointlabels")
        if not isinstance(labels, list) or len(labels) != 1 or not isinstance(labels[0], str):
            fail(f"must name exactly one keypoint, got {labels!r}", f"result[{r}].value.keypointlabels")
        v = 1 if region.get("id") in occluded else 2
        points.append((r, region, labels[0], (x, y, v)))
    people = _labelstudio_group(boxes, points, fail)
    for person in people:
        for name in person.keypoints:
            draft.add_name(name)
    return DraftImage(file_name, width, height, people)


def _labelstudio_group(boxes: dict, points: list, fail) -> list[DraftPerson]:
    """Each keypoint joins the rectangle its `parentID` names, else the smallest rectangle that
    contains it and has no keypoint of that name yet (docs/annotations.md §2.2). A task without
    rectangles is one person, as in Label Studio's own COCO export."""
    if not boxes:
        boxes = {None: DraftPerson(where="the task's keypoints (no rectangle)")}
    by_size = sorted(boxes.items(), key=lambda item: 0 if item[1].bbox is None else item[1].bbox[2] * item[1].bbox[3])
    for r, region, name, xyv in points:
        parent = region.get("parentID")
        if parent:
            if parent not in boxes:
                fail(f"parentID {parent!r} names no rectangle of this task", f"result[{r}].parentID")
            person = boxes[parent]
            if name in person.keypoints:
                fail(f"{person.where} has two {name!r} keypoints", f"result[{r}].value.keypointlabels")
        else:
            candidates = [p for _, p in by_size if (p.bbox is None or _inside(xyv, p.bbox))
                          and name not in p.keypoints]
            if not candidates and None in boxes:
                fail(f"two {name!r} keypoints and no rectangle: draw one rectangle per person", f"result[{r}]")
            if not candidates:
                fail(f"keypoint {name!r} at ({xyv[0]:.1f}, {xyv[1]:.1f}) px lies in no rectangle that lacks a "
                     f"{name!r}: draw the person's rectangle around it (or set parentID)", f"result[{r}]")
            person = candidates[0]
        person.keypoints[name] = xyv
    return list(boxes.values())


def _inside(xyv, bbox) -> bool:
    x, y, w, h = bbox
    return x <= xyv[0] <= x + w and y <= xyv[1] <= y + h


# ---------------------------------------------------------------------------- CVAT in


def read_cvat(path, skeleton=None, label: str | None = None) -> Draft:
    """A CVAT XML export (CVAT for images / video 1.1) -> Draft (docs/annotations.md §3)."""
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except FileNotFoundError:
        raise AnnotationFormatError("export file not found", file=path) from None
    except (OSError, ET.ParseError) as e:
        raise AnnotationFormatError(f"not readable XML ({e}); export the task as 'CVAT for images 1.1'",
                                    file=path) from None
    if root.tag != "annotations":
        raise AnnotationFormatError(f"the root element is <{root.tag}>, not <annotations> of a CVAT XML export",
                                    file=path, field="annotations")
    meta = _cvat_meta_labels(root, path)
    label = _cvat_pick_label(root, meta, label, path)
    draft = Draft(source=str(path), tool="CVAT", category=label)
    draft.names = [name for name, info in meta.items() if info["parent"] == label]
    draft.limbs = _cvat_limbs(meta.get(label, {}).get("svg") or "", path, label)
    frames = {}
    for image in root.iter("image"):
        item = _cvat_image(image, path)
        frames[image.get("id")] = item
        draft.images.append(item)
        for k, shape in enumerate(image.findall("skeleton")):
            if shape.get("label") == label:
                boxes = [b for b in image.findall("box") if b.get("group_id") not in (None, "0")]
                _cvat_person(shape, item, draft, f"image {item.file_name!r} skeleton [{k}]", path, boxes)
    for track in root.iter("track"):
        if track.get("label") != label:
            continue
        for shape in track.findall("skeleton"):
            item = _cvat_frame(shape.get("frame"), frames, root, draft, path, track.get("id"))
            _cvat_person(shape, item, draft, f"track {track.get('id')} frame {shape.get('frame')}", path, [])
    return _apply_skeleton(draft, skeleton)


def _cvat_meta_labels(root, path: Path) -> dict:
    """name -> {"type", "parent", "svg"} of the labels in <meta> (a task's or a project's)."""
    labels = {}
    meta = root.find("meta")
    for node in (meta.iter("label") if meta is not None else ()):
        name = (node.findtext("name") or "").strip()
        if name:
            labels[name] = {"type": (node.findtext("type") or "").strip(),
                            "parent": (node.findtext("parent") or "").strip() or None, "svg": node.findtext("svg")}
    return labels


def _cvat_pick_label(root, meta: dict, label: str | None, path: Path) -> str:
    used = sorted({s.get("label") for s in root.iter("skeleton") if s.get("label")} |
                  {t.get("label") for t in root.iter("track") if t.find("skeleton") is not None})
    known = sorted(set(used) | {n for n, info in meta.items() if info["type"] == "skeleton"})
    if label is not None:
        if label not in known:
            raise AnnotationFormatError(f"no skeleton label {label!r}; the file has {known or 'none'}",
                                        file=path, field="--label")
        return label
    if len(known) != 1:
        raise AnnotationFormatError(f"{'no skeleton labels' if not known else f'several skeleton labels {known}'}: "
                                    "annotate with a CVAT skeleton and choose one with --label NAME",
                                    file=path, field="skeleton")
    return known[0]


_SVG_TAG = re.compile(r"<(line|circle)\b([^>]*)>")
_SVG_ATTR = re.compile(r'([\w-]+)="([^"]*)"')


def _cvat_limbs(svg: str, path: Path, label: str) -> list[tuple[str, str]]:
    """The edges of a skeleton label's SVG template: `<line data-node-from data-node-to>` between
    `<circle data-node-id data-label-name>` (docs/annotations.md §3.1)."""
    nodes, edges = {}, []
    for tag, attrs in _SVG_TAG.findall(svg):
        a = dict(_SVG_ATTR.findall(attrs))
        if tag == "circle" and "data-node-id" in a:
            nodes[a["data-node-id"]] = a.get("data-label-name", "")
        elif tag == "line" and a.get("data-type", "edge") == "edge" and "data-node-from" in a:
            edges.append((a["data-node-from"], a.get("data-node-to")))
    limbs = []
    for a, b in edges:
        if a not in nodes or b not in nodes:
            raise AnnotationFormatError(f"skeleton {label!r}: an edge joins node {a} and {b}, but the template has "
                                        f"nodes {sorted(nodes)}", file=path, field="meta.labels.label.svg")
        limbs.append((nodes[a], nodes[b]))
    return limbs


def _cvat_int(element, key: str, path: Path, where: str) -> int:
    value = element.get(key)
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise AnnotationFormatError(f"must be a whole number, got {value!r}", file=path, record=where,
                                    field=key) from None
    if number <= 0 and key in ("width", "height"):
        raise AnnotationFormatError(f"must be positive, got {number}", file=path, record=where, field=key)
    return number


def _cvat_image(image, path: Path) -> DraftImage:
    name = image.get("name")
    where = f"image id {image.get('id')}"
    if not name:
        raise AnnotationFormatError("missing", file=path, record=where, field="name")
    return DraftImage(name, _cvat_int(image, "width", path, where), _cvat_int(image, "height", path, where))


def _cvat_frame(frame, frames: dict, root, draft: Draft, path: Path, track) -> DraftImage:
    """The image of a track's frame: the <image> of that id, else frame_NNNNNN.png of the
    video export's layout with <original_size> (docs/annotations.md §3.2)."""
    where = f"track {track}"
    if frame is None or not str(frame).isdigit():
        raise AnnotationFormatError(f"must be a frame number, got {frame!r}", file=path, record=where, field="frame")
    if frame in frames:
        return frames[frame]
    size = root.find("meta/task/original_size")
    if size is None:
        size = root.find("meta/project/original_size")
    if size is None:
        raise AnnotationFormatError(f"frame {frame} has no <image id={frame!r}> and <meta> has no <original_size>",
                                    file=path, record=where, field="original_size")
    item = DraftImage(f"frame_{int(frame):06d}.png", _cvat_int(_Attrs(size), "width", path, "original_size"),
                      _cvat_int(_Attrs(size), "height", path, "original_size"))
    frames[frame] = item
    draft.images.append(item)
    return item


class _Attrs:
    """<original_size><width>W</width>...: child texts read like attributes."""

    def __init__(self, node):
        self.node = node

    def get(self, key):
        return self.node.findtext(key)


def _cvat_person(shape, item: DraftImage, draft: Draft, where: str, path: Path, boxes) -> None:
    person = DraftPerson(where=where)
    for element in shape.findall("points"):
        name = element.get("label")
        if not name:
            raise AnnotationFormatError("a skeleton point has no label", file=path, record=where, field="points.label")
        if name in person.keypoints:
            raise AnnotationFormatError(f"two {name!r} points", file=path, record=where, field="points.label")
        draft.add_name(name)
        if element.get("outside", "0") not in ("0", "1") or element.get("occluded", "0") not in ("0", "1"):
            raise AnnotationFormatError(f"point {name!r}: outside / occluded must be 0 or 1", file=path,
                                        record=where, field="outside")
        if element.get("outside", "0") == "1":
            person.keypoints[name] = (0.0, 0.0, 0)
            continue
        pairs = (element.get("points") or "").split(";")
        xy = pairs[0].split(",") if len(pairs) == 1 else []

        def fail(message, field_name, name=name):
            raise AnnotationFormatError(f"point {name!r}: {message}", file=path, record=where, field=field_name)

        if len(xy) != 2:
            fail(f"must be 'x,y', got {element.get('points')!r}", "points")
        x, y = (_number(v, fail, "points") for v in xy)
        person.keypoints[name] = (x, y, 1 if element.get("occluded", "0") == "1" else 2)
    if not any(v > 0 for _, _, v in person.keypoints.values()):
        draft.skip("skeletons with every point outside")
        return
    group = shape.get("group_id")
    for box in boxes:
        if box.get("group_id") == group:
            x1, y1, x2, y2 = (_number(box.get(k), lambda m, f: _box_fail(path, where, m, f), k)
                              for k in ("xtl", "ytl", "xbr", "ybr"))
            person.bbox = [x1, y1, x2 - x1, y2 - y1]
    item.people.append(person)


def _box_fail(path, where, message, field_name):
    raise AnnotationFormatError(f"the skeleton's box: {message}", file=path, record=where, field=field_name)


# ---------------------------------------------------------------------------- the skeleton


def _apply_skeleton(draft: Draft, skeleton) -> Draft:
    """With a skeleton (a built-in name, a skeleton YAML, a COCO file or a DatasetInfo): its names
    and limbs replace the tool's, and every name the export uses must be one of them."""
    if skeleton is None:
        if not draft.names:
            raise AnnotationFormatError("the export has no keypoints", file=draft.source)
        return draft
    info = skeleton if isinstance(skeleton, DatasetInfo) else dataset_info(skeleton)
    used = {name for image in draft.images for person in image.people for name in person.keypoints}
    unknown = sorted(used - set(info.keypoint_names))
    if unknown:
        raise AnnotationFormatError(f"keypoints {unknown} are not in the skeleton {info.name!r} "
                                    f"({', '.join(info.keypoint_names)}); rename them in the tool or use "
                                    f"another --skeleton", file=draft.source, field="--skeleton")
    names = info.keypoint_names
    draft.names = list(names)
    draft.limbs = [(names[a], names[b]) for a, b in info.skeleton]
    return draft


def to_coco(draft: Draft) -> dict:
    """The COCO keypoint file of a draft (docs/annotations.md §1): images numbered from 1 in the
    export's order, one annotation per person with a labelled keypoint; bbox from the tool's box
    or the labelled points' extent; area = box w x h; num_keypoints = labelled points."""
    index = {name: k for k, name in enumerate(draft.names)}
    images, annotations = [], []
    for image_id, image in enumerate(draft.images, start=1):
        images.append({"id": image_id, "file_name": image.file_name, "width": image.width, "height": image.height})
        for person in image.people:
            flat = [0.0, 0.0, 0] * len(draft.names)
            for name, (x, y, v) in person.keypoints.items():
                flat[3 * index[name]:3 * index[name] + 3] = [x, y, v] if v > 0 else [0.0, 0.0, 0]
            labelled = [(flat[3 * k], flat[3 * k + 1]) for k in range(len(draft.names)) if flat[3 * k + 2] > 0]
            if not labelled:
                draft.skip("people without a labelled keypoint")
                continue
            bbox = person.bbox or _extent(labelled)
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": 1,
                                "keypoints": flat, "num_keypoints": len(labelled), "bbox": bbox,
                                "area": bbox[2] * bbox[3], "iscrowd": 0})
    category = {"id": 1, "name": draft.category, "supercategory": draft.category, "keypoints": list(draft.names),
                "skeleton": [[index[a] + 1, index[b] + 1] for a, b in draft.limbs]}
    return {"info": {"description": f"imported from {draft.tool} export {Path(draft.source).name}"},
            "images": images, "annotations": annotations, "categories": [category]}


def _extent(points) -> list[float]:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    return [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]


# ---------------------------------------------------------------------------- pre-annotations out


def _images_of(records) -> list[tuple[str, int, int, list[dict]]]:
    """Prediction records grouped by image: (file_name, width, height, records), in first-seen order."""
    images = {}
    for i, rec in enumerate(records):
        where = f"prediction record [{i}]"
        if not isinstance(rec, dict):
            raise AnnotationFormatError(f"must be an object, got {type(rec).__name__}", record=where)
        for key in ("file_name", "width", "height", "keypoints", "bbox"):
            if key not in rec:
                raise AnnotationFormatError("missing field (records of `vitpose predict --json` have it)",
                                            record=where, field=key)
        name = rec["file_name"]
        entry = images.setdefault(name, (name, int(rec["width"]), int(rec["height"]), []))
        if (entry[1], entry[2]) != (int(rec["width"]), int(rec["height"])):
            raise AnnotationFormatError(f"image {name!r} has two sizes", record=where, field="width")
        entry[3].append(rec)
    return list(images.values())


def _keypoints_of(rec: dict, K: int, where: str) -> list[tuple[float, float, float]]:
    flat = rec["keypoints"]
    if not isinstance(flat, list) or len(flat) != 3 * K:
        raise AnnotationFormatError(f"must hold {3 * K} numbers (x, y, score for {K} keypoints)", record=where,
                                    field="keypoints")
    return [(float(flat[3 * k]), float(flat[3 * k + 1]), float(flat[3 * k + 2])) for k in range(K)]


def to_labelstudio_tasks(records, keypoint_names, *, mark_below: float = DEFAULT_MARK_BELOW,
                         image_prefix: str = "/data/local-files/?d=", model_version: str = "vitpose",
                         keypoint_control: str = "keypoints", box_control: str = "person", image_object: str = "image",
                         box_label: str = "person") -> list[dict]:
    """Label Studio tasks with `predictions` (docs/annotations.md §4.1): per person a rectangle and
    its keypoints (`parentID` = the rectangle) in percent of the image, every result with its
    `score`; keypoints scored below `mark_below` carry a `meta.text` note instead of being dropped."""
    tasks = []
    for t, (file_name, width, height, recs) in enumerate(_images_of(records)):
        result = []
        for p, rec in enumerate(recs):
            x, y, w, h = (float(v) for v in rec["bbox"])
            common = {"to_name": image_object, "original_width": width, "original_height": height,
                      "image_rotation": 0}
            box_id = f"t{t}p{p}"
            result.append({"id": box_id, "type": "rectanglelabels", "from_name": box_control, **common,
                           "score": float(rec.get("bbox_score", rec.get("score", 1.0))),
                           "value": {"x": 100 * x / width, "y": 100 * y / height, "width": 100 * w / width,
                                     "height": 100 * h / height, "rotation": 0, "rectanglelabels": [box_label]}})
            for k, (kx, ky, s) in enumerate(_keypoints_of(rec, len(keypoint_names), f"{file_name} person {p}")):
                point = {"id": f"{box_id}k{k}", "type": "keypointlabels", "from_name": keypoint_control, **common,
                         "parentID": box_id, "score": s,
                         "value": {"x": 100 * kx / width, "y": 100 * ky / height, "width": 0.5,
                                   "keypointlabels": [keypoint_names[k]]}}
                if s < mark_below:
                    point["meta"] = {"text": [f"low confidence: score {s:.2f} < {mark_below:g}"]}
                result.append(point)
        scores = [float(r.get("score", 0.0)) for r in recs]
        tasks.append({"data": {image_object: image_prefix + file_name},
                      "predictions": [{"model_version": model_version, "score": sum(scores) / len(scores),
                                       "result": result}]})
    return tasks


def to_cvat_xml(records, keypoint_names, limbs=(), *, mark_below: float = DEFAULT_MARK_BELOW,
                label: str = "person") -> str:
    """CVAT for images 1.1 XML (docs/annotations.md §4.2): one <skeleton> per person; a keypoint
    scored below `mark_below` is written `occluded="1"` (CVAT's visible per-point flag) so the
    annotator checks it. Images are numbered in lexical name order, as CVAT numbers a task's images;
    coordinates have CVAT's 2 decimals. `limbs`: 0-based keypoint index pairs."""
    names = list(keypoint_names)
    out = ['<?xml version="1.0" encoding="utf-8"?>', "<annotations>", "  <version>1.1</version>",
           "  <meta>", "    <task>", "      <labels>", _cvat_skeleton_label(label, names, limbs)]
    for name in names:
        out.append(f"        <label><name>{_xml_text(name)}</name><type>points</type><attributes></attributes>"
                   f"<parent>{_xml_text(label)}</parent></label>")
    out += ["      </labels>", "    </task>", "  </meta>"]
    for image_id, (file_name, width, height, recs) in enumerate(sorted(_images_of(records))):
        out.append(f'  <image id="{image_id}" name={quoteattr(file_name)} width="{width}" height="{height}">')
        for p, rec in enumerate(recs):
            out.append(f'    <skeleton label={quoteattr(label)} source="auto" z_order="0">')
            for name, (x, y, s) in zip(names, _keypoints_of(rec, len(names), f"{file_name} person {p}")):
                out.append(f'      <points label={quoteattr(name)} source="auto" outside="0" '
                           f'occluded="{int(s < mark_below)}" points="{x:.{CVAT_DECIMALS}f},{y:.{CVAT_DECIMALS}f}">'
                           f"</points>")
            out.append("    </skeleton>")
        out.append("  </image>")
    out.append("</annotations>")
    return "\n".join(out) + "\n"


def _xml_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cvat_skeleton_label(label: str, names: list[str], limbs) -> str:
    """The skeleton label with its SVG template: nodes on a circle, edges for the limbs."""
    svg = []
    for a, b in limbs:
        svg.append(f'<line data-type="edge" data-node-from="{a + 1}" data-node-to="{b + 1}"></line>')
    for k, name in enumerate(names):
        angle = 2 * math.pi * k / max(1, len(names))
        svg.append(f'<circle r="1.5" cx="{50 + 40 * math.cos(angle):.2f}" cy="{50 + 40 * math.sin(angle):.2f}" '
                   f'data-type="element node" data-element-id="{k + 1}" data-node-id="{k + 1}" '
                   f'data-label-name={quoteattr(name)}></circle>')
    return (f"        <label><name>{_xml_text(label)}</name><type>skeleton</type><attributes></attributes>"
            f"<svg>{_xml_text(''.join(svg))}</svg></label>")
