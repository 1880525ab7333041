"""The synthetic COCO set: valid COCO files, deterministic, and pixels that match the labels."""

import contextlib
import io
import json

import cv2
import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from vitpose.coco_meta import KEYPOINT_NAMES, SKELETON
from vitpose.data import synthetic
from vitpose.data.synthetic import make_coco

NUM_IMAGES = 40
LEFT_WRIST, RIGHT_WRIST = KEYPOINT_NAMES.index("left_wrist"), KEYPOINT_NAMES.index("right_wrist")
LEFT_SHOULDER, RIGHT_SHOULDER = KEYPOINT_NAMES.index("left_shoulder"), KEYPOINT_NAMES.index("right_shoulder")


def quiet(fn, *args):
    # pycocotools prints progress; keep test output readable.
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return make_coco(tmp_path_factory.mktemp("synth"), NUM_IMAGES, seed=3, split="val")


@pytest.fixture(scope="module")
def gt(made):
    return quiet(COCO, str(made.ann_file))


def test_layout(made):
    assert made.ann_file == made.root / "annotations" / "person_keypoints_val2017.json"
    assert made.img_dir == made.root / "val2017"
    assert made.det_file == made.root / "person_detection_results" / "val_detections.json"


def test_annotations_are_valid_coco_keypoints(made, gt):
    cat = gt.loadCats(1)[0]
    assert cat["name"] == "person"
    assert cat["keypoints"] == list(KEYPOINT_NAMES)
    assert cat["skeleton"] == [[a + 1, b + 1] for a, b in SKELETON]
    assert len(gt.getImgIds()) == NUM_IMAGES

    anns = gt.loadAnns(gt.getAnnIds())
    assert len(anns) >= NUM_IMAGES
    assert len({a["id"] for a in anns}) == len(anns)
    for ann in anns:
        img = gt.imgs[ann["image_id"]]
        kp = np.asarray(ann["keypoints"], float).reshape(-1, 3)
        assert kp.shape == (17, 3), ann["id"]
        v = kp[:, 2]
        assert set(np.unique(v)) <= {0, 1, 2}, ann["id"]
        assert ann["num_keypoints"] == int((v > 0).sum()), ann["id"]
        assert ann["category_id"] == 1 and ann["iscrowd"] == 0
        # COCO stores unlabelled keypoints as (0, 0, 0).
        assert np.all(kp[v == 0, :2] == 0), ann["id"]
        x, y, w, h = ann["bbox"]
        assert w > 0 and h > 0 and x >= 0 and y >= 0, ann["id"]
        assert x + w <= img["width"] + 1e-6 and y + h <= img["height"] + 1e-6, ann["id"]
        assert ann["area"] == pytest.approx(w * h, rel=1e-3, abs=0.05)
        labelled = kp[v > 0, :2]
        # Labelled keypoints lie in the image and in their box (up to the JSON's 2-decimal rounding).
        assert np.all(labelled >= 0) and np.all(labelled[:, 0] <= img["width"] - 1), ann["id"]
        assert np.all(labelled[:, 1] <= img["height"] - 1), ann["id"]
        assert np.all(labelled[:, 0] >= x - 0.01) and np.all(labelled[:, 0] <= x + w + 0.01), ann["id"]
        assert np.all(labelled[:, 1] >= y - 0.01) and np.all(labelled[:, 1] <= y + h + 0.01), ann["id"]

    # The hard cases a real set has are present: occluded (v=1) and truncated (v=0) keypoints.
    v_all = np.concatenate([np.asarray(a["keypoints"])[2::3] for a in anns])
    assert (v_all == 1).any() and (v_all == 0).any()
    assert (v_all == 2).mean() > 0.7  # ... but most keypoints are visible: learnable.
    assert any(0 < a["num_keypoints"] < 17 for a in anns)
    # Small people annotated without keypoints, as COCO has them: loaders filter these out.
    assert any(a["num_keypoints"] == 0 and not any(a["keypoints"]) for a in anns)


def test_images_exist_and_decode_to_their_size(made, gt):
    for img in gt.loadImgs(gt.getImgIds()):
        assert img["file_name"] == f"{img['id']:012d}.jpg"
        pixels = cv2.imread(str(made.img_dir / img["file_name"]))
        assert pixels is not None, img["file_name"]
        assert pixels.shape == (img["height"], img["width"], 3)


def _all_bytes(result):
    files = [result.ann_file, result.det_file, *sorted(result.img_dir.glob("*.jpg"))]
    return [(f.name, f.read_bytes()) for f in files]


def test_deterministic(tmp_path):
    a = make_coco(tmp_path / "a", 5, seed=11)
    b = make_coco(tmp_path / "b", 5, seed=11)
    c = make_coco(tmp_path / "c", 5, seed=12)
    assert _all_bytes(a) == _all_bytes(b)
    bytes_a, bytes_c = dict(_all_bytes(a)), dict(_all_bytes(c))
    assert all(bytes_a[name] != bytes_c[name] for name in bytes_a)
    # Image i does not depend on how many images are made, and splits differ for one seed.
    d = make_coco(tmp_path / "d", 3, seed=11)
    assert dict(_all_bytes(d))["000000000002.jpg"] == bytes_a["000000000002.jpg"]
    e = make_coco(tmp_path / "e", 1, seed=11, split="val")
    assert e.img_dir.name == "val2017"
    assert (e.img_dir / "000000000001.jpg").read_bytes() != bytes_a["000000000001.jpg"]


def _scenes(n, seed=0):
    for i in range(n):
        yield synthetic.synthesize_image(synthetic.image_rng(seed, "train", i), 320, 240, 4)


def test_visible_keypoints_are_drawn_where_labelled():
    """At every v=2 keypoint the figure covers the background; the label follows the pixels."""
    changed, total, far_changed, far_total = 0, 0, 0, 0
    for scene in _scenes(30):
        diff = np.abs(scene.image.astype(int) - scene.background.astype(int)).sum(-1)
        for kp in scene.keypoints:
            for x, y, v in kp:
                if v != 2:
                    continue
                total += 1
                changed += diff[round(y), round(x)] > 30
        # Control: away from every figure's box the image is its background.
        far = np.ones(diff.shape, bool)
        for x, y, w, h in scene.bboxes:
            far[max(0, int(y) - 4):int(y + h) + 5, max(0, int(x) - 4):int(x + w) + 5] = False
        far_total += far.sum()
        far_changed += (diff[far] > 30).sum()
    assert total > 500
    assert changed / total > 0.97
    # Occluder rectangles may sit outside boxes; everything else there is background.
    assert far_changed / far_total < 0.05


BODY_JOINTS = ("shoulder", "elbow", "wrist", "hip", "knee", "ankle")


def test_joint_dots_are_centred_on_the_labels():
    """Each visible body joint is drawn as a dark dot; the dot's centroid is the labelled point."""
    errors = []
    for scene in _scenes(20, seed=2):
        for kp, person in zip(scene.keypoints, scene.people):
            for side in ("left", "right"):
                dark = np.array([int(c * 0.45) for c in person.colors[side]], float)
                for joint in BODY_JOINTS:
                    x, y, v = kp[KEYPOINT_NAMES.index(f"{side}_{joint}")]
                    if v != 2:
                        continue
                    x0, y0 = round(x) - 4, round(y) - 4
                    if x0 < 0 or y0 < 0 or x0 + 9 > scene.image.shape[1] or y0 + 9 > scene.image.shape[0]:
                        continue
                    window = scene.image[y0:y0 + 9, x0:x0 + 9].astype(float)
                    # Weight pixels by how close they are to the dot colour (antialiased edges count less).
                    weight = np.clip(1 - np.abs(window - dark).sum(-1) / 60, 0, 1)
                    if weight.sum() < 3:
                        continue
                    ys, xs = np.mgrid[0:9, 0:9]
                    cx, cy = (weight * xs).sum() / weight.sum() + x0, (weight * ys).sum() / weight.sum() + y0
                    errors.append(np.hypot(cx - x, cy - y))
    assert len(errors) > 300
    # The antialiased dots land within a fraction of a pixel (a 1 px label shift gives ~1.0 here).
    assert np.median(errors) < 0.3
    assert np.percentile(errors, 90) < 0.6


def _disk_mean(image, x, y, r=2):
    h, w = image.shape[:2]
    ys, xs = np.mgrid[max(0, int(y) - r):min(h, int(y) + r + 1), max(0, int(x) - r):min(w, int(x) + r + 1)]
    return image[ys, xs].reshape(-1, 3).astype(float).mean(0)


def test_left_and_right_are_visibly_different():
    """Each person's two sides differ in colour, and facing decides which image side is left."""
    colour_gaps, front_order, back_order = [], [], []
    for scene in _scenes(40, seed=1):
        for kp, front in zip(scene.keypoints, scene.facing_front):
            if kp[LEFT_WRIST, 2] == 2 and kp[RIGHT_WRIST, 2] == 2:
                left = _disk_mean(scene.image, *kp[LEFT_WRIST, :2], r=3)
                right = _disk_mean(scene.image, *kp[RIGHT_WRIST, :2], r=3)
                colour_gaps.append(np.abs(left - right).sum())
            if kp[LEFT_SHOULDER, 2] > 0 and kp[RIGHT_SHOULDER, 2] > 0:
                left_is_image_right = kp[LEFT_SHOULDER, 0] > kp[RIGHT_SHOULDER, 0]
                (front_order if front else back_order).append(left_is_image_right)
    assert len(colour_gaps) > 20
    assert np.median(colour_gaps) > 60
    # Seen from the front, a person's left shoulder is on the image's right; from behind, on its left.
    assert len(front_order) > 20 and len(back_order) > 3
    assert all(front_order) and not any(back_order)


def test_detections_are_valid_results_and_overlap_gt(made, gt):
    dets = json.loads(made.det_file.read_text())
    assert all(d["category_id"] == 1 and 0 < d["score"] <= 1 for d in dets)
    res = quiet(gt.loadRes, str(made.det_file))
    assert len(res.getAnnIds()) == len(dets)

    def iou(a, b):
        ax1, ay1, bx1, by1 = a[0] + a[2], a[1] + a[3], b[0] + b[2], b[1] + b[3]
        w = max(0.0, min(ax1, bx1) - max(a[0], b[0]))
        h = max(0.0, min(ay1, by1) - max(a[1], b[1]))
        return w * h / (a[2] * a[3] + b[2] * b[3] - w * h)

    best = []
    for ann in gt.loadAnns(gt.getAnnIds()):
        same_image = [d["bbox"] for d in dets if d["image_id"] == ann["image_id"]]
        best.append(max((iou(ann["bbox"], b) for b in same_image), default=0.0))
    assert np.mean(np.array(best) > 0.5) > 0.9
    # Boxes matching no person (false positives) score low.
    for d in dets:
        gts = gt.loadAnns(gt.getAnnIds(imgIds=d["image_id"]))
        if max((iou(d["bbox"], g["bbox"]) for g in gts), default=0.0) < 0.1:
            assert d["score"] < 0.35


def test_gt_keypoints_as_predictions_score_ap_one(gt):
    preds = [
        {"image_id": a["image_id"], "category_id": 1, "keypoints": a["keypoints"], "score": 1.0}
        for a in gt.loadAnns(gt.getAnnIds())
        if a["num_keypoints"] > 0
    ]
    dt = quiet(gt.loadRes, preds)
    ev = COCOeval(gt, dt, "keypoints")
    quiet(ev.evaluate)
    quiet(ev.accumulate)
    quiet(ev.summarize)
    assert ev.stats[0] == pytest.approx(1.0)
    assert ev.stats[5] == pytest.approx(1.0)  # AR


def test_bad_arguments_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match="num_images"):
        make_coco(tmp_path, 0, seed=0)
    with pytest.raises(ValueError, match="max_people"):
        make_coco(tmp_path, 1, seed=0, max_people=9)
