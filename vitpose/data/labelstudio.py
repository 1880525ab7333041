"""Label Studio in and out (docs/annotations.md §2, §4.1).

- `read_labelstudio(path, skeleton=None)`: Label Studio's JSON export of a keypoint project:
  `keypointlabels` results, x/y in percent of `original_width` / `original_height`, grouped into
  people by their `rectanglelabels` region (`parentID`, else the rectangle that contains the point)
  -> a `Draft` (`vitpose.data.annotation_draft`).
- `to_labelstudio_tasks(records, names, ...)`: prediction records -> tasks with `predictions`, the
  keypoints scored below a threshold marked instead of dropped.
- `labelstudio_image_url(name)` / `labelstudio_file_name(url)`: a task's image URL, percent-encoded
  and -decoded as Label Studio's server reads it.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlparse

from . import annotation_draft as shared
from .annotation_draft import DEFAULT_MARK_BELOW, AnnotationFormatError, Draft, DraftImage, DraftPerson

__all__ = ["labelstudio_file_name", "labelstudio_image_url", "read_labelstudio", "to_labelstudio_tasks"]

OCCLUDED_WORD = "occluded"  # a per-region Label Studio choice containing it marks the point occluded


def _load_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AnnotationFormatError("export file not found", file=path) from None
    except RecursionError:  # json's decoder recurses per nesting level: [[[[...]]]] 100 000 deep
        raise AnnotationFormatError("not a Label Studio export: JSON nested too deeply to be a list of tasks",
                                    file=path) from None
    except (OSError, UnicodeDecodeError, ValueError) as e:  # ValueError: JSONDecodeError, an int of 5000 digits
        hint = shared.wrong_format_hint(path, "labelstudio")
        raise AnnotationFormatError(hint or f"not readable JSON ({e}); export the project as Label Studio 'JSON'",
                                    file=path, field="--format" if hint else None) from None


def labelstudio_file_name(url: str) -> str:
    """The image's file name in a task's data URL (docs/annotations.md §2.3): the `d` parameter of
    a local-storage URL (`/data/local-files/?d=dir/a.jpg` -> dir/a.jpg), else the URL's last path
    part (`/data/upload/3/5e3b2f1a-a.jpg` -> 5e3b2f1a-a.jpg, the name Label Studio stored). Both
    are percent-decoded, as Label Studio's server reads them ("" when the URL names no file)."""
    parsed = urlparse(url)
    # surrogateescape: a name that is not UTF-8 comes back as the str os.fsdecode makes of it
    query = parse_qs(parsed.query, keep_blank_values=True, errors="surrogateescape")
    if "d" in query:
        name = query["d"][0]
    else:
        name = unquote(parsed.path.rsplit("/", 1)[-1], errors="surrogateescape")
    return "" if name.endswith("/") or name.rsplit("/", 1)[-1] in ("", ".", "..") else name


def labelstudio_image_url(file_name: str, prefix: str = "/data/local-files/?d=") -> str:
    """The task URL of an image file: `prefix` + the name percent-encoded, '/' kept (so `a&b #1.jpg`
    is `?d=a%26b%20%231.jpg`, which Label Studio's server and `labelstudio_file_name` read back)."""
    return prefix + quote(file_name, safe="/", errors="surrogateescape")


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
        chosen = _chosen_annotation(annotations, draft)
        if chosen is None:
            draft.skip("tasks without an annotation (not labelled yet)")
            continue
        k, annotation = chosen
        image_url = _labelstudio_image_url(task, fail)
        file_name = labelstudio_file_name(image_url)
        if not file_name:
            fail(f"the image URL {image_url!r} names no file; point the task at an image file", "data.image")
        result = annotation.get("result")
        if not isinstance(result, list):
            fail("must be a list of regions", f"annotations[{k}].result")
        image = _labelstudio_image(result, file_name, draft, fail)
        if image is not None:
            image.where = where
            draft.images.append(image)
    if not draft.images:
        raise AnnotationFormatError(f"no labelled task among {len(tasks)} ({draft.skipped or 'none skipped'}); "
                                    "export the project as 'JSON' (not JSON-MIN) after annotating", file=path,
                                    field="annotations")
    shared.refuse_duplicate_images(draft, path, "data.image")
    return shared.apply_skeleton(draft, skeleton)


def _created_at(annotation: dict) -> datetime | None:
    """An annotation's `created_at` (ISO 8601, as Label Studio writes it), None if absent or not one."""
    value = annotation.get("created_at")
    if not isinstance(value, str):
        return None
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)


def _chosen_annotation(annotations: list, draft: Draft) -> tuple[int, dict] | None:
    """The annotation of a task that is imported, with its index (docs/annotations.md §2.2).
    Cancelled (skipped) ones never count. Of several, the newest by `created_at`: Label Studio's own
    converters order a task's annotations that way and emit each, which for a COCO file would label
    the people twice; without a readable `created_at` on each, the last in the list (Label Studio
    lists them in the order they were made)."""
    done = [(k, a) for k, a in enumerate(annotations)
            if isinstance(a, dict) and not a.get("was_cancelled") and not a.get("skipped")]
    if not done:
        return None
    if len(done) == 1:
        return done[0]
    stamps = [_created_at(a) for _, a in done]
    if all(stamps):
        newest = max(range(len(done)), key=lambda i: (stamps[i], i))  # a tie: the later one in the list
        draft.skip("tasks with several annotations (the newest by created_at was imported)")
        return done[newest]
    draft.skip("tasks with several annotations (the last one was imported)")
    return done[-1]


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
            w = shared.finite_number(region.get("original_width"), fail, f"result[{r}].original_width")
            h = shared.finite_number(region.get("original_height"), fail, f"result[{r}].original_height")
            if w <= 0 or h <= 0 or w != int(w) or h != int(h):
                fail(f"image size must be positive whole pixels, got {w} x {h}", f"result[{r}].original_width")
            shared.check_image_size(int(w), int(h), fail, f"result[{r}].original_width")
            sizes.add((int(w), int(h)))
    if len(sizes) > 1:
        fail(f"regions disagree on the image size: {sorted(sizes)}", "result[].original_width")
    return sizes.pop() if sizes else None


def _region_id(region: dict, key: str, fail, what: str):
    """A region's `id` / `parentID`: Label Studio writes strings; numbers are taken as they are."""
    value = region.get(key)
    if value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    fail(f"must be a string, got {type(value).__name__} {value!r:.40}", what)


def _occluded_region_ids(result: list, fail) -> set:
    """Ids of the regions that a per-region choice containing "occluded" marks (§2.4)."""
    occluded = set()
    for r, region in enumerate(result):
        if not isinstance(region, dict) or region.get("type") != "choices":
            continue
        value = region.get("value")
        choices = value.get("choices") if isinstance(value, dict) else None
        if not isinstance(choices, list):
            fail("must be a list", f"result[{r}].value.choices")
        if any(OCCLUDED_WORD in str(c).lower() for c in choices):
            occluded.add(_region_id(region, "id", fail, f"result[{r}].id"))
    return occluded


def _labelstudio_image(result: list, file_name: str, draft: Draft, fail) -> DraftImage | None:
    """One task's regions -> DraftImage: rectangles are people, keypoints join their rectangle."""
    size = _labelstudio_size(result, fail)
    if size is None:
        draft.skip("tasks with no keypoint or rectangle region")
        return None
    image = DraftImage(file_name, *size)
    width, height = size
    occluded = _occluded_region_ids(result, fail)
    boxes, points = {}, []
    for r, region in enumerate(result):
        if not isinstance(region, dict):
            fail(f"must be an object, got {type(region).__name__}", f"result[{r}]")
        kind, value = region.get("type"), region.get("value")
        if kind not in ("rectanglelabels", "keypointlabels"):
            continue  # choices, relations, text areas: not geometry
        if not isinstance(value, dict):
            fail("missing or not an object", f"result[{r}].value")
        region_id = _region_id(region, "id", fail, f"result[{r}].id")
        x = shared.finite_number(value.get("x"), fail, f"result[{r}].value.x") / 100 * width
        y = shared.finite_number(value.get("y"), fail, f"result[{r}].value.y") / 100 * height
        if kind == "rectanglelabels":
            if shared.finite_number(value.get("rotation", 0), fail, f"result[{r}].value.rotation") != 0:
                fail("a rotated rectangle cannot be a COCO box; draw it unrotated", f"result[{r}].value.rotation")
            w = shared.finite_number(value.get("width"), fail, f"result[{r}].value.width") / 100 * width
            h = shared.finite_number(value.get("height"), fail, f"result[{r}].value.height") / 100 * height
            key = f"[{r}]" if region_id is None else region_id
            if key in boxes:
                fail(f"two rectangles have the id {region_id!r}", f"result[{r}].id")
            boxes[key] = DraftPerson(bbox=[x, y, w, h], where=f"rectangle {region_id}")
            continue
        labels = value.get("keypointlabels")
        if not isinstance(labels, list) or len(labels) != 1 or not isinstance(labels[0], str):
            fail(f"must name exactly one keypoint, got {labels!r}", f"result[{r}].value.keypointlabels")
        if shared.outside_image(x, y, image):
            fail(f"keypoint {labels[0]!r} {shared.outside_image(x, y, image)}", f"result[{r}].value")
        parent = _region_id(region, "parentID", fail, f"result[{r}].parentID")
        v = 1 if region_id is not None and region_id in occluded else 2
        points.append((r, parent, labels[0], (x, y, v), _region_p(region, fail, f"result[{r}].meta.p")))
    image.people = _labelstudio_group(boxes, points, fail)
    for person in image.people:
        for name in person.keypoints:
            draft.add_name(name)
    return image


def _labelstudio_group(boxes: dict, points: list, fail) -> list[DraftPerson]:
    """Each keypoint joins the rectangle its `parentID` names, else the smallest rectangle that
    contains it and has no keypoint of that name yet (docs/annotations.md §2.2). A task without
    rectangles is one person, as in Label Studio's own COCO export."""
    if not boxes:
        boxes = {None: DraftPerson(where="the task's keypoints (no rectangle)")}
    by_size = sorted(boxes.items(), key=lambda item: 0 if item[1].bbox is None else item[1].bbox[2] * item[1].bbox[3])
    for r, parent, name, xyv, p in points:
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
        if p is not None:
            person.p[name] = p
    return list(boxes.values())


def _region_p(region: dict, fail, what: str) -> float | None:
    """The calibrated probability a pre-annotation put in the region's `meta.p` (None without one)."""
    meta = region.get("meta")
    if not isinstance(meta, dict) or meta.get("p") is None:
        return None
    p = shared.finite_number(meta["p"], fail, what)
    if not 0 <= p <= 1:
        fail(f"must be a probability in [0, 1], got {p}", what)
    return p


def _inside(xyv, bbox) -> bool:
    x, y, w, h = bbox
    return x <= xyv[0] <= x + w and y <= xyv[1] <= y + h



# ---------------------------------------------------------------------------- pre-annotations out


def to_labelstudio_tasks(records, keypoint_names, *, mark_below: float = DEFAULT_MARK_BELOW, mark_by: str = "auto",
                         image_prefix: str = "/data/local-files/?d=", model_version: str = "vitpose",
                         keypoint_control: str = "keypoints", box_control: str = "person", image_object: str = "image",
                         box_label: str = "person", visibility_control: str | None = "visibility",
                         occluded_choice: str = OCCLUDED_WORD) -> list[dict]:
    """Label Studio tasks with `predictions` (docs/annotations.md §4.1): per person a rectangle and
    its keypoints (`parentID` = the rectangle) in percent of the image, every result with its
    `score`; keypoints below `mark_below` (by `mark_by`: the calibrated `p` where the records carry
    it, else the raw score; `MARK_BY`), or predicted outside the image (then placed on its edge),
    carry a `meta.text` note instead of being dropped. The image URL is `image_prefix` + the file
    name percent-encoded (`labelstudio_image_url`).

    Records with the calibrated fields (docs/calibration.md §5.2): each keypoint's `p` is its
    region's `meta.p` (Label Studio keeps a region's meta through correction and export); an
    occluded keypoint (visibility 1) gets the per-region choice `occluded_choice` of the
    `visibility_control` `<Choices perRegion>` (§2.4, what the import reads back as v = 1; None: a
    labelling config without one, no choice); an absent one (visibility 0) is not placed, as Label
    Studio marks a point that is not there."""
    tasks = []
    for t, (file_name, width, height, recs) in enumerate(shared.images_of(records)):
        common = {"to_name": image_object, "original_width": width, "original_height": height, "image_rotation": 0}
        result = []
        for p, rec in enumerate(recs):
            x, y, w, h = (float(v) for v in rec["bbox"])
            box_id = f"t{t}p{p}"
            result.append({"id": box_id, "type": "rectanglelabels", "from_name": box_control, **common,
                           "score": float(rec.get("bbox_score", rec.get("score", 1.0))),
                           "value": {"x": 100 * x / width, "y": 100 * y / height, "width": 100 * w / width,
                                     "height": 100 * h / height, "rotation": 0, "rectanglelabels": [box_label]}})
            result += _keypoint_results(rec, keypoint_names, f"{file_name} person {p}", box_id, common,
                                        (mark_below, mark_by), (keypoint_control, visibility_control, occluded_choice))
        scores = [float(r.get("score", 0.0)) for r in recs]
        tasks.append({"data": {image_object: labelstudio_image_url(file_name, image_prefix)},
                      "predictions": [{"model_version": model_version, "score": sum(scores) / len(scores),
                                       "result": result}]})
    return tasks


def _keypoint_results(rec: dict, keypoint_names, where: str, box_id: str, common: dict, marking, controls) -> list:
    """One person's keypoint regions (and the per-region occlusion choices of a calibrated record)."""
    mark_below, mark_by = marking
    keypoint_control, visibility_control, occluded_choice = controls
    width, height = common["original_width"], common["original_height"]
    keypoints = shared.keypoints_of(rec, len(keypoint_names), where)
    p, visibility = shared.calibrated_of(rec, len(keypoint_names), where)
    marks, by = shared.mark_values([s for _, _, s in keypoints], p, mark_by, where)
    out = []
    for k, (kx, ky, s) in enumerate(keypoints):
        if visibility is not None and visibility[k] == 0:
            continue  # absent: Label Studio's way is no point at all
        kx, ky, moved = shared.onto_image(kx, ky, width, height)
        value = {"x": 100 * kx / width, "y": 100 * ky / height, "width": 0.5}
        point = {"id": f"{box_id}k{k}", "type": "keypointlabels", "from_name": keypoint_control, **common,
                 "parentID": box_id, "score": s, "value": {**value, "keypointlabels": [keypoint_names[k]]}}
        notes = ([f"low confidence: {by} {marks[k]:.2f} < {mark_below:g}"] if marks[k] < mark_below else []) + \
            ([moved] if moved else [])
        meta = ({"p": p[k]} if p is not None and math.isfinite(p[k]) else {}) | ({"text": notes} if notes else {})
        if meta:
            point["meta"] = meta
        out.append(point)
        if visibility is not None and visibility[k] == 1 and visibility_control:
            out.append({"id": point["id"], "type": "choices", "from_name": visibility_control, **common,
                        "value": {**value, "choices": [occluded_choice]}})
    return out
