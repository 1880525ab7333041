"""Annotation import/export: the failing cases of the round-4 bad-input report (N7, N11, N12, N13,
N18, N19, N20, N28) and the hand-made bugs no test caught (issue 28 item 7): keypoints joining the
largest rectangle, which of several annotations of a task counts, CVAT pre-annotation numbering.

Facts about the formats are those of docs/annotations.md (Label Studio's JSON export, its local
files URL `?d=`, CVAT for images 1.1); every expected value here is written from the input by hand.
"""

import copy
import json
import xml.etree.ElementTree as ET
from urllib.parse import parse_qs, urlparse

import pytest
from conftest import REPO

from vitpose.cli import main as vitpose_main
from vitpose.data.annotation_formats import (
    AnnotationFormatError,
    labelstudio_file_name,
    read_cvat,
    read_labelstudio,
    to_coco,
    to_cvat_xml,
    to_labelstudio_tasks,
)
from vitpose.data.coco_index import build_coco_index
from vitpose.data.errors import DataError
from vitpose.data.metainfo import dataset_info

DATA = REPO / "tests" / "data" / "annotations"
K5 = REPO / "configs" / "demo_k5_skeleton.yaml"
NAMES = ["nose", "left_wrist", "right_wrist", "left_ankle", "right_ankle"]
W, H = 640, 480


# ------------------------------------------------------------------ Label Studio exports by hand

def rect(rid, x, y, w, h):
    """A rectangle region, in pixels of a W x H image (Label Studio stores percent)."""
    return {"id": rid, "type": "rectanglelabels", "from_name": "person", "to_name": "image",
            "original_width": W, "original_height": H, "image_rotation": 0,
            "value": {"x": 100 * x / W, "y": 100 * y / H, "width": 100 * w / W, "height": 100 * h / H,
                      "rotation": 0, "rectanglelabels": ["person"]}}


def point(rid, name, x, y, parent=None):
    region = {"id": rid, "type": "keypointlabels", "from_name": "keypoints", "to_name": "image",
              "original_width": W, "original_height": H, "image_rotation": 0,
              "value": {"x": 100 * x / W, "y": 100 * y / H, "width": 0.75, "keypointlabels": [name]}}
    if parent is not None:
        region["parentID"] = parent
    return region


def task(tid, results, image="/data/local-files/?d=a.jpg", **annotation):
    return {"id": tid, "data": {"image": image},
            "annotations": [{"id": 100 + tid, "was_cancelled": False, "result": results, **annotation}]}


def write(tmp_path, tasks, name="export.json"):
    path = tmp_path / name
    path.write_text(json.dumps(tasks))
    return path


def people(path, skeleton=None):
    """{image file_name: [{keypoint name: (x, y)} per person]} of an import."""
    coco = to_coco(read_labelstudio(path, skeleton) if path.suffix == ".json" else read_cvat(path, skeleton))
    names = coco["categories"][0]["keypoints"]
    files = {image["id"]: image["file_name"] for image in coco["images"]}
    out = {}
    for ann in coco["annotations"]:
        kp = ann["keypoints"]
        out.setdefault(files[ann["image_id"]], []).append(
            {n: (kp[3 * k], kp[3 * k + 1]) for k, n in enumerate(names) if kp[3 * k + 2] > 0})
    return out


def one_line_error(call, *words):
    with pytest.raises(AnnotationFormatError) as e:
        call()
    message = str(e.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, message
    return message


# ------------------------------------------------------------------ item 7: what slipped through

def test_labelstudio_keypoint_joins_the_smallest_containing_rectangle(tmp_path):
    """A child in front of an adult: the child's rectangle lies inside the adult's. A point inside
    both belongs to the child (the smallest rectangle that contains it, docs/annotations.md §2.2);
    listing the child's points first means joining the largest would take them for the adult's."""
    child = [point("c0", "nose", 300, 200), point("c1", "left_wrist", 280, 250)]
    adult = [point("a0", "nose", 250, 60), point("a1", "left_wrist", 150, 300)]
    results = [rect("adult", 100, 20, 400, 440), rect("child", 260, 180, 80, 120)] + child + adult
    path = write(tmp_path, [task(1, results)])
    coco = to_coco(read_labelstudio(path))
    by_box = {tuple(round(v) for v in ann["bbox"]): ann["keypoints"] for ann in coco["annotations"]}
    assert by_box[(260, 180, 80, 120)][:6] == pytest.approx([300, 200, 2, 280, 250, 2], abs=1e-9)
    assert by_box[(100, 20, 400, 440)][:6] == pytest.approx([250, 60, 2, 150, 300, 2], abs=1e-9)


def test_labelstudio_several_annotations_the_newest_counts(tmp_path):
    """Two submitted annotations of one task (two annotators, or a redo). Label Studio's converter
    orders them by `created_at`, newest first; the import takes that newest one, and without
    `created_at` the last in the list (Label Studio lists them as they were made). A cancelled
    (skipped) annotation never counts, even when it is the newest."""
    def ann(aid, x, **extra):
        return {"id": aid, "result": [point(f"p{aid}", "nose", x, 100)], **extra}

    def nose_x(annotations, several=True):
        path = write(tmp_path, [{"id": 7, "data": {"image": "/data/local-files/?d=a.jpg"},
                                 "annotations": annotations}])
        draft = read_labelstudio(path)
        assert any("several annotations" in reason for reason in draft.skipped) == several  # a note says so
        return people(path)["a.jpg"][0]["nose"][0]

    # no created_at: the last in the list
    assert nose_x([ann(1, 10), ann(2, 20), ann(3, 30)]) == pytest.approx(30)
    # created_at: the newest, wherever it is listed (time zones compared as instants)
    assert nose_x([ann(1, 10, created_at="2024-05-02T10:00:00.000000Z"),
                   ann(2, 20, created_at="2024-05-01T10:00:00.000000Z"),
                   ann(3, 30, created_at="2024-05-02T11:30:00+02:00")]) == pytest.approx(10)
    # the newest was skipped: the next newest
    assert nose_x([ann(1, 10, created_at="2024-05-01T10:00:00Z"),
                   ann(2, 20, created_at="2024-05-03T10:00:00Z", was_cancelled=True),
                   ann(3, 30, created_at="2024-05-02T10:00:00Z", skipped=True)], several=False) == pytest.approx(10)


def test_cvat_preannotation_images_numbered_in_lexical_order():
    """CVAT numbers a task's images in lexical order of their names from 0, and its upload matches
    an <image> by name, then by that number (docs/annotations.md §4.2): records in any order get
    the id of their name's place in the sorted names, and each image keeps its own people."""
    names = ["b.jpg", "a.jpg", "dir/c.jpg", "B.jpg", "a.jpg"]  # as predict may meet them
    width = {n: 100 + len(n) for n in names}  # one size per image, told apart by it
    records = [{"file_name": n, "width": width[n], "height": 50, "bbox": [1, 2, 3, 4], "score": 0.9,
                "keypoints": [float(i), 10.0 + i, 0.9] * 2} for i, n in enumerate(names)]
    root = ET.fromstring(to_cvat_xml(records, ["nose", "neck"]))
    images = root.findall("image")
    want_order = ["B.jpg", "a.jpg", "b.jpg", "dir/c.jpg"]  # Python's (code point) order, as CVAT's sort
    assert [(im.get("id"), im.get("name")) for im in images] == [(str(k), n) for k, n in enumerate(want_order)]
    for im in images:
        mine = [i for i, n in enumerate(names) if n == im.get("name")]
        assert im.get("width") == str(width[im.get("name")])
        xs = [float(s.find("points").get("points").split(",")[0]) for s in im.findall("skeleton")]
        assert xs == [float(i) for i in mine]


# ------------------------------------------------------------------ N7: URLs of pre-annotations

STRANGE_NAMES = ["a&b.jpg", "c#1.jpg", "d+e.jpg", "a&b #1+x%20?.jpg", "dir/é 中.jpg", "q=1;x.jpg"]


def test_labelstudio_task_urls_percent_encode_file_names(tmp_path):
    """N7: `?d=a&b.jpg` is read as d=a by any URL parser (Label Studio's server included): the
    task pointed at a missing file and the import renamed the image."""
    records = [{"file_name": n, "width": W, "height": H, "bbox": [10, 10, 100, 200], "score": 0.9,
                "keypoints": [50.0, 60.0, 0.9] * 5} for n in STRANGE_NAMES]
    tasks = to_labelstudio_tasks(records, NAMES)
    urls = [t["data"]["image"] for t in tasks]
    # what a server reads from the query string: the one `d` parameter, percent-decoded
    assert [parse_qs(urlparse(u).query, keep_blank_values=True) for u in urls] == [{"d": [n]} for n in STRANGE_NAMES]
    assert urls[4].startswith("/data/local-files/?d=dir/")  # folders stay readable
    assert [labelstudio_file_name(u) for u in urls] == STRANGE_NAMES
    exported = [{"id": i, "data": t["data"], "annotations": [{"result": t["predictions"][0]["result"]}]}
                for i, t in enumerate(tasks)]
    assert list(people(write(tmp_path, exported), K5)) == STRANGE_NAMES


# ------------------------------------------------------------------ N11: points outside the image

@pytest.mark.parametrize("x_percent, y_percent", [(150, 50), (-50, 50), (50, 100.5), (50, -0.01)])
def test_labelstudio_keypoint_outside_the_image_is_refused(tmp_path, x_percent, y_percent):
    tasks = [task(11, [point("k0", "nose", 10, 10)])]
    tasks[0]["annotations"][0]["result"][0]["value"].update(x=x_percent, y=y_percent)
    path = write(tmp_path, tasks)
    one_line_error(lambda: read_labelstudio(path), "task 11", "result[0].value", "'nose'", "outside the 640 x 480 image")


def test_points_on_the_border_are_inside(tmp_path):
    tasks = [task(11, [point("k0", "nose", 0, 0), point("k1", "left_wrist", W, H)])]
    assert people(write(tmp_path, tasks))["a.jpg"] == [{"nose": (0, 0), "left_wrist": (W, H)}]


@pytest.mark.parametrize("points", ["640.01,80.00", "180.00,-3.00"])
def test_cvat_point_outside_the_image_is_refused(tmp_path, points):
    text = (DATA / "cvat_images_export.xml").read_text()
    assert text.count('points="180.00,80.00"') == 1
    path = tmp_path / "outside.xml"
    path.write_text(text.replace('points="180.00,80.00"', f'points="{points}"'))
    one_line_error(lambda: read_cvat(path), "image 'img_a.jpg' skeleton [0]", "'points'", "outside the 640 x 480")


def test_preannotation_points_past_the_border_are_placed_on_it_and_marked(tmp_path):
    """A crop around a person at the border reaches past the image, and so can a prediction. The
    tools show no point there, and the import refuses one: it is put on the edge and marked."""
    rec = {"file_name": "a.jpg", "width": W, "height": H, "bbox": [0, 0, 100, 100], "score": 0.9,
           "keypoints": [-7.5, 20.0, 0.9, 700.0, 490.0, 0.95, 30.0, 40.0, 0.9] + [30.0, 40.0, 0.9] * 2}
    result = to_labelstudio_tasks([rec], NAMES)[0]["predictions"][0]["result"]
    points = [r for r in result if r["type"] == "keypointlabels"]
    assert [(p["value"]["x"], p["value"]["y"]) for p in points[:3]] == [(0.0, 100 * 20 / H), (100.0, 100.0),
                                                                       (100 * 30 / W, 100 * 40 / H)]
    assert ["placed on its edge" in " ".join(p.get("meta", {}).get("text", [])) for p in points[:3]] == \
           [True, True, False]
    root = ET.fromstring(to_cvat_xml([rec], NAMES))
    pts = root.find("image/skeleton").findall("points")
    assert [(p.get("points"), p.get("occluded")) for p in pts[:3]] == [("0.00,20.00", "1"), ("640.00,480.00", "1"),
                                                                      ("30.00,40.00", "0")]


# ------------------------------------------------------------------ N12: one image twice

def test_labelstudio_image_in_two_tasks_is_refused(tmp_path):
    tasks = [task(11, [point("k0", "nose", 10, 10)]), task(12, [point("k0", "nose", 20, 20)],
                                                            image="/data/local-files/?d=b.jpg"),
             task(13, [point("k0", "nose", 30, 30)])]  # 13 duplicates 11's a.jpg
    path = write(tmp_path, tasks)
    one_line_error(lambda: read_labelstudio(path), "'a.jpg' appears twice (task 11 and task 13)", "data.image")


def test_cvat_image_named_twice_is_refused(tmp_path):
    text = (DATA / "cvat_images_export.xml").read_text()
    path = tmp_path / "twice.xml"
    path.write_text(text.replace('name="img_b.jpg"', 'name="img_a.jpg"'))
    one_line_error(lambda: read_cvat(path), "'img_a.jpg' appears twice (image id 0 and image id 1)", "'name'")


# ------------------------------------------------------------------ N13: a URL without a file name

@pytest.mark.parametrize("url", ["http://host/", "/data/local-files/?d=", "/data/local-files/?d=photos/",
                                 "https://host/a/..", "/data/local-files/?d=photos/.", ""])
def test_image_url_without_a_file_name_is_refused(tmp_path, url):
    path = write(tmp_path, [task(11, [point("k0", "nose", 10, 10)], image=url)])
    one_line_error(lambda: read_labelstudio(path), "task 11", "data.image", "names no file")


# ------------------------------------------------------------------ N18: hostile JSON

def test_deeply_nested_json_is_refused(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    one_line_error(lambda: read_labelstudio(path), "nested too deeply", str(path))


@pytest.mark.parametrize("key", ["id", "parentID"])
def test_region_id_that_is_not_a_string_is_refused(tmp_path, key):
    results = [rect("box0", 10, 10, 300, 300), point("k0", "nose", 20, 20, parent="box0")]
    results[0 if key == "id" else 1][key] = ["box0"]
    path = write(tmp_path, [task(11, results)])
    one_line_error(lambda: read_labelstudio(path), "task 11", f"result[{0 if key == 'id' else 1}].{key}",
                   "must be a string")


# one of each kind a field could wrongly hold: null, bool, numbers out of any range, text, containers
HOSTILE_JSON = [None, True, -1, 1e308, 10**400, "x", ["a"], {"a": ["b"]}]


def _json_paths(value, path=()):
    """Every (path, value) below `value`: dict keys and list indices."""
    yield path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield from _json_paths(child, path + (key,))


def test_labelstudio_export_with_any_field_replaced_reads_or_says_why(monkeypatch):
    """N18, as a property: every field of the example export (and the export itself) replaced by
    each of a set of hostile values imports or raises the one-line error; never another exception.
    The edited exports are handed over as parsed JSON (what json.loads returns for their text):
    writing 4000 files would take most of this test's time."""
    from vitpose.data import labelstudio

    text = (DATA / "labelstudio_export.json").read_text()
    skeleton = dataset_info(K5)  # read once
    seen = 0
    for where, _ in list(_json_paths(json.loads(text))):
        for value in HOSTILE_JSON:
            edited = json.loads(text)
            if where:
                parent = edited
                for key in where[:-1]:
                    parent = parent[key]
                parent[where[-1]] = copy.deepcopy(value)
            else:
                edited = value
            monkeypatch.setattr(labelstudio, "_load_json", lambda path, edited=edited: edited)
            try:
                read_labelstudio("fuzz.json", skeleton)
            except AnnotationFormatError as e:
                assert "\n" not in str(e)
            seen += 1
    assert seen > 2000


# ------------------------------------------------------------------ N19: CVAT numbers

@pytest.mark.parametrize("old, new, words", [
    ('frame="0"', 'frame="²"', ["track 0", "'frame'", "'²'"]),
    ('frame="0"', 'frame="١"', ["track 0", "'frame'"]),
    ('<width>320</width>', '<width>3²</width>', ["original_size", "'width'"]),
    ('frame="0"', 'frame="-1"', ["track 0", "'frame'"]),
    ('frame="0"', f'frame="{"9" * 5000}"', ["track 0", "'frame'", "(5000 characters)"]),
])
def test_cvat_numbers_are_ascii_digits(tmp_path, old, new, words):
    text = (DATA / "cvat_video_export.xml").read_text()
    assert old in text
    path = tmp_path / "bad.xml"
    path.write_text(text.replace(old, new, 1))
    one_line_error(lambda: read_cvat(path), *words)


HOSTILE_ATTRS = ["", "²", "-1", "nan", "1e400", "99999999999999999999", "9" * 5000, "x,1"]


@pytest.mark.parametrize("export", ["cvat_images_export.xml", "cvat_video_export.xml"])
def test_cvat_export_with_any_attribute_replaced_reads_or_says_why(monkeypatch, export):
    """Every attribute and element text of the example CVAT files replaced by each hostile string:
    the import works or raises the one-line error (N19 as a property). The edited trees are handed
    over parsed (attribute values are strings either way), as in the Label Studio test above."""
    from types import SimpleNamespace

    from vitpose.data import cvat

    original = ET.parse(DATA / export).getroot()
    cases = 0
    for k, element in enumerate(original.iter()):
        slots = [("attr", name) for name in element.attrib] + ([("text", None)] if (element.text or "").strip() else [])
        for kind, name in slots:
            for value in HOSTILE_ATTRS:
                root = copy.deepcopy(original)
                target = list(root.iter())[k]
                if kind == "attr":
                    target.set(name, value)
                else:
                    target.text = value
                parsed = SimpleNamespace(parse=lambda path, root=root: ET.ElementTree(root), ParseError=ET.ParseError)
                monkeypatch.setattr(cvat, "ET", parsed)
                try:
                    read_cvat("fuzz.xml")
                except AnnotationFormatError as e:
                    assert "\n" not in str(e)
                cases += 1
    assert cases > 500


# ------------------------------------------------------------------ N20: the other tool's file

def test_wrong_format_flag_is_named(tmp_path, capsys):
    for src, fmt, words in ((DATA / "cvat_images_export.xml", "labelstudio", "looks like a CVAT XML export: use --format cvat"),
                            (DATA / "labelstudio_export.json", "cvat", "use --format labelstudio")):
        code = vitpose_main(["import-annotations", str(src), "--format", fmt, "--out", str(tmp_path / "o.json")])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and words in err and "'--format'" in err, err
    # a broken file of the right tool still says what is broken
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    one_line_error(lambda: read_labelstudio(broken), "not readable JSON")


# ------------------------------------------------------------------ N28: sizes no camera makes

@pytest.mark.parametrize("width", [1e20, 10**20, 1e300, 20000 * 20000])
def test_labelstudio_absurd_image_size_is_refused(tmp_path, width):
    results = [point("k0", "nose", 10, 10)]
    results[0]["original_width"] = width
    path = write(tmp_path, [task(11, results)])
    one_line_error(lambda: read_labelstudio(path), "task 11", "original_width", "not a plausible image size")


def test_pixel_limit_of_the_environment_applies_to_the_import(tmp_path, monkeypatch):
    results = [point("k0", "nose", 10, 10)]
    results[0]["original_width"] = results[0]["original_height"] = 20000  # 400 megapixels
    path = write(tmp_path, [task(11, results)])
    one_line_error(lambda: read_labelstudio(path), "20000 x 20000", "150 megapixels", "VITPOSE_MAX_PIXELS")
    monkeypatch.setenv("VITPOSE_MAX_PIXELS", "0")  # the documented way to allow huge images
    assert list(people(path)) == ["a.jpg"]


@pytest.mark.parametrize("width, words", [("2147483648", "not a plausible image size"),
                                          ("100000000000000000000", "a whole number below 10^18"),
                                          ("9" * 5000, "(5000 characters)")])
def test_cvat_absurd_image_size_is_refused(tmp_path, width, words):
    text = (DATA / "cvat_images_export.xml").read_text()
    path = tmp_path / "wide.xml"
    path.write_text(text.replace('name="img_b.jpg" width="320"', f'name="img_b.jpg" width="{width}"'))
    one_line_error(lambda: read_cvat(path), "image id 1", "'width'", words)


@pytest.mark.parametrize("field, value, words", [
    ("width", 10**20, ["not a plausible image size", "'width'", "image id 1"]),
    ("width", 1e300, ["not a plausible image size", "'width'"]),
    ("id", 10**20, ["out of range", "images[0]", "'id'"]),
])
def test_coco_reader_names_an_absurd_number(tmp_path, field, value, words):
    """N28, the reading side: check-data and training read the file through build_coco_index; an
    int64 overflow there was a traceback."""
    data = json.loads((DATA / "cvat_images_expected_coco.json").read_text())
    data["images"][0][field] = value
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(data))
    with pytest.raises(DataError) as e:
        build_coco_index(path, num_keypoints=5)
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    for word in words:
        assert word in str(e.value), str(e.value)


def test_check_data_names_the_absurd_size(tmp_path, capsys):
    data = json.loads((DATA / "cvat_images_expected_coco.json").read_text())
    data["images"][0]["width"] = 10**20
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(data))
    sets = [f"data.train_ann={path}", f"data.val_ann={path}", f"data.dataset_info={path}",
            "data.synthetic_train_images=0", "data.synthetic_val_images=0", "data.val_bbox_file=null"]
    code = vitpose_main(["check-data", "--config", str(REPO / "configs" / "demo_k5.yaml"),
                         *[a for s in sets for a in ("--set", s)]])
    out = capsys.readouterr()
    assert code != 0 and "Traceback" not in out.err
    assert "not a plausible image size" in out.out and "record image id 1, field 'width'" in out.out, out.out

