"""Annotation tools in and out (docs/annotations.md): Label Studio and CVAT exports -> COCO keypoint
files, and prediction records -> pre-annotations that come back through the import.

The example exports in tests/data/annotations/ were written from each tool's documented format
and their expected COCO files from the same pixels without vitpose (that folder's README.md).
"""

import json
import shutil

import cv2
import numpy as np
import pytest
from conftest import REPO

from vitpose.cli import main as vitpose_main
from vitpose.data.annotation_formats import (
    AnnotationFormatError,
    read_cvat,
    read_labelstudio,
    to_coco,
    to_cvat_xml,
    to_labelstudio_tasks,
)
from vitpose.data.coco_index import build_coco_index
from vitpose.data.errors import DataError
from vitpose.data.metainfo import dataset_info
from vitpose.errors import UserError

DATA = REPO / "tests" / "data" / "annotations"
K5 = REPO / "configs" / "demo_k5_skeleton.yaml"
NAMES = ["nose", "left_wrist", "right_wrist", "left_ankle", "right_ankle"]
# Label Studio percent -> pixels is one multiplication and one division in float64.
FLOAT_TOL = 1e-9
CVAT_TOL = 0.005 + 1e-9  # CVAT writes two decimals (docs/annotations.md §3.1)


def assert_coco_equal(got, want, atol):
    assert got["images"] == want["images"]
    assert got["categories"] == want["categories"]
    assert len(got["annotations"]) == len(want["annotations"])
    for a, b in zip(got["annotations"], want["annotations"]):
        assert {k: a[k] for k in ("id", "image_id", "category_id", "num_keypoints", "iscrowd")} == \
               {k: b[k] for k in ("id", "image_id", "category_id", "num_keypoints", "iscrowd")}
        np.testing.assert_allclose(a["keypoints"], b["keypoints"], rtol=0, atol=atol)
        assert a["keypoints"][2::3] == b["keypoints"][2::3]  # visibility exactly
        np.testing.assert_allclose(a["bbox"], b["bbox"], rtol=0, atol=atol)
        np.testing.assert_allclose(a["area"], b["area"], rtol=1e-9)


@pytest.mark.parametrize("fmt, export, expected, skeleton", [
    ("labelstudio", "labelstudio_export.json", "labelstudio_expected_coco.json", K5),
    ("cvat", "cvat_images_export.xml", "cvat_images_expected_coco.json", None),
    ("cvat", "cvat_video_export.xml", "cvat_video_expected_coco.json", None),
])
def test_example_export_gives_expected_coco(fmt, export, expected, skeleton, tmp_path, capsys):
    out = tmp_path / "train.json"
    argv = ["import-annotations", str(DATA / export), "--format", fmt, "--out", str(out)]
    code = vitpose_main(argv + (["--skeleton", str(skeleton)] if skeleton else []))
    assert code == 0, capsys.readouterr().err
    assert_coco_equal(json.loads(out.read_text()), json.loads((DATA / expected).read_text()), FLOAT_TOL)
    assert "written:" in capsys.readouterr().out


def test_labelstudio_visibility_grouping_and_skips():
    draft = read_labelstudio(DATA / "labelstudio_export.json")
    # without --skeleton: the names in the order they first appear, no limbs
    assert draft.names == NAMES and draft.limbs == []
    assert draft.skipped == {"tasks without an annotation (not labelled yet)": 1}
    coco = to_coco(draft)
    # task 11 (img_a): person 0 by parentID, person 1 by containment; the cancelled annotation is ignored
    assert [img["file_name"] for img in coco["images"]] == ["img_a.jpg", "5e3b2f1a-img_b.jpg"]
    second = coco["annotations"][1]
    assert second["keypoints"][2::3] == [2, 1, 2, 2, 0]  # occluded by its per-region choice; ankle absent
    assert second["bbox"] == pytest.approx([320, 60, 192, 384], abs=FLOAT_TOL)
    # task 12 has no rectangle: one person, box = the extent of its labelled points
    assert coco["annotations"][2]["bbox"] == pytest.approx([96, 40, 128, 184], abs=FLOAT_TOL)


def test_cvat_coco_keypoints_export_loads_as_it_is():
    """CVAT's COCO Keypoints 1.0 export needs no import (docs/annotations.md §3.3)."""
    path = DATA / "cvat_coco_keypoints_export.json"
    info = dataset_info(path)
    assert info.keypoint_names == tuple(NAMES)
    assert info.skeleton == ((0, 1), (0, 2), (0, 3), (0, 4))
    assert info.flip_pairs == ((1, 2), (3, 4))
    index = build_coco_index(path, num_keypoints=5)
    imported = to_coco(read_cvat(DATA / "cvat_images_export.xml"))
    want = np.array([a["keypoints"] for a in imported["annotations"]], np.float32).reshape(-1, 5, 3)
    np.testing.assert_allclose(index.keypoints, want[..., :2], atol=CVAT_TOL)
    np.testing.assert_array_equal(index.keypoints_visible, np.minimum(1, want[..., 2]))


def _records(rng, names, images=(("a.jpg", 640, 480), ("b.jpg", 333, 251))):
    """Prediction records as `vitpose predict --json` writes them (plus the image size)."""
    records = []
    for file_name, w, h in images:
        for _ in range(2):
            x0, y0 = rng.uniform(0, w / 2), rng.uniform(0, h / 2)
            bw, bh = rng.uniform(20, w / 2), rng.uniform(20, h / 2)
            kx, ky = rng.uniform(x0, x0 + bw, len(names)), rng.uniform(y0, y0 + bh, len(names))
            scores = rng.uniform(0, 1, len(names))
            flat = np.stack([kx, ky, scores], 1).ravel().tolist()
            records.append({"image_id": 0, "file_name": file_name, "width": w, "height": h, "category_id": 1,
                            "bbox": [x0, y0, bw, bh], "keypoints": flat, "bbox_score": 0.9, "score": 0.8})
    return records


def test_predictions_to_labelstudio_and_back(tmp_path):
    rng = np.random.default_rng(0)
    records = _records(rng, NAMES)
    tasks = to_labelstudio_tasks(records, NAMES, mark_below=0.3)
    marked = [r for t in tasks for r in t["predictions"][0]["result"] if "meta" in r]
    scores = np.array([rec["keypoints"][2::3] for rec in records]).ravel()
    assert len(marked) == int(np.sum(scores < 0.3)) > 0  # marked, not dropped
    assert all(r["score"] < 0.3 and "low confidence" in r["meta"]["text"][0] for r in marked)
    # An annotator accepts the predictions: Label Studio copies their result into an annotation.
    exported = [{"id": i, "data": t["data"], "annotations": [{"id": i, "was_cancelled": False,
                                                              "result": t["predictions"][0]["result"]}]}
                for i, t in enumerate(tasks)]
    path = tmp_path / "export.json"
    path.write_text(json.dumps(exported))
    coco = to_coco(read_labelstudio(path, K5))
    assert [img["file_name"] for img in coco["images"]] == ["a.jpg", "b.jpg"]
    got = np.array([a["keypoints"] for a in coco["annotations"]]).reshape(-1, 5, 3)
    want = np.array([r["keypoints"] for r in records]).reshape(-1, 5, 3)
    np.testing.assert_allclose(got[..., :2], want[..., :2], rtol=FLOAT_TOL, atol=0)
    assert np.all(got[..., 2] == 2)  # Label Studio has no visibility flag
    np.testing.assert_allclose([a["bbox"] for a in coco["annotations"]], [r["bbox"] for r in records],
                               rtol=FLOAT_TOL)


def test_predictions_to_cvat_and_back(tmp_path):
    rng = np.random.default_rng(1)
    records = _records(rng, NAMES)
    limbs = [(0, 1), (0, 2), (0, 3), (0, 4)]
    path = tmp_path / "annotations.xml"
    path.write_text(to_cvat_xml(records, NAMES, limbs, mark_below=0.4))
    draft = read_cvat(path)
    assert draft.names == NAMES and draft.limbs == [(NAMES[a], NAMES[b]) for a, b in limbs]
    coco = to_coco(draft)
    got = np.array([a["keypoints"] for a in coco["annotations"]]).reshape(-1, 5, 3)
    want = np.array([r["keypoints"] for r in records]).reshape(-1, 5, 3)
    np.testing.assert_allclose(got[..., :2], want[..., :2], rtol=0, atol=CVAT_TOL)
    # a low-confidence keypoint is marked occluded, so it comes back as visibility 1
    np.testing.assert_array_equal(got[..., 2], np.where(want[..., 2] < 0.4, 1, 2))
    assert [img["file_name"] for img in coco["images"]] == ["a.jpg", "b.jpg"]


def test_check_data_passes_on_an_imported_file(tmp_path, capsys):
    root = tmp_path / "data"
    (root / "images").mkdir(parents=True)
    out = root / "annotations" / "train.json"
    assert vitpose_main(["import-annotations", str(DATA / "labelstudio_export.json"), "--format", "labelstudio",
                         "--skeleton", str(K5), "--out", str(out)]) == 0
    for image in json.loads(out.read_text())["images"]:
        pixels = np.random.default_rng(image["id"]).integers(0, 255, (image["height"], image["width"], 3), np.uint8)
        assert cv2.imwrite(str(root / "images" / image["file_name"]), pixels)
    capsys.readouterr()
    sets = ["data.train_ann=annotations/train.json", "data.val_ann=annotations/train.json",
            "data.train_images=images", "data.val_images=images", "data.dataset_info=annotations/train.json",
            "data.synthetic_train_images=0", "data.synthetic_val_images=0", "data.val_bbox_file=null"]
    code = vitpose_main(["check-data", "--config", str(REPO / "configs" / "demo_k5.yaml"), "--data-root", str(root),
                         "--all", *[a for s in sets for a in ("--set", s)]])
    report = capsys.readouterr().out
    assert code == 0, report
    assert "2 of 2 images decoded" in report and "0 error(s)" in report
    assert "model 5, skeleton 5" in report and "2 flip pairs, 4 limbs" in report


def test_out_that_is_the_input_is_refused_before_the_work(tmp_path, capsys):
    src = tmp_path / "export.json"
    shutil.copy(DATA / "labelstudio_export.json", src)
    before = src.read_bytes()
    code = vitpose_main(["import-annotations", str(src), "--format", "labelstudio", "--out", str(src)])
    err = capsys.readouterr().err
    assert code == 2 and "is an input file" in err and err.count("\n") == 1
    assert src.read_bytes() == before


def _edit_labelstudio(tmp_path, edit):
    tasks = json.loads((DATA / "labelstudio_export.json").read_text())
    edit(tasks)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(tasks))
    return path


def _result(tasks, task, kind, k=0):
    return [r for r in tasks[task]["annotations"][-1]["result"] if r["type"] == kind][k]


@pytest.mark.parametrize("edit, words", [
    (lambda t: _result(t, 0, "keypointlabels").__setitem__("value", {"x": "12%", "y": 3,
                                                                    "keypointlabels": ["nose"]}),
     ["task 11", "result[1].value.x", "finite number"]),
    (lambda t: _result(t, 1, "keypointlabels").pop("original_width"), ["task 12", "original_width"]),
    (lambda t: _result(t, 0, "keypointlabels").__setitem__("parentID", "nope"),
     ["task 11", "parentID", "'nope' names no rectangle"]),
    (lambda t: _result(t, 0, "keypointlabels", 6).__setitem__("value", {"x": 99, "y": 1,
                                                                       "keypointlabels": ["nose"]}),
     ["task 11", "lies in no rectangle"]),
    (lambda t: _result(t, 0, "rectanglelabels").__getitem__("value").__setitem__("rotation", 30),
     ["task 11", "value.rotation", "rotated"]),
    (lambda t: _result(t, 1, "keypointlabels").__getitem__("value").__setitem__("keypointlabels", []),
     ["task 12", "keypointlabels", "exactly one"]),
    (lambda t: t[1].pop("data"), ["task 12", "'data'"]),
    (lambda t: _result(t, 1, "keypointlabels", 1).__setitem__("original_width", 999),
     ["task 12", "disagree on the image size"]),
])
def test_malformed_labelstudio_export_names_task_and_field(tmp_path, edit, words):
    path = _edit_labelstudio(tmp_path, edit)
    with pytest.raises(AnnotationFormatError) as e:
        read_labelstudio(path, K5)
    message = str(e.value)
    assert "\n" not in message and str(path) in message
    for word in words:
        assert word in message, message
    assert isinstance(e.value, UserError) and isinstance(e.value, DataError)


def test_labelstudio_unknown_keypoint_name_and_bad_json(tmp_path):
    path = _edit_labelstudio(tmp_path, lambda t: _result(t, 0, "keypointlabels")["value"].__setitem__(
        "keypointlabels", ["neck"]))
    with pytest.raises(AnnotationFormatError, match=r"keypoints \['neck'\] are not in the skeleton 'demo_k5'"):
        read_labelstudio(path, K5)
    path.write_text("[{")
    with pytest.raises(AnnotationFormatError, match="not readable JSON"):
        read_labelstudio(path)
    path.write_text(json.dumps([{"id": 1, "image": "/data/upload/1/a.jpg", "keypoints": []}]))  # JSON-MIN
    with pytest.raises(AnnotationFormatError, match="no labelled task among 1.*not JSON-MIN"):
        read_labelstudio(path)
    path.write_text("3")
    with pytest.raises(AnnotationFormatError, match="is a list of tasks"):
        read_labelstudio(path)


def _edit_cvat(tmp_path, old, new, name="cvat_images_export.xml", count=1):
    text = (DATA / name).read_text()
    assert old in text
    path = tmp_path / "bad.xml"
    path.write_text(text.replace(old, new, count))
    return path


@pytest.mark.parametrize("old, new, words", [
    ('points="180.00,80.00"', 'points="180.00;80.00"', ["image 'img_a.jpg' skeleton [0]", "'points'", "nose"]),
    ('points="180.00,80.00"', 'points="180.00,80.00;1.00,2.00"', ["image 'img_a.jpg' skeleton [0]", "'points'"]),
    ('points="180.00,80.00"', 'points="abc,80.00"', ["image 'img_a.jpg' skeleton [0]", "finite number"]),
    ('name="img_b.jpg" width="320"', 'name="img_b.jpg" width="wide"', ["image id 1", "'width'"]),
    ('name="img_b.jpg"', 'name=""', ["image id 1", "'name'"]),
    ('outside="0" occluded="0" points="180.00', 'outside="yes" occluded="0" points="180.00',
     ["image 'img_a.jpg' skeleton [0]", "'outside'"]),
    ('data-node-to="5"', 'data-node-to="9"', ["an edge joins node 1 and 9", "svg"]),
    ("<annotations>", "<annotation>", ["not readable XML"]),
])
def test_malformed_cvat_export_names_image_and_field(tmp_path, old, new, words):
    path = _edit_cvat(tmp_path, old, new)
    with pytest.raises(AnnotationFormatError) as e:
        read_cvat(path)
    message = str(e.value)
    assert "\n" not in message and str(path) in message
    for word in words:
        assert word in message, message


def test_cvat_label_choice_and_video_without_size(tmp_path):
    path = _edit_cvat(tmp_path, '<skeleton label="person"', '<skeleton label="hand"')
    with pytest.raises(AnnotationFormatError, match=r"several skeleton labels \['hand', 'person'\].*--label"):
        read_cvat(path)
    assert len(to_coco(read_cvat(path, label="hand"))["annotations"]) == 1
    with pytest.raises(AnnotationFormatError, match="no skeleton label 'dog'"):
        read_cvat(path, label="dog")
    path = _edit_cvat(tmp_path, "<original_size>", "<size_of_frames>", name="cvat_video_export.xml")
    path.write_text(path.read_text().replace("</original_size>", "</size_of_frames>"))
    with pytest.raises(AnnotationFormatError, match="frame 0 has no <image id='0'>.*record track 0, field 'original_size'"):
        read_cvat(path)


def test_cli_error_is_one_line_and_exit_2(tmp_path, capsys):
    path = _edit_cvat(tmp_path, 'points="180.00,80.00"', 'points="x"')
    out = tmp_path / "train.json"
    code = vitpose_main(["import-annotations", str(path), "--format", "cvat", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("vitpose import-annotations: error: ") and err.count("\n") == 1
    assert "image 'img_a.jpg' skeleton [0]" in err and not out.exists()


def test_predict_format_labelstudio_and_cvat_round_trip(tmp_path, coco_mini_dir, capsys):
    """`vitpose predict --format labelstudio|cvat` writes the same keypoints as `--format coco`,
    in a form the import reads back (docs/annotations.md §4, §5)."""
    from test_evaluate import tiny_model, write_config

    import vitpose
    from vitpose.inference.pipeline import read_records

    weights = tmp_path / "tiny.safetensors"
    vitpose.save_weights(tiny_model(seed=11), weights)
    config = write_config(tmp_path, coco_mini_dir)
    images = tmp_path / "images"
    images.mkdir()
    shutil.copy(coco_mini_dir / "000000000785.jpg", images / "000000000785.jpg")  # one image: seconds of CPU
    base = ["predict", str(images), "--config", str(config), "--model", str(weights), "--detector", "full-frame",
            "--device", "cpu"]
    outs = {fmt: tmp_path / f"out_{fmt}.{'xml' if fmt == 'cvat' else 'json'}" for fmt in ("coco", "labelstudio", "cvat")}
    for fmt, out in outs.items():
        assert vitpose_main(base + ["--format", fmt, "--json", str(out), "--mark-below", "0.5"]) == 0, \
            capsys.readouterr().err
    coco = read_records(outs["coco"])  # JSON Lines
    want = np.array([r["keypoints"] for r in coco]).reshape(-1, 17, 3)
    # The tiny random model puts points past the border (its crops reach outside the image): the
    # pre-annotations place those on the image's edge and mark them (docs/annotations.md §4).
    height, width = cv2.imread(str(images / "000000000785.jpg")).shape[:2]
    size = np.array([width, height], np.float64)
    on_image = np.clip(want[..., :2], 0, size)
    moved = np.any(on_image != want[..., :2], axis=-1)
    assert moved.any() and not moved.all()  # both kinds of point are exercised
    tasks = json.loads(outs["labelstudio"].read_text())
    exported = [{"id": i, "data": t["data"], "annotations": [{"result": t["predictions"][0]["result"]}]}
                for i, t in enumerate(tasks)]
    ls_export = tmp_path / "ls_export.json"
    ls_export.write_text(json.dumps(exported))
    for draft, atol in ((read_labelstudio(ls_export, "coco"), 1e-9 * 640), (read_cvat(outs["cvat"]), CVAT_TOL)):
        back = to_coco(draft)
        assert [i["file_name"] for i in back["images"]] == ["000000000785.jpg"]
        assert back["categories"][0]["keypoints"] == list(dataset_info("coco").keypoint_names)
        got = np.array([a["keypoints"] for a in back["annotations"]]).reshape(-1, 17, 3)
        np.testing.assert_allclose(got[..., :2], on_image, rtol=0, atol=atol)
    assert np.array_equal(got[..., 2], np.where((want[..., 2] < 0.5) | moved, 1, 2))  # CVAT: marked = occluded
    marked = {r["id"]: r["meta"]["text"] for r in tasks[0]["predictions"][0]["result"] if "meta" in r}
    assert sum("placed on its edge" in " ".join(t) for t in marked.values()) == int(moved.sum())
    assert vitpose_main(base + ["--format", "cvat"]) == 2 and "give --json" in capsys.readouterr().err


def test_writers_name_a_bad_prediction_record():
    record = {"file_name": "a.jpg", "width": 64, "height": 48, "bbox": [1, 2, 3, 4], "keypoints": [1.0, 2.0, 0.5]}
    with pytest.raises(AnnotationFormatError, match=r"prediction record \[1\], field 'width'"):
        to_labelstudio_tasks([record, {k: v for k, v in record.items() if k != "width"}], ["nose"])
    with pytest.raises(AnnotationFormatError, match=r"must hold 6 numbers.*a.jpg person 0, field 'keypoints'"):
        to_cvat_xml([record], ["nose", "neck"])
