"""Skeletons as data: the built-ins equal MMPose 1.3.2's metainfo; user YAML and COCO files; errors.

tests/fixtures/dataset_infos.json is what MMPose's `parse_pose_metainfo` makes of
`configs/_base_/datasets/{name}.py` (tools/reference/make_dataset_infos.py writes it).
"""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from vitpose import coco_meta
from vitpose.data.errors import DataError
from vitpose.data.metainfo import (
    BUILTIN_NAMES,
    DEFAULT_SIGMA,
    DatasetInfo,
    dataset_info,
    infer_flip_indices,
    read_categories,
    twin_name,
)

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "dataset_infos.json").read_text())["datasets"]


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_builtin_equals_mmpose_parse_pose_metainfo(name):
    ref, info = FIXTURE[name], dataset_info(name)
    assert info.name == name
    assert ref["dataset_name"] == ("ap10k" if name == "apt36k" else name)  # APT-36K uses AP-10K's metainfo
    assert info.num_keypoints == ref["num_keypoints"]
    assert list(info.keypoint_names) == ref["keypoint_names"]
    assert list(info.flip_indices) == ref["flip_indices"]
    # MMPose lists each pair once per member ((swap, name) for every swapping keypoint).
    assert {frozenset(p) for p in info.flip_pairs} == {frozenset(p) for p in ref["flip_pairs"]}
    assert len(ref["flip_pairs"]) == 2 * len(info.flip_pairs)
    assert list(info.upper_body_ids) == ref["upper_body_ids"]
    assert list(info.lower_body_ids) == ref["lower_body_ids"]
    assert [list(link) for link in info.skeleton] == ref["skeleton_links"]
    # MMPose holds sigmas and joint weights as float32: equal after the same rounding.
    assert ref["sigmas_dtype"] == ref["dataset_keypoint_weights_dtype"] == "float32"
    np.testing.assert_array_equal(np.float32(info.sigmas), np.float32(ref["sigmas"]))
    np.testing.assert_array_equal(np.float32(info.joint_weights), np.float32(ref["dataset_keypoint_weights"]))
    assert [list(c) for c in info.keypoint_colors] == ref["keypoint_colors"]
    assert [list(c) for c in info.link_colors] == ref["skeleton_link_colors"]
    assert info.annotation_format == ref["annotation_format"]
    assert info.defaulted == ()


def test_coco_meta_constants_are_the_coco_skeleton():
    info = dataset_info("coco")
    assert info.keypoint_names == coco_meta.KEYPOINT_NAMES
    assert info.flip_indices == coco_meta.FLIP_INDICES
    assert info.upper_body_ids == coco_meta.UPPER_BODY_IDS
    assert info.lower_body_ids == coco_meta.LOWER_BODY_IDS
    assert info.sigmas == coco_meta.SIGMAS
    assert info.skeleton == coco_meta.SKELETON


@pytest.mark.parametrize("name", ["coco", "aic", "mpii", "ap10k"])
def test_flip_pairs_from_names_reproduce_mmpose(name):
    info = dataset_info(name)
    assert infer_flip_indices(info.keypoint_names) == info.flip_indices


def test_wholebody_face_points_have_no_name_twins():
    # COCO-WholeBody's face points are numbered (face-0 <-> face-16): only its file knows the pairs.
    info = dataset_info("coco_wholebody")
    assert info.flip_indices[info.index("face-0")] == info.index("face-16")
    assert infer_flip_indices(info.keypoint_names[:23]) == info.flip_indices[:23]  # body + feet by name


@pytest.mark.parametrize("name, twin", [
    ("left_eye", "right_eye"), ("eye_l", "eye_r"), ("l_eye", "r_eye"), ("LeftHand", "RightHand"),
    ("handLeft", "handRight"), ("LEFT_EAR", "RIGHT_EAR"), ("hand-right", "hand-left"), ("R_wrist", "L_wrist"),
    ("thumb_R", "thumb_L"), ("left_hand_root", "right_hand_root"), ("front.left.paw", "front.right.paw"),
    ("nose", None), ("heel", None), ("HEEL", None), ("lower_lip", None), ("root_of_tail", None),
    ("upper_neck", None), ("elbowL", "elbowR"), ("Rear", None), ("face-12", None),
])
def test_twin_names(name, twin):
    assert twin_name(name) == twin


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_user_yaml_by_name_and_index(tmp_path):
    path = _write(tmp_path / "paw.yaml", """
name: paw
keypoints: [wrist, left_tip, right_tip, a, b]
flip_pairs: [[left_tip, right_tip], [3, 4]]
upper_body: [wrist, 1, right_tip]
lower_body: [a, b]
sigmas: [0.05, 0.03, 0.03, 0.04, 0.04]
joint_weights: [1, 1.5, 1.5, 1, 1]
skeleton: [[wrist, a], [a, left_tip], [0, 4], [4, 2]]
""")
    info = dataset_info(path)
    assert info.name == "paw" and info.source == str(path)
    assert info.keypoint_names == ("wrist", "left_tip", "right_tip", "a", "b")
    assert info.flip_indices == (0, 2, 1, 4, 3)
    assert info.flip_pairs == ((1, 2), (3, 4))
    assert info.upper_body_ids == (0, 1, 2) and info.lower_body_ids == (3, 4)
    assert info.sigmas == (0.05, 0.03, 0.03, 0.04, 0.04)
    assert info.joint_weights == (1.0, 1.5, 1.5, 1.0, 1.0)
    assert info.skeleton == ((0, 3), (3, 1), (0, 4), (4, 2))
    # default colours: MMPose's convention (left green, right orange, others blue)
    assert info.keypoint_colors == ((51, 153, 255), (0, 255, 0), (255, 128, 0), (51, 153, 255), (51, 153, 255))
    assert info.defaulted == ()
    # written back and read again: the same skeleton
    again = dataset_info(_write(tmp_path / "again.yaml", info.to_yaml()))
    for field in ("name", "keypoint_names", "flip_indices", "upper_body_ids", "lower_body_ids", "sigmas",
                  "joint_weights", "skeleton", "keypoint_colors", "link_colors", "annotation_format"):
        assert getattr(again, field) == getattr(info, field), field


def test_user_yaml_defaults(tmp_path):
    info = dataset_info(_write(tmp_path / "five.yml", "keypoints: [head, l_hand, r_hand, foot_l, foot_r]\n"))
    assert info.name == "five"
    assert info.flip_indices == (0, 2, 1, 4, 3)
    assert info.sigmas == (DEFAULT_SIGMA,) * 5
    assert DEFAULT_SIGMA == pytest.approx(1.138 / 17)  # the mean of COCO's sigmas
    assert info.joint_weights == (1.0,) * 5
    assert info.upper_body_ids == info.lower_body_ids == () and info.skeleton == ()
    assert set(info.defaulted) == {"flip_pairs (from the names)", "sigmas", "joint_weights", "upper_body",
                                   "lower_body"}
    # an explicit empty list: nothing is mirrored (not inferred)
    none = dataset_info(_write(tmp_path / "nf.yaml", "keypoints: [l_hand, r_hand]\nflip_pairs: []\n"))
    assert none.flip_indices == (0, 1)


def _coco_file(path: Path, names, skeleton=None, **category) -> Path:
    cat = {"id": 1, "name": "thing", "keypoints": list(names), **category}
    if skeleton is not None:
        cat["skeleton"] = skeleton
    path.write_text(json.dumps({"images": [], "annotations": [], "categories": [cat]}))
    return path


def test_from_coco_annotation_file(tmp_path):
    path = _coco_file(tmp_path / "train.json", ["beak", "left_wing", "right_wing", "tail"],
                      skeleton=[[1, 2], [1, 3], [1, 4]])
    info = dataset_info(path)
    assert info.name == "thing" and info.source == str(path)
    assert info.flip_indices == (0, 2, 1, 3)
    assert info.skeleton == ((0, 1), (0, 2), (0, 3))  # 1-based in the file
    assert info.sigmas == (DEFAULT_SIGMA,) * 4


def test_coco_file_with_a_builtins_names_gets_the_builtin(tmp_path):
    info = dataset_info(_coco_file(tmp_path / "person_keypoints_val2017.json", coco_meta.KEYPOINT_NAMES))
    assert info.name == "coco" and info.sigmas == coco_meta.SIGMAS and info.upper_body_ids == coco_meta.UPPER_BODY_IDS
    assert "person_keypoints_val2017.json" in info.source


def test_read_categories_without_parsing_the_whole_file(tmp_path):
    # "categories" also inside a string and as the key of a non-list: the real list is found.
    doc = {"info": {"description": 'a "categories": trap', "categories": 3},
           "annotations": [{"id": k, "bbox": [1, 2, 3, 4], "tags": [[1], [2]]} for k in range(50)],
           "categories": [{"id": 1, "name": "x", "keypoints": ["a", "b"], "skeleton": [[1, 2]]},
                          {"id": 2, "name": "y"}]}
    path = tmp_path / "a.json"
    path.write_text(json.dumps(doc, indent=1))
    assert read_categories(path) == doc["categories"]


# ------------------------------------------------------------------------------ errors

def _raises(parts, fn):
    with pytest.raises((DataError, ValueError)) as e:
        fn()
    for part in parts:
        assert part in str(e.value), (part, str(e.value))


def test_unknown_name_lists_the_builtins():
    _raises(["unknown dataset 'cocoo'", "did you mean 'coco'", *BUILTIN_NAMES], lambda: dataset_info("cocoo"))
    _raises(["unknown dataset 'horses'", "aic, ap10k, apt36k, coco, coco_wholebody, mpii"],
            lambda: dataset_info("horses"))


def test_builtins_are_the_files_of_the_skeletons_folder():
    """No hard-coded list: every YAML of vitpose/data/skeletons/ is a built-in, and only those."""
    import vitpose.data.metainfo as metainfo

    folder = Path(metainfo.__file__).parent / "skeletons"
    assert BUILTIN_NAMES == tuple(sorted(p.stem for p in folder.glob("*.yaml")))
    assert {"coco", "mpii", "ap10k"} <= set(BUILTIN_NAMES)


def test_missing_files(tmp_path):
    _raises([str(tmp_path / "no.yaml"), "skeleton file not found"], lambda: dataset_info(tmp_path / "no.yaml"))
    _raises([str(tmp_path / "no.json"), "annotation file not found"], lambda: dataset_info(tmp_path / "no.json"))


def test_annotation_keypoint_without_twin_is_named(tmp_path):
    path = _coco_file(tmp_path / "t.json", ["nose", "left_paw", "right_paw", "left_ear"])
    _raises([str(path), "'left_ear' (index 3)", "no keypoint 'right_ear'", "flip_pairs", "skeleton YAML",
             "data.dataset_info"], lambda: dataset_info(path))


@pytest.mark.parametrize("text, parts", [
    ("keypoints: [a, b]\nflip_pairs: [[0, 7]]\n", ["index 7 is out of range for 2 keypoints", "'flip_pairs[0]'"]),
    ("keypoints: [a, b, c]\nflip_pairs: [[a, b], [b, c]]\n", ["'b' (index 1) is in two flip pairs"]),
    ("keypoints: [a, b]\nflip_pairs: [[a, a]]\n", ["'a' is paired with itself"]),
    ("keypoints: [a, b]\nflip_pairs: [[a, z]]\n", ["'z' is not one of the keypoints", "'flip_pairs[0]'"]),
    ("keypoints: [a, b]\nsigmas: [0.1]\n", ["has 1 entries for 2 keypoints", "'sigmas'"]),
    ("keypoints: [a, b]\nsigmas: [0.1, 0]\n", ["sigmas must be positive"]),
    ("keypoints: [a, b]\nskeleton: [[0, 2]]\n", ["index 2 is out of range", "'skeleton[0]'"]),
    ("keypoints: [a, a]\n", ["keypoint names appear twice: ['a']"]),
    ("keypoints: [a, b]\nflip_pair: []\n", ["unknown key 'flip_pair'", "did you mean 'flip_pairs'"]),
    ("keypoints: [a, b]\nannotation_format: voc\n", ["'annotation_format'", "'voc'"]),
    ("name: x\n", ["`keypoints` must be a non-empty list"]),
    ("keypoints: [left_a, b]\n", ["'left_a' (index 0)", "no keypoint 'right_a'", "add `flip_pairs:`"]),
])
def test_bad_skeleton_yaml(tmp_path, text, parts):
    path = _write(tmp_path / "bad.yaml", text)
    _raises([str(path), *parts], lambda: dataset_info(path))


def test_flip_indices_must_be_swaps():
    _raises(["flip_indices is not a set of swaps", "'b' (index 1) mirrors to index 2"],
            lambda: DatasetInfo("x", ("a", "b", "c"), (0, 2, 0)))
    _raises(["flip index 5 is out of range for 3 keypoints"], lambda: DatasetInfo("x", ("a", "b", "c"), (0, 5, 2)))
    _raises(["flip_indices has 2 entries for 3 keypoints"], lambda: DatasetInfo("x", ("a", "b", "c"), (0, 1)))


def test_annotation_categories_must_agree(tmp_path):
    path = tmp_path / "two.json"
    path.write_text(json.dumps({"categories": [{"id": 1, "keypoints": ["a", "b"]},
                                               {"id": 2, "keypoints": ["a", "c"]}]}))
    _raises([str(path), "category 2 lists other keypoints", "'categories[1].keypoints'"], lambda: dataset_info(path))
    path.write_text(json.dumps({"categories": [{"id": 1, "keypoints": ["a", "b"], "skeleton": [[0, 1]]}]}))
    _raises(["1-based keypoint numbers in 1..2", "'categories[0].skeleton[0]'"], lambda: dataset_info(path))


# ------------------------------------------------------------------------------ metric and detector classes

@pytest.mark.parametrize("name, metric, classes", [
    ("coco", "coco-oks", ("person",)), ("coco_wholebody", "coco-oks", ("person",)), ("aic", "coco-oks", ("person",)),
    ("mpii", "pckh", ("person",)),
    ("ap10k", "coco-oks", ("bird", "cat", "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe")),
    ("apt36k", "coco-oks", ("bird", "cat", "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe"))])
def test_builtins_name_their_metric_and_detector_classes(name, metric, classes):
    """MMPose's val_evaluator per dataset (CocoMetric / CocoWholeBodyMetric / MpiiPCKAccuracy) and the
    COCO classes its instances are found as."""
    info = dataset_info(name)
    assert (info.metric, info.detector_classes) == (metric, classes)


def test_skeleton_yaml_metric_and_detector_classes(tmp_path):
    path = tmp_path / "hand.yaml"
    path.write_text("keypoints: [wrist, thumb_l, thumb_r]\nmetric: pck\npck_threshold: 0.1\n"
                    "detector_classes: full-frame\n")
    info = dataset_info(path)
    assert (info.metric, info.pck_normalizer, info.pck_threshold, info.detector_classes) == ("pck", "bbox", 0.1, ())
    again = tmp_path / "again.yaml"
    again.write_text(info.to_yaml())
    assert dataclasses.replace(dataset_info(again), source=info.source) == info
    assert "detector_classes: full-frame" in info.to_yaml()
    path.write_text("keypoints: [wrist, thumb_l, thumb_r]\ndetector_classes: [dog, cat]\n")
    info = dataset_info(path)
    assert (info.metric, info.pck_threshold, info.detector_classes) == ("coco-oks", 0.2, ("dog", "cat"))


@pytest.mark.parametrize("body, parts", [
    ("metric: pkc", ["metric 'pkc' is not one of", "did you mean 'pck'", "field 'metric'"]),
    ("metric: pckh", ["metric 'pckh' with annotation_format 'coco'", "annotation_format: mpii"]),
    ("annotation_format: mpii\nmetric: coco-oks", ["metric 'coco-oks' with annotation_format 'mpii'"]),
    ("annotation_format: coco_wholebody\nmetric: pck", ["metric 'pck' reads COCO-format annotations"]),
    ("metric: pck\npck_threshold: 1.5", ["pck_threshold must be in (0, 1]", "got 1.5"]),
    ("metric: pck\npck_threshold: .nan", ["pck_threshold must be in (0, 1]"]),
    ("metric: pck\npck_normalizer: torso", ["pck_normalizer 'torso' is not one of ['bbox']"]),
    ("detector_classes: [persn]", ["detector class 'persn' is not a COCO detection class", "did you mean person"]),
    ("detector_classes: person", ["detector_classes", "list of COCO class names", "or full-frame"]),
    ("detector_classes: []", ["detector_classes", "list of COCO class names"]),
])
def test_bad_metric_and_detector_fields_name_the_field(tmp_path, body, parts):
    path = tmp_path / "bad.yaml"
    path.write_text("keypoints: [a, b]\n" + body + "\n")
    _raises([str(path), *parts], lambda: dataset_info(path))


def test_without_detector_classes_the_keypoints_decide(tmp_path):
    """A skeleton (file, or one recorded in a weights file before skeletons named classes) that does
    not say: the classes of the built-in with the same keypoint names, else the whole image."""
    coco, ap10k = dataset_info("coco"), dataset_info("ap10k")
    recorded = {k: getattr(coco, k) for k in ("name", "keypoint_names", "flip_indices", "sigmas")}
    assert DatasetInfo(**recorded).detector_classes == ("person",)
    assert DatasetInfo(name="x", keypoint_names=ap10k.keypoint_names,
                       flip_indices=ap10k.flip_indices).detector_classes == ap10k.detector_classes
    assert DatasetInfo(name="x", keypoint_names=("a", "b"), flip_indices=(0, 1)).detector_classes == ()
    mpii = dataset_info("mpii")
    legacy_mpii = DatasetInfo(name="m", keypoint_names=mpii.keypoint_names, flip_indices=mpii.flip_indices,
                              annotation_format="mpii")
    assert legacy_mpii.metric == "pckh"  # what MPII's format was scored with before skeletons said


def test_coco_file_category_named_as_a_detection_class(tmp_path):
    path = tmp_path / "ann.json"
    for category, classes in (("person", ("person",)), ("dog", ("dog",)), ("hand", ())):
        path.write_text(json.dumps({"categories": [{"id": 1, "name": category, "keypoints": ["tip", "base"],
                                                    "skeleton": [[1, 2]]}]}))
        info = dataset_info(path)
        assert (info.detector_classes, info.metric) == (classes, "coco-oks"), category
