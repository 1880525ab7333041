"""The calibrated fields (`p`, `visibility`) through every writer and reader of prediction records
(docs/calibration.md §5): Label Studio and CVAT pre-annotations and their imports, the COCO
results readers, `--mark-below` by p, and records without the fields exactly as before."""

import json

import numpy as np
import pytest
from conftest import REPO

from vitpose.data.annotation_formats import (
    AnnotationFormatError,
    read_cvat,
    read_labelstudio,
    to_coco,
    to_cvat_xml,
    to_labelstudio_tasks,
)

K5 = REPO / "configs" / "demo_k5_skeleton.yaml"
NAMES = ["nose", "left_wrist", "right_wrist", "left_ankle", "right_ankle"]
CVAT_TOL = 0.005 + 1e-9  # CVAT writes two decimals
P_TOL = 0.0005 + 1e-12  # CVAT keeps p in thousandths


def calibrated_records(seed: int = 0, calibrated: bool = True) -> list[dict]:
    """Records as `vitpose predict --json` writes them for two images, two people each, with (or
    without) the calibrated fields; every visibility state appears."""
    rng = np.random.default_rng(seed)
    records = []
    for file_name, w, h in (("a.jpg", 320, 240), ("b.jpg", 200, 300)):
        for _ in range(2):
            x0, y0 = rng.uniform(0, w / 2), rng.uniform(0, h / 2)
            bw, bh = rng.uniform(20, w / 2), rng.uniform(20, h / 2)
            kx, ky = rng.uniform(x0, x0 + bw, 5), rng.uniform(y0, y0 + bh, 5)
            flat = np.stack([kx, ky, rng.uniform(0, 1, 5)], 1).ravel().tolist()
            record = {"image_id": 0, "file_name": file_name, "width": w, "height": h, "category_id": 1,
                      "bbox": [x0, y0, bw, bh], "keypoints": flat, "bbox_score": 0.9, "score": 0.8}
            if calibrated:
                record["p"] = [round(float(v), 4) for v in rng.uniform(0, 1, 5)]
                record["visibility"] = [2, 1, 0, 2, int(rng.integers(0, 3))]
            records.append(record)
    return records


def accepted(tasks: list[dict]) -> list[dict]:
    """An annotator accepts the predictions: Label Studio copies their result into an annotation."""
    return [{"id": i, "data": t["data"], "annotations": [{"id": i, "was_cancelled": False,
                                                          "result": t["predictions"][0]["result"]}]}
            for i, t in enumerate(tasks)]


def check_round_trip(coco: dict, records: list[dict], xy_tol: float, p_tol: float) -> None:
    got = np.array([a["keypoints"] for a in coco["annotations"]]).reshape(-1, 5, 3)
    want = np.array([r["keypoints"] for r in records]).reshape(-1, 5, 3)
    visibility = np.array([r["visibility"] for r in records])
    np.testing.assert_array_equal(got[..., 2], visibility)
    placed = visibility > 0
    np.testing.assert_allclose(got[..., :2][placed], want[..., :2][placed], rtol=0, atol=xy_tol)
    return got


def test_labelstudio_round_trip_of_p_and_visibility(tmp_path):
    records = calibrated_records()
    tasks = to_labelstudio_tasks(records, NAMES, mark_below=0.3)
    result = [r for t in tasks for r in t["predictions"][0]["result"]]
    choices = [r for r in result if r["type"] == "choices"]
    points = {r["id"]: r for r in result if r["type"] == "keypointlabels"}
    # occluded: the per-region choice on the point's id; absent: no point
    assert sorted(c["id"] for c in choices) == sorted(
        f"t{i // 2}p{i % 2}k{k}" for i, r in enumerate(records) for k, v in enumerate(r["visibility"]) if v == 1)
    assert all(c["from_name"] == "visibility" and c["value"]["choices"] == ["occluded"] for c in choices)
    assert len(points) == sum(v > 0 for r in records for v in r["visibility"])
    # --mark-below compares p where the records carry it
    for i, r in enumerate(records):
        for k, v in enumerate(r["visibility"]):
            if v:
                point = points[f"t{i // 2}p{i % 2}k{k}"]
                assert point["meta"]["p"] == r["p"][k] and point["score"] == r["keypoints"][3 * k + 2]
                assert ("text" in point["meta"]) == (r["p"][k] < 0.3)
    path = tmp_path / "export.json"
    path.write_text(json.dumps(accepted(tasks)))
    coco = to_coco(read_labelstudio(path, K5))
    check_round_trip(coco, records, 1e-9 * 320, 0)
    for annotation, record in zip(coco["annotations"], records):
        assert annotation["p"] == [p if v > 0 else None for p, v in zip(record["p"], record["visibility"])]


def test_cvat_round_trip_of_p_and_visibility(tmp_path):
    records = calibrated_records(1)
    text = to_cvat_xml(records, NAMES, [(0, 1)], mark_below=0.3)
    assert "<name>p_permille</name>" in text and 'outside="1"' in text
    path = tmp_path / "annotations.xml"
    path.write_text(text)
    coco = to_coco(read_cvat(path))
    check_round_trip(coco, records, CVAT_TOL, P_TOL)
    for annotation, record in zip(coco["annotations"], records):
        np.testing.assert_allclose(annotation["p"], record["p"], rtol=0, atol=P_TOL)


@pytest.mark.parametrize("fmt", ["labelstudio", "cvat"])
def test_records_without_the_fields_write_and_read_as_before(fmt, tmp_path):
    """No calibration: no p anywhere, the low-score points marked (Label Studio's note, CVAT's
    occluded flag) exactly as the writers always did."""
    records = calibrated_records(2, calibrated=False)
    if fmt == "labelstudio":
        tasks = to_labelstudio_tasks(records, NAMES, mark_below=0.3)
        result = [r for t in tasks for r in t["predictions"][0]["result"]]
        assert not any(r["type"] == "choices" or "p" in r.get("meta", {}) for r in result)
        path = tmp_path / "export.json"
        path.write_text(json.dumps(accepted(tasks)))
        coco = to_coco(read_labelstudio(path, K5))
        want_v = 2
    else:
        text = to_cvat_xml(records, NAMES, mark_below=0.3)
        assert "<attribute>" not in text and "<attribute name" not in text and 'outside="1"' not in text
        path = tmp_path / "annotations.xml"
        path.write_text(text)
        coco = to_coco(read_cvat(path))
        want_v = np.where(np.array([r["keypoints"][2::3] for r in records]) < 0.3, 1, 2)
    assert not any("p" in a for a in coco["annotations"])
    got = np.array([a["keypoints"][2::3] for a in coco["annotations"]])
    np.testing.assert_array_equal(got, np.broadcast_to(want_v, got.shape))


def test_mark_below_by_score_or_p():
    records = calibrated_records(3)
    by_score = to_labelstudio_tasks(records, NAMES, mark_below=0.5, mark_by="score")
    notes = [r["meta"]["text"][0] for t in by_score for r in t["predictions"][0]["result"] if "text" in r.get("meta", {})]
    assert notes and all(n.startswith("low confidence: score") for n in notes)
    by_p = to_labelstudio_tasks(records, NAMES, mark_below=0.5)
    notes = [r["meta"]["text"][0] for t in by_p for r in t["predictions"][0]["result"] if "text" in r.get("meta", {})]
    assert notes and all(n.startswith("low confidence: p") for n in notes)
    # CVAT: the review checkbox follows the same rule
    text = to_cvat_xml(records, NAMES, mark_below=0.5)
    reviews = text.count('<attribute name="review">true</attribute>')
    assert reviews == sum(p < 0.5 for r in records for p in r["p"])
    plain = calibrated_records(3, calibrated=False)
    with pytest.raises(AnnotationFormatError, match="no calibrated 'p'.*--mark-below-by score"):
        to_cvat_xml(plain, NAMES, mark_by="p")
    with pytest.raises(AnnotationFormatError, match="visibility"):
        to_cvat_xml([{**records[0], "visibility": [3] * 5}], NAMES)


def test_labelstudio_meta_p_that_is_not_a_probability_is_named(tmp_path):
    tasks = to_labelstudio_tasks(calibrated_records(4), NAMES)
    tasks[0]["predictions"][0]["result"][1]["meta"]["p"] = 1.5
    path = tmp_path / "export.json"
    path.write_text(json.dumps(accepted(tasks)))
    with pytest.raises(AnnotationFormatError, match=r"probability.*meta\.p"):
        read_labelstudio(path, K5)


def test_server_options_name_what_the_threshold_compares():
    from vitpose.data.metainfo import dataset_info
    from vitpose.inference.records import MarkingError, parse_marking, render_records
    from vitpose.serve.labelstudio import labelling_config, labelling_names

    assert parse_marking("0.4", "p") == (0.4, "p")
    with pytest.raises(MarkingError, match="mark_below_by must be one of auto, score, p") as caught:
        parse_marking(0.4, "probability")
    assert caught.value.http_status == 400
    # the server's Label Studio config names the occlusion choice; a project without one gets no choice
    names = labelling_names(labelling_config(NAMES), NAMES)
    assert (names.visibility_control, names.occluded_choice) == ("visibility", "occluded")
    bare = labelling_names('<View><Image name="img" value="$image"/><KeyPointLabels name="kp" toName="img">'
                           + "".join(f'<Label value="{n}"/>' for n in NAMES) + "</KeyPointLabels></View>", NAMES)
    assert bare.visibility_control is None
    tasks = to_labelstudio_tasks(calibrated_records(5), NAMES, **bare.writer_names())
    assert not any(r["type"] == "choices" for t in tasks for r in t["predictions"][0]["result"])
    skeleton = dataset_info(K5)
    text = render_records(calibrated_records(5), "cvat", skeleton, 0.3, "score")
    assert text.count('name="review">true') == sum(
        s < 0.3 for r in calibrated_records(5) for s in r["keypoints"][2::3])


# ---------------------------------------------------------------------------------------------
# --rescore calibrated and its gate


@pytest.fixture(scope="module")
def labelled_set(tmp_path_factory):
    from vitpose.data.synthetic import make_coco

    root = tmp_path_factory.mktemp("rescore")
    make_coco(root, num_images=24, seed=5, split="val")
    return root / "annotations/person_keypoints_val2017.json"


def _gate_predictions(ann_file, informative: bool) -> list[dict]:
    """Per labelled person a right prediction (its label plus a pixel of noise) and a wrong one
    (the keypoints scattered over the box), raw scores that cannot tell them apart, and p that tells
    them apart (`informative`) or the other way round."""
    rng = np.random.default_rng(0)
    coco = json.loads(ann_file.read_text())
    predictions = []
    for ann in coco["annotations"]:
        label = np.asarray(ann["keypoints"], np.float64).reshape(-1, 3)
        x, y, w, h = ann["bbox"]
        for right in (True, False):
            xy = label[:, :2] + rng.normal(0, 1, (len(label), 2)) if right else \
                np.stack([rng.uniform(x, x + w, len(label)), rng.uniform(y, y + h, len(label))], 1)
            sure = 0.9 if right == informative else 0.3
            predictions.append({"id": len(predictions), "image_id": ann["image_id"], "keypoints": xy,
                                "keypoint_scores": rng.uniform(0.5, 0.9, len(label)).astype(np.float32),
                                "keypoint_p": np.full(len(label), sure), "bbox_score": 1.0, "area": w * h})
    return predictions


def test_rescore_gate_keeps_a_rescoring_that_helps_and_not_one_that_hurts(labelled_set):
    from vitpose.evaluation.coco_evaluator import CocoEvaluator
    from vitpose.evaluation.rescoring import RescoreError, rescore_gate

    evaluator = CocoEvaluator(labelled_set)
    helps = rescore_gate(evaluator, _gate_predictions(labelled_set, True), bootstrap=50)
    assert helps.ap_rescored > helps.ap_raw and helps.kept, helps.lines()
    hurts = rescore_gate(evaluator, _gate_predictions(labelled_set, False), bootstrap=50)
    assert hurts.ap_rescored < hurts.ap_raw and not hurts.kept, hurts.lines()
    assert "not kept" in hurts.lines()[0] and hurts.as_dict()["rescore_kept"] is False
    assert evaluator.keypoint_score_thr == 0.2  # the evaluator is left as it was
    same = [{**p, "keypoint_p": p["keypoint_scores"]} for p in _gate_predictions(labelled_set, True)]
    unchanged = rescore_gate(evaluator, same, bootstrap=20)
    assert unchanged.difference == 0 and unchanged.interval == (0.0, 0.0) and unchanged.kept
    with pytest.raises(RescoreError, match="no calibrated p"):
        rescore_gate(evaluator, [{k: v for k, v in p.items() if k != "keypoint_p"} for p in same])


def test_rescored_records_and_the_models_verdict():
    from vitpose.evaluation.rescoring import RescoreError, rescore_kept, rescored_records
    from vitpose.models.spec import ModelSpec

    record = {"keypoints": [0, 0, 0.9] * 3, "bbox_score": 0.8, "score": 0.5, "p": [0.9, 0.1, 0.6]}
    (out,) = rescored_records([record])
    assert out["score"] == pytest.approx(0.8 * (0.9 + 0.6) / 2) and out["raw_score"] == 0.5
    with pytest.raises(RescoreError, match="no calibrated 'p'"):
        rescored_records([{k: v for k, v in record.items() if k != "p"}])
    assert not rescore_kept(ModelSpec()) and not rescore_kept(None)
    assert rescore_kept({"calibration": {"rescore_kept": True}})
    assert not rescore_kept({"calibration": {"rescore_kept": False}})


def test_coco_results_readers_keep_the_fields(tmp_path):
    """The fields pass every COCO results reader: `vitpose merge`'s records, the raw predictions
    file (`load_predictions`: arrays back) and select's progress lines."""
    from vitpose.evaluation.predictions import load_predictions, save_predictions
    from vitpose.inference.units import as_coco_results

    records = calibrated_records(6)
    assert as_coco_results(records) == records
    path = tmp_path / "predictions.json"
    save_predictions([{"id": 0, "image_id": 1, "keypoints": np.zeros((5, 2)), "keypoint_scores": np.ones(5),
                       "keypoint_p": np.full(5, 0.25), "keypoint_visibility": np.array([2, 1, 0, 2, 2], np.int8),
                       "bbox_score": 1.0, "area": 10.0},
                      {"id": 1, "image_id": 1, "keypoints": np.zeros((5, 2)), "keypoint_scores": np.ones(5),
                       "bbox_score": 1.0, "area": 10.0}], path)
    first, second = load_predictions(path)
    assert first["keypoint_p"].dtype == np.float32 and first["keypoint_p"].tolist() == [0.25] * 5
    assert first["keypoint_visibility"].dtype == np.int8 and first["keypoint_visibility"].tolist() == [2, 1, 0, 2, 2]
    assert "keypoint_p" not in second and "keypoint_visibility" not in second


def test_vitpose_merge_keeps_the_fields_and_invents_none(tmp_path):
    from vitpose.inference.units import ShardFile, WorkUnit, merge_shards, write_manifest

    calibrated, plain = calibrated_records(7)[0], calibrated_records(7, calibrated=False)[0]
    units = [WorkUnit(name, name, file_name=name, image_id=i) for i, name in enumerate(("a.png", "b.png"))]
    write_manifest(tmp_path, units, tmp_path)
    writer = ShardFile(tmp_path / "shard-0-of-1.jsonl", 0, 1, units,
                       origin={"model": "m.pth", "model_sha256": "ab" * 32, "source": str(tmp_path)})
    for unit, record in zip(units, (calibrated, plain)):
        writer.begin(unit)
        writer.add([record])
        writer.end()
    writer.close(completed=True)
    first, second = merge_shards(tmp_path).records
    assert (first["p"], first["visibility"]) == (calibrated["p"], calibrated["visibility"])
    assert "p" not in second and "visibility" not in second


@pytest.mark.slow  # a model load and a prediction: seconds on a shared CPU
def test_predict_refuses_p_and_rescoring_of_a_model_without_calibration(tmp_path, coco_mini_dir, capsys):
    """A model without a calibration: `--rescore calibrated` is refused before the work, `--mark-below-by
    p` names the missing field (one line each, exit 2)."""
    import shutil

    from test_evaluate import tiny_model, write_config

    import vitpose
    from vitpose.cli import main as vitpose_main

    weights = tmp_path / "tiny.safetensors"
    vitpose.save_weights(tiny_model(seed=11), weights)
    images = tmp_path / "images"
    images.mkdir()
    shutil.copy(coco_mini_dir / "000000000785.jpg", images / "000000000785.jpg")
    base = ["predict", str(images), "--config", str(write_config(tmp_path, coco_mini_dir)), "--model", str(weights),
            "--detector", "full-frame", "--device", "cpu"]
    assert vitpose_main(base + ["--json", str(tmp_path / "r.json"), "--rescore", "calibrated"]) == 2
    err = capsys.readouterr().err
    assert "--rescore calibrated" in err and "rescore_kept" in err and not (tmp_path / "r.json").exists()
    out = tmp_path / "tasks.xml"
    assert vitpose_main(base + ["--format", "cvat", "--json", str(out), "--mark-below-by", "p"]) == 2
    assert "no calibrated 'p'" in capsys.readouterr().err


def test_predict_rescores_only_a_model_whose_gate_kept_it():
    from types import SimpleNamespace

    from vitpose.cli.predict import check_rescore_kept
    from vitpose.evaluation.rescoring import RescoreError

    check_rescore_kept(SimpleNamespace(spec={"calibration": {"rescore_kept": True}}))
    for spec in (None, {"calibration": {"rescore_kept": False}}, {"calibration": None}):
        with pytest.raises(RescoreError, match="rescore_kept"):
            check_rescore_kept(SimpleNamespace(spec=spec, model=None))


@pytest.mark.parametrize("value", ["nan", "inf", "2"])
def test_a_threshold_that_marks_nothing_or_everything_is_refused(value, tmp_path, capsys):
    """NaN marked no point and infinity every point, silently, in vitpose predict and in a server
    request alike; predict's --mark-below is bounded as vitpose serve's is."""
    from vitpose.cli import main
    from vitpose.inference.records import MarkingError, parse_marking

    if value != "2":
        with pytest.raises(MarkingError, match="finite number") as caught:
            parse_marking(value, "auto")
        assert caught.value.http_status == 400
    (tmp_path / "imgs").mkdir()
    code = main(["predict", str(tmp_path / "imgs"), "--model", "no-such-model", "--mark-below", value,
                 "--format", "labelstudio", "--json", str(tmp_path / "tasks.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--mark-below" in err[0], err
