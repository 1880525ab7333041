"""CVAT in and out (docs/annotations.md §3, §4.2).

- `read_cvat(path, skeleton=None, label=None)`: CVAT's XML ("CVAT for images 1.1" with `<skeleton>`
  shapes, and the `<track>` skeletons of "CVAT for video 1.1") -> a `Draft`
  (`vitpose.data.annotation_draft`).
- `to_cvat_xml(records, names, limbs, ...)`: prediction records -> CVAT for images 1.1 XML, the
  keypoints scored below a threshold marked `occluded` for the annotator to check.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from xml.sax.saxutils import quoteattr

from . import annotation_draft as shared
from .annotation_draft import DEFAULT_MARK_BELOW, AnnotationFormatError, Draft, DraftImage, DraftPerson

__all__ = ["read_cvat", "to_cvat_xml"]

CVAT_DECIMALS = 2  # CVAT writes coordinates with "{:.2f}" (docs/annotations.md §3)


def read_cvat(path, skeleton=None, label: str | None = None) -> Draft:
    """A CVAT XML export (CVAT for images / video 1.1) -> Draft (docs/annotations.md §3)."""
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except FileNotFoundError:
        raise AnnotationFormatError("export file not found", file=path) from None
    except (OSError, ET.ParseError) as e:
        hint = shared.wrong_format_hint(path, "cvat")
        raise AnnotationFormatError(hint or f"not readable XML ({e}); export the task as 'CVAT for images 1.1'",
                                    file=path, field="--format" if hint else None) from None
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
    shared.refuse_duplicate_images(draft, path, "name")
    return shared.apply_skeleton(draft, skeleton)


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


# ASCII digits only (str.isdigit() and int() also take '²' and '١٢'), at most 18 of them: int64, and
# int() refuses 4300 digits with an error of its own
_WHOLE = re.compile(r"-?[0-9]{1,18}")


def _cvat_int(element, key: str, path: Path, where: str) -> int:
    value = element.get(key)
    if value is None or not _WHOLE.fullmatch(value.strip()):
        shown = repr(value) if value is None or len(value) < 40 else f"{value[:20]!r}... ({len(value)} characters)"
        raise AnnotationFormatError(f"must be a whole number below 10^18, got {shown}", file=path, record=where,
                                    field=key)
    number = int(value)
    if number <= 0 and key in ("width", "height"):
        raise AnnotationFormatError(f"must be positive, got {number}", file=path, record=where, field=key)
    return number


def _cvat_size(element, path: Path, where: str) -> tuple[int, int]:
    width, height = _cvat_int(element, "width", path, where), _cvat_int(element, "height", path, where)

    def fail(message, field_name):
        raise AnnotationFormatError(message, file=path, record=where, field=field_name)

    shared.check_image_size(width, height, fail, "width")
    return width, height


def _cvat_image(image, path: Path) -> DraftImage:
    name = image.get("name")
    where = f"image id {image.get('id')}" + (f" of task {image.get('task_id')}" if image.get("task_id") else "")
    if not name:
        raise AnnotationFormatError("missing", file=path, record=where, field="name")
    return DraftImage(name, *_cvat_size(image, path, where), where=where)


def _cvat_frame(frame, frames: dict, root, draft: Draft, path: Path, track) -> DraftImage:
    """The image of a track's frame: the <image> of that id, else frame_NNNNNN.png of the
    video export's layout with <original_size> (docs/annotations.md §3.2)."""
    where = f"track {track}"
    if frame is None or not _WHOLE.fullmatch(frame) or frame.startswith("-"):
        shown = repr(frame) if frame is None or len(frame) < 40 else f"{frame[:20]!r}... ({len(frame)} characters)"
        raise AnnotationFormatError(f"must be a frame number, got {shown}", file=path, record=where, field="frame")
    if frame in frames:
        return frames[frame]
    size = root.find("meta/task/original_size")
    if size is None:
        size = root.find("meta/project/original_size")
    if size is None:
        raise AnnotationFormatError(f"frame {frame} has no <image id={frame!r}> and <meta> has no <original_size>",
                                    file=path, record=where, field="original_size")
    item = DraftImage(f"frame_{int(frame):06d}.png", *_cvat_size(_Attrs(size), path, "original_size"),
                      where=f"frame {int(frame)}")
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
        p = _cvat_p(element, lambda m, f, name=name: _point_fail(path, where, name, m, f))
        if p is not None:
            person.p[name] = p
        if element.get("outside", "0") == "1":
            person.keypoints[name] = (0.0, 0.0, 0)
            continue
        pairs = (element.get("points") or "").split(";")
        xy = pairs[0].split(",") if len(pairs) == 1 else []

        def fail(message, field_name, name=name):
            raise AnnotationFormatError(f"point {name!r}: {message}", file=path, record=where, field=field_name)

        if len(xy) != 2:
            fail(f"must be 'x,y', got {element.get('points')!r}", "points")
        x, y = (shared.finite_number(v, fail, "points") for v in xy)
        if shared.outside_image(x, y, item):
            fail(shared.outside_image(x, y, item), "points")
        person.keypoints[name] = (x, y, 1 if element.get("occluded", "0") == "1" else 2)
    if not any(v > 0 for _, _, v in person.keypoints.values()):
        draft.skip("skeletons with every point outside")
        return
    group = shape.get("group_id")
    for box in boxes:
        if box.get("group_id") == group:
            x1, y1, x2, y2 = (shared.finite_number(box.get(k), lambda m, f: _box_fail(path, where, m, f), k)
                              for k in ("xtl", "ytl", "xbr", "ybr"))
            person.bbox = [x1, y1, x2 - x1, y2 - y1]
    item.people.append(person)


def _point_fail(path, where, name, message, field_name):
    raise AnnotationFormatError(f"point {name!r}: {message}", file=path, record=where, field=field_name)


def _cvat_p(element, fail) -> float | None:
    """The calibrated p of a point's `p_permille` attribute (`to_cvat_xml`), None without one."""
    for attribute in element.findall("attribute"):
        if attribute.get("name") == P_ATTRIBUTE:
            text = (attribute.text or "").strip()
            if not _WHOLE.fullmatch(text) or not 0 <= int(text) <= 1000:
                fail(f"{P_ATTRIBUTE} must be a whole number from 0 to 1000, got {text[:20]!r}", P_ATTRIBUTE)
            return int(text) / 1000
    return None


def _box_fail(path, where, message, field_name):
    raise AnnotationFormatError(f"the skeleton's box: {message}", file=path, record=where, field=field_name)



# ---------------------------------------------------------------------------- pre-annotations out


def to_cvat_xml(records, keypoint_names, limbs=(), *, mark_below: float = DEFAULT_MARK_BELOW,
                mark_by: str = "auto", label: str = "person") -> str:
    """CVAT for images 1.1 XML (docs/annotations.md §4.2): one <skeleton> per person; a keypoint
    below `mark_below` (by `mark_by`, `MARK_BY`), or predicted outside the image (then placed on its
    edge), is written `occluded="1"` (CVAT's visible per-point flag) so the annotator checks it. Images are numbered
    from 0 in lexical name order, as CVAT numbers a task's images (its upload matches by name, then
    by this number); coordinates have CVAT's 2 decimals. `limbs`: 0-based keypoint index pairs.

    Records with the calibrated fields (docs/calibration.md §5.3) say the state themselves:
    `occluded="1"` is visibility 1 and `outside="1"` visibility 0, as CVAT marks them; `p` is the
    point's `p_permille` attribute (CVAT's number attributes hold whole numbers: p x 1000,
    rounded), and a point to check (below the threshold, or moved onto the image) gets the
    checkbox attribute `review`."""
    names = list(keypoint_names)
    groups = sorted(shared.images_of(records))
    calibrated = any(r.get("p") is not None or r.get("visibility") is not None for _, _, _, recs in groups for r in recs)
    point_attributes = _CVAT_POINT_ATTRIBUTES if calibrated else ""
    out = ['<?xml version="1.0" encoding="utf-8"?>', "<annotations>", "  <version>1.1</version>",
           "  <meta>", "    <task>", "      <labels>", _cvat_skeleton_label(label, names, limbs)]
    for name in names:
        out.append(f"        <label><name>{_xml_text(name)}</name><type>points</type><attributes>{point_attributes}"
                   f"</attributes><parent>{_xml_text(label)}</parent></label>")
    out += ["      </labels>", "    </task>", "  </meta>"]
    for image_id, (file_name, width, height, recs) in enumerate(groups):
        out.append(f'  <image id="{image_id}" name={quoteattr(file_name)} width="{width}" height="{height}">')
        for p, rec in enumerate(recs):
            out.append(f'    <skeleton label={quoteattr(label)} source="auto" z_order="0">')
            out += _cvat_points(rec, names, f"{file_name} person {p}", width, height, (mark_below, mark_by), calibrated)
            out.append("    </skeleton>")
        out.append("  </image>")
    out.append("</annotations>")
    return "\n".join(out) + "\n"


P_ATTRIBUTE, REVIEW_ATTRIBUTE = "p_permille", "review"
# The attributes of every point of a calibrated file: p in thousandths (CVAT's number attribute:
# min, max and step, whole numbers, one a line) and the checkbox of the points to check.
_CVAT_POINT_ATTRIBUTES = (
    f"<attribute><name>{P_ATTRIBUTE}</name><mutable>False</mutable><input_type>number</input_type>"
    "<default_value>0</default_value><values>0\n1000\n1</values></attribute>"
    f"<attribute><name>{REVIEW_ATTRIBUTE}</name><mutable>True</mutable><input_type>checkbox</input_type>"
    "<default_value>false</default_value><values>false</values></attribute>")


def _cvat_points(rec: dict, names: list, where: str, width: int, height: int, marking, calibrated: bool) -> list[str]:
    """One person's <points>: flagged `occluded` below the threshold (uncalibrated files), or with
    the calibrated state, `p_permille` and `review` (calibrated files)."""
    mark_below, mark_by = marking
    keypoints = shared.keypoints_of(rec, len(names), where)
    p, visibility = shared.calibrated_of(rec, len(names), where)
    marks, _ = shared.mark_values([s for _, _, s in keypoints], p, mark_by, where)
    out = []
    for k, (name, (x, y, _)) in enumerate(zip(names, keypoints)):
        x, y, moved = shared.onto_image(x, y, width, height)
        check = marks[k] < mark_below or bool(moved)
        state = (2 if visibility is None else visibility[k]) if calibrated else (1 if check else 2)
        head = (f'      <points label={quoteattr(name)} source="auto" outside="{int(state == 0)}" '
                f'occluded="{int(state == 1)}" points="{x:.{CVAT_DECIMALS}f},{y:.{CVAT_DECIMALS}f}">')
        if not calibrated:
            out.append(head + "</points>")
            continue
        attributes = [f'<attribute name="{REVIEW_ATTRIBUTE}">{"true" if check else "false"}</attribute>']
        if p is not None and math.isfinite(p[k]):
            attributes.insert(0, f'<attribute name="{P_ATTRIBUTE}">{round(1000 * min(max(p[k], 0.0), 1.0))}</attribute>')
        out.append(head + "".join(attributes) + "</points>")
    return out


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
