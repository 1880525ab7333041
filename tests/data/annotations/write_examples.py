"""Writes the example exports of this folder and the COCO files expected from them (README.md).

The people are given once, in pixels (PEOPLE below); each tool's export is written the way that
tool's documentation says it writes one (README.md §1, §2), and the expected COCO files are written
from the same pixels by the rules of docs/annotations.md §1, without vitpose's importer, so that
tests/test_annotation_formats.py compares the importer with an independent answer.

    python tests/data/annotations/write_examples.py
"""

import json
from pathlib import Path

HERE = Path(__file__).parent
NAMES = ["nose", "left_wrist", "right_wrist", "left_ankle", "right_ankle"]
LIMBS = [[1, 2], [1, 3], [1, 4], [1, 5]]  # 1-based, COCO style
IMAGES = {"img_a.jpg": (640, 480), "img_b.jpg": (320, 240)}
# Per person: image, box [x, y, w, h] or None, {name: (x, y, state)}; state "v" visible,
# "o" occluded, "out" outside (CVAT) / not placed (Label Studio). Absent names are not labelled.
PEOPLE = [
    ("img_a.jpg", [100, 40, 160, 400], {"nose": (180, 80, "v"), "left_wrist": (120, 200, "v"),
                                        "right_wrist": (240, 208, "v"), "left_ankle": (150, 420, "v"),
                                        "right_ankle": (216, 424, "v")}),
    ("img_a.jpg", [320, 60, 192, 384], {"nose": (416, 100, "v"), "left_wrist": (336, 224, "o"),
                                        "right_wrist": (496, 232, "v"), "left_ankle": (376, 432, "v")}),
    ("img_b.jpg", None, {"nose": (160, 40, "v"), "left_wrist": (96, 120, "v"), "right_wrist": (224, 120, "o"),
                         "left_ankle": (128, 224, "v"), "right_ankle": (300, 230, "out")}),
]
VISIBILITY = {"v": 2, "o": 1, "out": 0}


def coco_person(box, points, ann_id, image_id, use_box=True):
    flat, labelled = [], []
    for name in NAMES:
        x, y, state = points.get(name, (0, 0, "out"))
        v = VISIBILITY[state]
        flat += [float(x), float(y), v] if v else [0.0, 0.0, 0]
        if v:
            labelled.append((x, y))
    if box is None or not use_box:
        xs, ys = [p[0] for p in labelled], [p[1] for p in labelled]
        box = [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]
    return {"id": ann_id, "image_id": image_id, "category_id": 1, "keypoints": flat, "num_keypoints": len(labelled),
            "bbox": [float(b) for b in box], "area": float(box[2] * box[3]), "iscrowd": 0}


def expected(file_names, people, use_box=True, description=""):
    images = [{"id": i, "file_name": n, "width": IMAGES[n.split("-")[-1]][0], "height": IMAGES[n.split("-")[-1]][1]}
              for i, n in enumerate(file_names, 1)]
    ids = {n.split("-")[-1]: i for i, n in enumerate(file_names, 1)}
    anns = [coco_person(box, pts, k, ids[img], use_box) for k, (img, box, pts) in enumerate(people, 1)]
    return {"info": {"description": description}, "images": images, "annotations": anns,
            "categories": [{"id": 1, "name": "person", "supercategory": "person", "keypoints": NAMES,
                            "skeleton": LIMBS}]}


def labelstudio():
    """Label Studio JSON export (README.md §1): x, y in percent of original_width / height."""
    def region(rid, kind, img, value, **extra):
        w, h = IMAGES[img]
        return {"id": rid, "type": kind, "from_name": "keypoints" if kind == "keypointlabels" else "person",
                "to_name": "image", "original_width": w, "original_height": h, "image_rotation": 0,
                "value": value, "origin": "manual", **extra}

    results = {"img_a.jpg": [], "img_b.jpg": []}
    for p, (img, box, points) in enumerate(PEOPLE):
        w, h = IMAGES[img]
        if box is not None:
            results[img].append(region(f"box{p}", "rectanglelabels", img, {
                "x": 100 * box[0] / w, "y": 100 * box[1] / h, "width": 100 * box[2] / w, "height": 100 * box[3] / h,
                "rotation": 0, "rectanglelabels": ["person"]}))
        for k, (name, (x, y, state)) in enumerate(points.items()):
            if state == "out":
                continue  # Label Studio has no outside flag: the point is simply not placed
            extra = {"parentID": f"box{p}"} if p == 0 else {}  # person 0 by parentID, person 1 by containment
            rid = f"kp{p}_{k}"
            results[img].append(region(rid, "keypointlabels", img, {
                "x": 100 * x / w, "y": 100 * y / h, "width": 0.75, "keypointlabels": [name]}, **extra))
            if state == "o":  # a per-region Choices control shares the region's id
                results[img].append({"id": rid, "type": "choices", "from_name": "visibility", "to_name": "image",
                                     "value": {"choices": ["occluded"]}, "origin": "manual"})
    tasks = [
        {"id": 11, "data": {"image": "/data/local-files/?d=img_a.jpg"}, "project": 3,
         "annotations": [{"id": 90, "was_cancelled": True, "result": []},
                         {"id": 91, "completed_by": 1, "was_cancelled": False, "ground_truth": False,
                          "result": results["img_a.jpg"], "lead_time": 41.2}],
         "predictions": []},
        {"id": 12, "data": {"image": "/data/upload/3/5e3b2f1a-img_b.jpg"}, "project": 3,
         "annotations": [{"id": 92, "completed_by": 1, "was_cancelled": False, "ground_truth": False,
                          "result": results["img_b.jpg"], "lead_time": 12.0}],
         "predictions": []},
        {"id": 13, "data": {"image": "/data/local-files/?d=img_c.jpg"}, "project": 3, "annotations": [],
         "predictions": []},
    ]
    return tasks


def svg_template():
    nodes = "".join(f'<circle r="1.5" stroke="black" fill="#b3b3b3" cx="{10 + 10 * k}" cy="{20 + 5 * k}" '
                    f'stroke-width="0.1" data-type="element node" data-element-id="{k + 1}" '
                    f'data-node-id="{k + 1}" data-label-name="{n}"></circle>' for k, n in enumerate(NAMES))
    edges = "".join(f'<line x1="0" y1="0" x2="1" y2="1" stroke="black" data-type="edge" data-node-from="{a}" '
                    f'stroke-width="0.5" data-node-to="{b}"></line>' for a, b in LIMBS)
    return (edges + nodes).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def cvat_meta(mode, size=None):
    labels = "".join(f"\n        <label>\n          <name>{n}</name>\n          <type>points</type>\n"
                     f"          <attributes>\n          </attributes>\n          <parent>person</parent>\n"
                     f"        </label>" for n in NAMES)
    original = (f"\n      <original_size>\n        <width>{size[0]}</width>\n        <height>{size[1]}</height>\n"
                f"      </original_size>") if size else ""
    return f"""<?xml version="1.0" encoding="utf-8"?>
<annotations>
  <version>1.1</version>
  <meta>
    <task>
      <id>7</id>
      <name>pose</name>
      <size>2</size>
      <mode>{mode}</mode>
      <overlap>0</overlap>
      <flipped>False</flipped>
      <labels>
        <label>
          <name>car</name>
          <type>rectangle</type>
          <attributes>
          </attributes>
        </label>
        <label>
          <name>person_box</name>
          <type>rectangle</type>
          <attributes>
          </attributes>
        </label>
        <label>
          <name>person</name>
          <type>skeleton</type>
          <attributes>
          </attributes>
          <svg>{svg_template()}</svg>
        </label>{labels}
      </labels>{original}
    </task>
    <dumped>2026-11-30 10:00:00.000000+00:00</dumped>
  </meta>
"""


def cvat_points(points, track=False):
    lines = []
    for name in NAMES:
        if name not in points:
            continue  # an element that was never placed is absent
        x, y, state = points[name]
        keyframe = ' keyframe="1"' if track else ""
        lines.append(f'      <points label="{name}" source="manual" outside="{int(state == "out")}" '
                     f'occluded="{int(state == "o")}"{keyframe} points="{x:.2f},{y:.2f}">\n      </points>')
    return "\n".join(lines)


def cvat_images():
    """CVAT for images 1.1 (README.md §2): <image> with <skeleton> shapes; person 0 has a box in
    its group, the others get the extent of their points."""
    text = cvat_meta("annotation")
    for image_id, img in enumerate(sorted(IMAGES)):
        w, h = IMAGES[img]
        text += f'  <image id="{image_id}" name="{img}" width="{w}" height="{h}">\n'
        if img == "img_a.jpg":
            text += ('    <box label="car" source="manual" occluded="0" xtl="1.00" ytl="2.00" xbr="30.00" '
                     'ybr="20.00" z_order="0">\n    </box>\n')
        for p, (pimg, box, points) in enumerate(PEOPLE):
            if pimg != img:
                continue
            group = ' group_id="1"' if p == 0 else ""
            text += f'    <skeleton label="person" source="manual" z_order="0"{group}>\n{cvat_points(points)}\n'
            text += "    </skeleton>\n"
            if p == 0:
                x, y, bw, bh = box
                text += (f'    <box label="person_box" source="manual" occluded="0" xtl="{x:.2f}" ytl="{y:.2f}" '
                         f'xbr="{x + bw:.2f}" ybr="{y + bh:.2f}" z_order="0" group_id="1">\n    </box>\n')
        text += "  </image>\n"
    return text + "</annotations>\n"


def cvat_video():
    """CVAT for video 1.1 (README.md §2): one skeleton track over frames 0-2 of a 320x240 video;
    on frame 1 every point is outside (the person left the frame)."""
    img, _, points = PEOPLE[2]
    moved = {n: (x + 4, y + 2, s) for n, (x, y, s) in points.items()}
    gone = {n: (x, y, "out") for n, (x, y, s) in points.items()}
    text = cvat_meta("interpolation", IMAGES[img])
    text += '  <track id="0" label="person" source="manual">\n'
    for frame, pts in ((0, points), (1, gone), (2, moved)):
        text += f'    <skeleton frame="{frame}" keyframe="1" z_order="0">\n{cvat_points(pts, track=True)}\n'
        text += "    </skeleton>\n"
    return text + "  </track>\n</annotations>\n", moved


def cvat_coco_keypoints():
    """CVAT's COCO Keypoints 1.0 export (README.md §3) of the same people: Datumaro's layout."""
    doc = expected(["img_a.jpg", "img_b.jpg"], PEOPLE, use_box=False)
    doc["info"] = {"contributor": "", "date_created": "", "description": "", "url": "", "version": "", "year": ""}
    doc["licenses"] = [{"name": "", "id": 0, "url": ""}]
    doc["categories"][0]["supercategory"] = ""
    for image in doc["images"]:
        image.update({"license": 0, "flickr_url": "", "coco_url": "", "date_captured": 0})
    for ann in doc["annotations"]:
        ann.update({"segmentation": [], "attributes": {"occluded": False, "keyframe": False}})
    return {"licenses": doc["licenses"], "info": doc["info"], "categories": doc["categories"],
            "images": doc["images"], "annotations": doc["annotations"]}


def main():
    dump = lambda doc: json.dumps(doc, indent=1) + "\n"  # noqa: E731
    (HERE / "labelstudio_export.json").write_text(dump(labelstudio()))
    (HERE / "labelstudio_expected_coco.json").write_text(dump(expected(
        ["img_a.jpg", "5e3b2f1a-img_b.jpg"], PEOPLE, description="imported from Label Studio export "
                                                                 "labelstudio_export.json")))
    (HERE / "cvat_images_export.xml").write_text(cvat_images())
    cvat_people = [(img, box if p == 0 else None, pts) for p, (img, box, pts) in enumerate(PEOPLE)]
    (HERE / "cvat_images_expected_coco.json").write_text(dump(expected(
        ["img_a.jpg", "img_b.jpg"], cvat_people, description="imported from CVAT export cvat_images_export.xml")))
    video, moved = cvat_video()
    (HERE / "cvat_video_export.xml").write_text(video)
    frames = ["frame_000000.png", "frame_000001.png", "frame_000002.png"]
    doc = expected(["img_b.jpg"] * 3, [], description="imported from CVAT export cvat_video_export.xml")
    doc["images"] = [{"id": i, "file_name": n, "width": 320, "height": 240} for i, n in enumerate(frames, 1)]
    doc["annotations"] = [coco_person(None, PEOPLE[2][2], 1, 1), coco_person(None, moved, 2, 3)]
    (HERE / "cvat_video_expected_coco.json").write_text(dump(doc))
    (HERE / "cvat_coco_keypoints_export.json").write_text(dump(cvat_coco_keypoints()))


if __name__ == "__main__":
    main()
