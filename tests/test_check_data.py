"""Preflight: `vitpose check-data` and train.py's `preflight` catch the silent failures.

Each bad case is a file that would otherwise train to a loss of zero or AP 0 without any error.
"""

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import REPO

from vitpose import cli
from vitpose.builders import build_dataset_info, build_train_set, dataset_info_path
from vitpose.cli import check_data
from vitpose.config import ConfigError, load_config
from vitpose.data import check as C
from vitpose.data.errors import DataError
from vitpose.data.metainfo import dataset_info
from vitpose.data.synthetic import make_coco

K5 = REPO / "configs" / "demo_k5_skeleton.yaml"


@pytest.fixture(scope="module")
def k5_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("k5")
    info = dataset_info(K5)
    make_coco(root, 6, seed=3, split="train", dataset_info=info)
    make_coco(root, 3, seed=3, split="val", dataset_info=info)
    return root


def _cfg(root, *overrides):
    return load_config(REPO / "configs" / "demo_k5.yaml", [f"data.root={root}", f"data.dataset_info={K5}",
                                                           *overrides])


@pytest.mark.parametrize("flip, problem", [
    ([0, 2, 1, 4, 3], None), ([0, 1, 2], None),
    ([0, 2, 1], None), ([0, 1], "2 flip indices for 3 keypoints"),
    ([0, 1, 5], "flip index 5 is out of range 0..2"),
    ([1, 1, 2], "not a permutation: index 1 is the mirror of two keypoints"),
    ([1, 2, 0], "not its own inverse: 0 -> 1 -> 2"),
])
def test_flip_problem(flip, problem):
    assert C.flip_problem(flip, 3 if len(flip) != 5 else 5) == problem


def test_clean_k5_set_passes(k5_root, capsys):
    code = cli.main(["check-data", "--config", str(REPO / "configs" / "demo_k5.yaml"), "--data-root", str(k5_root),
                            "--set", f"data.dataset_info={K5}", "--all"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "'demo_k5': 5 keypoints, 2 flip pairs, 4 limbs" in out
    assert "model 5, skeleton 5" in out and "file 5, skeleton 5" in out
    assert "6 of 6 images decoded" in out and "3 of 3 images decoded" in out
    # the per-joint table names the skeleton's joints, and the box histogram is there
    for name in ("nose", "left_wrist", "right_ankle"):
        assert f" {name} " in out
    assert "instances by box size" in out
    assert "0 error(s)" in out


def test_model_k_differs_from_skeleton(k5_root, capsys):
    code = cli.main(["check-data", "--config", str(REPO / "configs" / "demo_k5.yaml"), "--data-root", str(k5_root),
                            "--set", f"data.dataset_info={K5}", "--set", "model.num_keypoints=17"])
    out = capsys.readouterr().out
    assert code == 1
    assert "K model = skeleton" in out and "model 17, skeleton 5" in out and "set model.num_keypoints: 5" in out
    with pytest.raises(ConfigError, match="model.num_keypoints is 17 but the skeleton 'demo_k5'"):
        build_dataset_info(_cfg(k5_root, "model.num_keypoints=17"))


def test_skeleton_differs_from_file_is_a_failed_check(k5_root, capsys):
    # COCO's skeleton on a 5-keypoint file: the set cannot be read, named, exit status 1
    code = cli.main(["check-data", "--config", str(REPO / "configs" / "demo_k5.yaml"), "--data-root", str(k5_root),
                            "--set", "data.dataset_info=coco", "--set", "model.num_keypoints=17"])
    out = capsys.readouterr().out
    assert code == 1
    assert "train set" in out and "category 1 has 5 keypoints but the skeleton 'coco' has 17" in out


def test_unknown_dataset_name_exits_2(k5_root, capsys):
    code = cli.main(["check-data", "--config", str(REPO / "configs" / "demo_k5.yaml"), "--data-root", str(k5_root),
                            "--set", "data.dataset_info=coco_whole_body"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown dataset 'coco_whole_body'" in err and "did you mean 'coco_wholebody'" in err


def _rewrite(root, name, edit):
    path = root / "annotations" / name
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _copy_set(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_all_zero_targets_is_an_error(k5_root, tmp_path):
    # v = 0 everywhere, but num_keypoints says otherwise (a wrong visibility column): MMPose keeps the
    # records and trains on all-zero weights.
    root = _copy_set(k5_root, tmp_path / "set")

    def hide(doc):
        for ann in doc["annotations"]:
            ann["keypoints"][2::3] = [0] * 5
            ann["num_keypoints"] = 5
            ann["keypoints"][0::3] = [v or 5.0 for v in ann["keypoints"][0::3]]
    _rewrite(root, "person_keypoints_train2017.json", hide)
    cfg = _cfg(root)
    report = check_data.preflight(cfg, build_train_set(cfg))
    failed = {f.check: f.detail for f in report.errors}
    assert "all-zero keypoint weights" in failed["training targets"]
    assert "train no visible keypoint" in failed
    assert "never labelled" in failed["train joints labelled"]
    with pytest.raises(DataError, match="preflight found 3 error"):
        report.raise_on_error()


def test_normalised_keypoints_are_an_error(k5_root, tmp_path):
    root = _copy_set(k5_root, tmp_path / "set")

    def normalise(doc):
        sizes = {im["id"]: (im["width"], im["height"]) for im in doc["images"]}
        for ann in doc["annotations"]:
            w, h = sizes[ann["image_id"]]
            ann["keypoints"][0::3] = [x / w for x in ann["keypoints"][0::3]]
            ann["keypoints"][1::3] = [y / h for y in ann["keypoints"][1::3]]
    _rewrite(root, "person_keypoints_train2017.json", normalise)
    cfg = _cfg(root)
    report = check_data.preflight(cfg, build_train_set(cfg))
    failed = {f.check: f.detail for f in report.errors}
    assert "keypoints must be in pixels" in failed["train keypoint units"]


def test_unlabelled_joint_and_default_sigmas_warn(k5_root, tmp_path):
    root = _copy_set(k5_root, tmp_path / "set")

    def drop_nose(doc):
        for ann in doc["annotations"]:
            ann["keypoints"][0:3] = [0, 0, 0]
    _rewrite(root, "person_keypoints_train2017.json", drop_nose)
    ann_file = root / "annotations" / "person_keypoints_train2017.json"
    cfg = _cfg(root, f"data.dataset_info={ann_file}")  # the annotation file's own skeleton
    report = check_data.preflight(cfg, build_train_set(cfg))
    warned = {f.check: f.detail for f in report.warnings}
    assert "never labelled" in warned["train joints labelled"] and "nose" in warned["train joints labelled"]
    assert "default 0.0669" in warned["OKS sigmas"]
    assert "half-body augmentation is off" in warned["half-body sets"]
    assert not report.errors


def test_unreadable_images(k5_root, tmp_path):
    root = _copy_set(k5_root, tmp_path / "set")
    (root / "train2017" / "000000000002.jpg").write_bytes(b"\xff\xd8broken")
    cfg = _cfg(root)
    train_set = build_train_set(cfg)
    [finding] = C.check_images(train_set, "all")
    assert finding.status == C.WARN and "1 unreadable of 6 of 6 images" in finding.detail
    assert "000000000002.jpg" in finding.detail and "max_bad_images" in finding.detail
    for path in (root / "train2017").glob("*.jpg"):
        path.write_bytes(b"not an image")
    [finding] = C.check_images(train_set, "sample", limit=4)
    assert finding.status == C.ERROR and "4 unreadable of 4 of 6 images (sample" in finding.detail
    from vitpose.builders import build_val_set

    val_set = build_val_set(cfg)
    cv2.imwrite(str(root / "val2017" / "000000000001.jpg"), np.zeros((10, 10, 3), np.uint8))  # wrong size
    [finding] = C.check_images(val_set, "all", name="val")
    assert finding.status == C.ERROR and "record says 320x240" in finding.detail


def test_box_size_histogram_counts_every_instance(k5_root):
    train_set = build_train_set(_cfg(k5_root))
    finding, text = C.box_size_histogram(train_set)
    boxes = train_set.index.bbox_xyxy.astype(np.float64)
    size = np.sqrt((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]))
    counts = [int(line.split()[1]) for line in text.splitlines()[1:]]
    assert counts == np.histogram(size, bins=np.asarray(C.BOX_SIZE_EDGES))[0].tolist()
    assert sum(counts) == len(train_set) and finding.status == C.OK


def test_dataset_info_path_resolution(tmp_path, monkeypatch):
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "sk.yaml").write_text("keypoints: [a]\n")
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "other.yaml").write_text("keypoints: [a, b]\n")
    monkeypatch.chdir(tmp_path / "cwd")
    cfg = load_config(None, [f"data.root={tmp_path / 'root'}"])
    assert dataset_info_path(cfg) == "coco"
    cfg.data.dataset_info = "sk.yaml"
    assert Path(dataset_info_path(cfg)) == tmp_path / "root" / "sk.yaml"  # under data.root first
    cfg.data.dataset_info = "other.yaml"
    assert Path(dataset_info_path(cfg)) == Path("other.yaml")  # else the working directory
    cfg.data.dataset_info = "nowhere.yaml"
    with pytest.raises(DataError, match=r"data.dataset_info: skeleton file not found .*nowhere.yaml"):
        build_dataset_info(cfg)


def test_flip_pairs_the_names_contradict_warn():
    from vitpose.data.metainfo import DatasetInfo

    names = ("nose", "left_eye", "right_eye", "left_paw", "right_paw")
    crossed = DatasetInfo("x", names, (0, 3, 4, 1, 2))
    [warn] = [f for f in C.check_skeleton(crossed) if f.check == "flip pairs by name"]
    assert warn.status == C.WARN and "'left_eye' mirrors to 'left_paw', not 'right_eye'" in warn.detail
    kept = DatasetInfo("x", names, (0, 1, 2, 4, 3))
    [warn] = [f for f in C.check_skeleton(kept) if f.check == "flip pairs by name"]
    assert "'left_eye' mirrors to itself although 'right_eye' exists" in warn.detail
    assert not [f for f in C.check_skeleton(dataset_info("coco_wholebody")) if f.status != C.OK]


def test_a_synthetic_config_before_its_set_is_written_says_how_to_write_it(tmp_path, capsys, monkeypatch):
    # N27: README's `vitpose check-data --config demo_k5` in a fresh folder gave two ERROR rows
    # "annotation file not found" and nothing said that `vitpose train --config demo_k5` writes the set.
    monkeypatch.chdir(tmp_path)
    code = cli.main(["check-data", "--config", "demo_k5"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "", captured.out
    (line,) = captured.err.strip().splitlines()
    assert "`vitpose train --config demo_k5` writes to work_dirs/demo_k5/synthetic_coco before training" in line
    assert "not written yet" in line and "annotations" in line
    # Once written (here by the same synthetic writer train uses), the table as before.
    cfg = load_config("demo_k5")
    root = tmp_path / cfg.data.root
    info = dataset_info(REPO / "configs" / "demo_k5_skeleton.yaml")
    make_coco(root, 4, seed=3, split="train", dataset_info=info)
    make_coco(root, 2, seed=3, split="val", dataset_info=info)
    code = cli.main(["check-data", "--config", "demo_k5"])
    assert code == 0 and "0 error(s)" in capsys.readouterr().out
