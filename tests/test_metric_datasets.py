"""AIC, AP-10K, COCO-WholeBody and MPII evaluation against MMPose 1.3.2 on MMPose's own test data.

tests/fixtures/metric_datasets.json is written by tools/reference/make_metric_datasets.py in the
MMPose reference environment: seeded predictions over tests/data/<name>/ (copied from MMPose
v1.3.2's tests/data) and what CocoMetric (AIC with use_area=False, AP-10K with categories),
CocoWholeBodyMetric (its six COCOeval runs) and MpiiPCKAccuracy report for them.
"""

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from vitpose.data import dataset_info
from vitpose.evaluation import CocoEvaluator, PCKhEvaluator, WholeBodyEvaluator, read_mat_arrays
from vitpose.evaluation.coco_evaluator import GroundTruthError, PredictionError
from vitpose.evaluation.matfile import MatFileError
from vitpose.evaluation.wholebody import PARTS, WHOLEBODY_SIGMAS, stat_names

REPO = Path(__file__).resolve().parents[1]
FIXTURE = json.loads((REPO / "tests" / "fixtures" / "metric_datasets.json").read_text())
DATASETS = FIXTURE["datasets"]
TOL = 1e-9


def predictions(scenario):
    """Fixture records -> prediction dicts (keypoints float64 and scores float32, as `predict` makes them)."""
    out = []
    for record in scenario["predictions"]:
        pred = dict(record)
        pred["keypoints"] = np.asarray(record["keypoints"], np.float64)
        pred["keypoint_scores"] = np.asarray(record["keypoint_scores"], np.float32)
        out.append(pred)
    return out


def scenarios(name):
    return [pytest.param(s, id=s["name"]) for s in DATASETS[name]["scenarios"]]


def assert_stats_equal(ours, mmpose):
    assert set(ours) == set(mmpose)
    worst = max(abs(ours[k] - mmpose[k]) for k in mmpose)
    assert worst <= TOL, {k: (ours[k], mmpose[k]) for k in mmpose if abs(ours[k] - mmpose[k]) > TOL}


# ---- COCO-style datasets -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def aic():
    ds = DATASETS["aic"]
    return CocoEvaluator(REPO / ds["ann_file"], sigmas=ds["sigmas"], use_area=ds["use_area"])


@pytest.fixture(scope="module")
def ap10k():
    ds = DATASETS["ap10k"]
    return CocoEvaluator(REPO / ds["ann_file"], sigmas=ds["sigmas"], use_area=ds["use_area"])


@pytest.mark.parametrize("scenario", scenarios("aic"))
def test_aic_matches_mmpose_with_use_area_off(aic, scenario):
    assert DATASETS["aic"]["use_area"] is False and aic.num_keypoints == 14
    assert_stats_equal(aic.evaluate(predictions(scenario)), scenario["mmpose"])


def test_use_area_off_ignores_the_area_field(tmp_path, aic):
    # With the box area written into the file as `area`: use_area=False still takes 0.53 x the box
    # (what MMPose gets), use_area=True takes the field, and the stats move.
    ds, scenario = DATASETS["aic"], DATASETS["aic"]["scenarios"][1]
    data = json.loads((REPO / ds["ann_file"]).read_text())
    for ann in data["annotations"]:
        ann["area"] = ann["bbox"][2] * ann["bbox"][3]
    path = tmp_path / "aic_with_area.json"
    path.write_text(json.dumps(data))
    preds = predictions(scenario)
    assert CocoEvaluator(path, sigmas=ds["sigmas"], use_area=False).evaluate(preds) == aic.evaluate(preds)
    with_area = CocoEvaluator(path, sigmas=ds["sigmas"], use_area=True).evaluate(preds)
    assert abs(with_area["AP"] - scenario["mmpose"]["AP"]) > 0.01


def test_aic_file_without_area_needs_use_area_off():
    ds = DATASETS["aic"]
    with pytest.raises(GroundTruthError, match=r"test_aic.json: annotation #0 .*missing field 'area'.*use_area=False"):
        CocoEvaluator(REPO / ds["ann_file"], sigmas=ds["sigmas"])


@pytest.mark.parametrize("scenario", scenarios("ap10k"))
def test_ap10k_matches_mmpose_with_categories(ap10k, scenario):
    assert_stats_equal(ap10k.evaluate(predictions(scenario)), scenario["mmpose"])


def test_ap10k_categories_matter(ap10k, tmp_path):
    scenario = next(s for s in DATASETS["ap10k"]["scenarios"] if s["name"] == "categories")
    preds = predictions(scenario)
    for pred in preds:
        pred["category_id"] = 1  # everything counted as one family
    assert abs(ap10k.evaluate(preds)["AP"] - scenario["mmpose"]["AP"]) > 0.05
    # Without categories at all the predictions are refused: the file has two families.
    del preds[2]["category_id"]
    with pytest.raises(PredictionError, match=r"prediction #2 .*no 'category_id', but the annotations of "
                                              r".*test_ap10k.json have 2 categories \(\[1, 26\]\)"):
        ap10k.evaluate(preds)


def test_unknown_category_is_refused(ap10k):
    preds = predictions(DATASETS["ap10k"]["scenarios"][0])
    preds[1]["category_id"] = 999
    with pytest.raises(PredictionError, match=r"category_id\(s\) \[999\].*test_ap10k.json"):
        ap10k.evaluate(preds)


def test_keypoint_count_must_match_the_sigmas(aic):
    preds = predictions(DATASETS["aic"]["scenarios"][0])
    preds[2]["keypoints"] = np.zeros((17, 2))
    with pytest.raises(PredictionError, match=r"prediction #2 .*'keypoints' has shape \(17, 2\): 17 keypoints, "
                                              r"but the evaluator of .*test_aic.json has 14 OKS sigmas"):
        aic.evaluate(preds)


# ---- COCO-WholeBody ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wholebody():
    return WholeBodyEvaluator(REPO / DATASETS["coco_wholebody"]["ann_file"])


def test_wholebody_sigmas_are_mmposes():
    mmpose = np.float32(DATASETS["coco_wholebody"]["sigmas"])
    assert np.array_equal(np.float32(WHOLEBODY_SIGMAS), mmpose)
    assert [end - start for _, _, start, end in PARTS] == [17, 6, 68, 21, 21]


@pytest.mark.parametrize("scenario", scenarios("coco_wholebody"))
def test_wholebody_matches_mmpose_whole_and_per_part(wholebody, scenario):
    stats = wholebody.evaluate(predictions(scenario))
    assert list(stats) == stat_names() and len(stats) == 60
    assert_stats_equal(stats, scenario["mmpose"])


def test_wholebody_results_are_mmposes_format(wholebody):
    results = wholebody.results(predictions(DATASETS["coco_wholebody"]["scenarios"][0]))
    for r in results:
        assert set(r) == {"image_id", "category_id", "score", "keypoints", "foot_kpts", "face_kpts",
                          "lefthand_kpts", "righthand_kpts"}
        assert [len(r[field]) for _, field, _, _ in PARTS] == [51, 18, 204, 63, 63]


def test_wholebody_detection_area_is_the_body_extent(wholebody):
    # MMPose writes no box for whole-body results: a given box must not change anything.
    scenario = DATASETS["coco_wholebody"]["scenarios"][1]
    without_box = predictions(scenario)
    for pred in without_box:
        del pred["bbox"]
    assert wholebody.evaluate(without_box) == wholebody.evaluate(predictions(scenario))


def test_wholebody_annotation_without_a_part_is_refused(tmp_path):
    data = json.loads((REPO / DATASETS["coco_wholebody"]["ann_file"]).read_text())
    del data["annotations"][2]["lefthand_kpts"]
    path = tmp_path / "wb.json"
    path.write_text(json.dumps(data))
    with pytest.raises(GroundTruthError, match=r"wb.json: annotation #2 .*'lefthand_kpts' must be a list of 63"):
        WholeBodyEvaluator(path)


def test_wholebody_refuses_other_keypoint_counts(wholebody):
    with pytest.raises(ValueError, match="133 sigmas"):
        WholeBodyEvaluator(REPO / DATASETS["coco_wholebody"]["ann_file"], sigmas=[0.05] * 17)
    preds = predictions(DATASETS["coco_wholebody"]["scenarios"][0])
    preds[0]["keypoints"] = preds[0]["keypoints"][:17]
    with pytest.raises(PredictionError, match=r"17 keypoints, but the evaluator of .* has 133 OKS sigmas"):
        wholebody.evaluate(preds)


# ---- MPII PCKh ---------------------------------------------------------------------------------

MPII = DATASETS["mpii"]


@pytest.mark.parametrize("case", MPII["cases"], ids=lambda c: f"{Path(c['headbox_file']).stem}-{c['rel_sigma']}")
def test_pckh_equals_mmpose_exactly(case):
    ev = PCKhEvaluator(REPO / MPII["ann_file"], REPO / case["headbox_file"])
    assert ev.head_sizes.tolist() == case["head_sizes"]
    stats = ev.evaluate(case["predictions"])
    assert list(stats) == ["Head", "Shoulder", "Elbow", "Wrist", "Hip", "Knee", "Ankle", "PCKh", "PCKh@0.1"]
    assert stats == case["mmpose"]


def test_pckh_zero_head_box_counts_as_mmpose_counts_it():
    # MMPose leaves a person with a zero head box out of PCKh but, having overwritten its head size
    # with 1e6 in place, counts all its joints as correct at 0.1: the fixture's case shows it.
    case = next(c for c in MPII["cases"] if "zero" in c["headbox_file"])
    assert 0.0 in case["head_sizes"]
    ev = PCKhEvaluator(REPO / MPII["ann_file"], REPO / case["headbox_file"])
    preds = case["predictions"]
    zero = case["head_sizes"].index(0.0)
    with pytest.warns(UserWarning, match="1 of the 5 annotations"):
        without = ev.evaluate([p for p in preds if p["id"] != zero])
    assert without["PCKh@0.1"] != case["mmpose"]["PCKh@0.1"]


def test_headboxes_from_npz_equal_the_mat_file(tmp_path):
    case = MPII["cases"][0]
    mat = REPO / case["headbox_file"]
    npz = tmp_path / "headboxes.npz"
    np.savez(npz, headboxes_src=read_mat_arrays(mat)["headboxes_src"])
    a = PCKhEvaluator(REPO / MPII["ann_file"], mat)
    b = PCKhEvaluator(REPO / MPII["ann_file"], npz)
    assert np.array_equal(a.head_sizes, b.head_sizes)
    assert b.evaluate(case["predictions"]) == case["mmpose"]


def test_headbox_file_that_does_not_match_the_annotations(tmp_path):
    npz = tmp_path / "short.npz"
    np.savez(npz, headboxes_src=np.ones((2, 2, 4)))
    with pytest.raises(GroundTruthError, match=r"short.npz: 4 head boxes for the 5 annotations of .*test_mpii.json"):
        PCKhEvaluator(REPO / MPII["ann_file"], npz)
    np.savez(npz, other=np.ones((2, 2, 5)))
    with pytest.raises(GroundTruthError, match=r"short.npz: no 'headboxes_src' array \(it holds \['other'\]\)"):
        PCKhEvaluator(REPO / MPII["ann_file"], npz)
    np.savez(npz, headboxes_src=np.ones((4, 5)))
    with pytest.raises(GroundTruthError, match=r"'headboxes_src' has shape \(4, 5\), expected \(2, 2, N\)"):
        PCKhEvaluator(REPO / MPII["ann_file"], npz)
    txt = tmp_path / "boxes.txt"
    txt.write_text("1 2 3 4")
    with pytest.raises(GroundTruthError, match=r"boxes.txt: head boxes are read from MPII's .mat file"):
        PCKhEvaluator(REPO / MPII["ann_file"], txt)


@pytest.mark.parametrize("mutate, match", [
    (lambda p: p[1].update(id=p[0]["id"]), "annotation 0 is predicted twice"),
    (lambda p: p[1].update(id=7), r"'id' must be the index of its annotation in .*test_mpii.json \(0 .. 4\), got 7"),
    (lambda p: p[1].update(keypoints=np.zeros((17, 2))), r"'keypoints' has shape \(17, 2\), expected \(16, 2\)"),
    (lambda p: p[1].update(image_id=123), r"image_id 123 but annotation 1 of .*test_mpii.json is image"),
])
def test_pckh_bad_predictions(mutate, match):
    case = MPII["cases"][0]
    preds = [dict(p) for p in case["predictions"]]
    mutate(preds)
    with pytest.raises(PredictionError, match=match):
        PCKhEvaluator(REPO / MPII["ann_file"], REPO / case["headbox_file"]).evaluate(preds)


def test_mpii_annotation_record_with_wrong_joints(tmp_path):
    data = json.loads((REPO / MPII["ann_file"]).read_text())
    data[3]["joints"] = data[3]["joints"][:15]
    path = tmp_path / "mpii.json"
    path.write_text(json.dumps(data))
    with pytest.raises(GroundTruthError, match=r"mpii.json: record #3: 'joints' must be 16 x 2"):
        PCKhEvaluator(path, REPO / MPII["cases"][0]["headbox_file"])


# ---- the MAT-file reader -----------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(MPII["matfiles"]))
def test_mat_reader_reads_what_scipy_reads(name):
    arrays = read_mat_arrays(REPO / "tests" / "fixtures" / name)
    expected = MPII["matfiles"][name]
    assert set(arrays) == set(expected)  # the string and the struct are skipped
    for key, e in expected.items():
        assert str(arrays[key].dtype) == e["dtype"] and list(arrays[key].shape) == e["shape"], key
        assert arrays[key].ravel(order="F").tolist() == e["values"], key


def _element(dtype, data):
    return struct.pack("<II", dtype, len(data)) + data + b"\0" * (-len(data) % 8)


def _header(version=b"\x00\x01", text=b"MATLAB 5.0 MAT-file, written by hand"):
    return text.ljust(116, b" ") + b"\0" * 8 + version + b"IM"


def test_mat_reader_casts_small_integer_storage_to_the_class(tmp_path):
    # MATLAB stores a double array of small integers as uint8 data (class stays double), and packs
    # elements of up to 4 bytes into the tag ("small element" format).
    flags = struct.pack("<II", 6, 0)  # mxDOUBLE_CLASS
    dims = struct.pack("<ii", 2, 2)
    matrix = _element(6, flags) + _element(5, dims) + _element(1, b"headboxes_src") + _element(2, bytes([1, 2, 3, 200]))
    raw = _header() + _element(14, matrix)
    tiny = _element(6, flags) + _element(5, struct.pack("<ii", 1, 1)) + struct.pack("<HH", 1, 1) + b"x\0\0\0"
    tiny += struct.pack("<HH", 2, 1) + b"\x07\0\0\0"  # small miUINT8 element holding 7
    raw += _element(15, zlib.compress(_element(14, tiny)))
    path = tmp_path / "hand.mat"
    path.write_bytes(raw)
    arrays = read_mat_arrays(path)
    assert arrays["headboxes_src"].dtype == np.float64
    assert arrays["headboxes_src"].tolist() == [[1.0, 3.0], [2.0, 200.0]]  # column-major
    assert arrays["x"].tolist() == [[7.0]]


def test_mat_reader_refuses_hdf5_and_other_files(tmp_path):
    v73 = tmp_path / "v73.mat"
    v73.write_bytes(_header(b"\x00\x02", b"MATLAB 7.3 MAT-file, Platform: GLNXA64") + b"\0" * 64)
    with pytest.raises(MatFileError, match=r"v73.mat: a MATLAB 7.3 \(HDF5\) MAT-file"):
        read_mat_arrays(v73)
    other = tmp_path / "other.mat"
    other.write_bytes(b"x" * 200)
    with pytest.raises(MatFileError, match="other.mat: not a MATLAB level-5 MAT-file"):
        read_mat_arrays(other)
    cut = tmp_path / "cut.mat"
    cut.write_bytes((REPO / "tests" / "fixtures" / "matfile_v5.mat").read_bytes()[:300])
    with pytest.raises(MatFileError, match="cut.mat: truncated"):
        read_mat_arrays(cut)


# ---- the skeletons' sigmas --------------------------------------------------------------

@pytest.mark.parametrize("name", ["aic", "ap10k", "coco_wholebody"])
def test_builtin_skeleton_sigmas_equal_the_fixture(name):
    info = dataset_info(name)
    assert np.array_equal(np.float32(info.sigmas), np.float32(DATASETS[name]["sigmas"]))


# ---- configs and build_evaluator ------------------------------------------------------------------

CONFIGS = {"coco-wholebody": ("coco_wholebody", 133), "aic": ("aic", 14), "mpii": ("mpii", 16),
           "ap10k": ("ap10k", 17), "apt36k": ("apt36k", 17)}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_dataset_configs_load_with_their_skeleton_and_metric(name):
    from vitpose.config import load_config

    cfg = load_config(REPO / "configs" / f"{name}_vitpose-b_256x192.yaml")
    skeleton, k = CONFIGS[name]
    assert (cfg.data.dataset_info, cfg.model.num_keypoints) == (skeleton, k)
    assert cfg.model.name == "vitpose-b" and cfg.model.input_size == (192, 256) and cfg.optim.layer_decay == 0.75
    assert cfg.train.work_dir.endswith(f"{name}_vitpose-b_256x192")
    assert cfg.eval.use_area is (name != "aic")
    assert (cfg.eval.headbox_file is not None) is (name == "mpii")
    assert (cfg.data.val_bbox_file is not None) is (name == "coco-wholebody")


class Skeleton:
    """What build_evaluator reads of a vitpose.data.dataset_info result."""

    def __init__(self, name, sigmas, annotation_format="coco", metric="coco-oks"):
        self.name, self.sigmas, self.annotation_format, self.metric = name, tuple(sigmas), annotation_format, metric


def _config(overrides):
    from vitpose.config import load_config

    return load_config(None, overrides)


def test_build_evaluator_picks_mmposes_metric_per_dataset():
    from vitpose.builders import build_evaluator
    from vitpose.config import ConfigError

    aic = DATASETS["aic"]
    cfg = _config([f"data.root={REPO}", f"data.val_ann={aic['ann_file']}", "data.dataset_info=aic",
                   "eval.use_area=false"])
    ev = build_evaluator(cfg, Skeleton("aic", aic["sigmas"]))
    assert type(ev) is CocoEvaluator and ev.num_keypoints == 14 and ev.use_area is False
    assert_stats_equal(ev.evaluate(predictions(aic["scenarios"][0])), aic["scenarios"][0]["mmpose"])

    wb = DATASETS["coco_wholebody"]
    cfg = _config([f"data.root={REPO}", f"data.val_ann={wb['ann_file']}", "data.dataset_info=my_wholebody.yaml"])
    ev = build_evaluator(cfg, Skeleton("my_wholebody", wb["sigmas"], annotation_format="coco_wholebody"))
    assert type(ev) is WholeBodyEvaluator and ev.primary_stat == "AP"

    cfg = _config([f"data.root={REPO}", f"data.val_ann={MPII['ann_file']}", "data.dataset_info=mpii"])
    with pytest.raises(ConfigError, match="eval.headbox_file is not set"):
        build_evaluator(cfg, Skeleton("mpii", [0.05] * 16, "mpii", "pckh"))
    cfg = _config([f"data.root={REPO}", f"data.val_ann={MPII['ann_file']}", "data.dataset_info=mpii",
                   f"eval.headbox_file={MPII['cases'][0]['headbox_file']}"])
    ev = build_evaluator(cfg, Skeleton("mpii", [0.05] * 16, "mpii", "pckh"))
    assert type(ev) is PCKhEvaluator and ev.primary_stat == "PCKh"
    assert ev.evaluate(MPII["cases"][0]["predictions"]) == MPII["cases"][0]["mmpose"]


def test_build_evaluator_without_a_skeleton_is_coco_only():
    from vitpose.builders import build_evaluator
    from vitpose.config import ConfigError

    cfg = _config([f"data.root={REPO}", f"data.val_ann={DATASETS['aic']['ann_file']}", "data.dataset_info=aic"])
    with pytest.raises(ConfigError, match="data.dataset_info is 'aic'; pass its skeleton"):
        build_evaluator(cfg)


def test_pckh_nonfinite_predictions_count_as_wrong_and_results_are_written(tmp_path):
    case = MPII["cases"][0]
    ev = PCKhEvaluator(REPO / MPII["ann_file"], REPO / case["headbox_file"])
    preds = [dict(p, keypoints=np.asarray(p["keypoints"], np.float64)) for p in case["predictions"]]
    preds[1]["keypoints"] = np.full((16, 2), np.nan)
    with pytest.warns(UserWarning, match="1 of 5 predictions have non-finite keypoints"):
        stats = ev.evaluate(preds)
    assert ev.last_nonfinite == 1 and stats["PCKh"] < case["mmpose"]["PCKh"]
    path = ev.write_results(case["predictions"], tmp_path / "mpii_results.json")
    written = json.loads(path.read_text())
    assert [r["id"] for r in written] == [p["id"] for p in case["predictions"]]
    assert written[0]["keypoints"][:3] == [*case["predictions"][0]["keypoints"][0], 1.0]
