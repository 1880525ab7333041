"""`resampled_ap`: COCO AP of a bootstrap resample of the evaluated images, against pycocotools run
on a dataset that really holds those images (repeats as new images), and the precision gate's
paired interval built on it."""

import copy
import sys
from pathlib import Path

import numpy as np
import pytest

from vitpose.coco_meta import SIGMAS
from vitpose.evaluation.coco_evaluator import resampled_ap, run_cocoeval

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from precision_gate import GateResult, paired_bootstrap  # noqa: E402


def _ground_truth_and_results(seed=0, images=7):
    """Random people (17 keypoints, a few unlabelled) and noisy detections of them, with a false
    positive in some images and equal scores across images (so that the pooling order matters)."""
    rng = np.random.default_rng(seed)
    gt_images, annotations, results = [], [], []
    for image_id in range(1, images + 1):
        gt_images.append({"id": image_id, "width": 320, "height": 240, "file_name": f"{image_id}.jpg"})
        for _ in range(int(rng.integers(1, 4))):
            x, y, w, h = rng.uniform(0, 150), rng.uniform(0, 100), rng.uniform(30, 150), rng.uniform(40, 130)
            points = np.stack([rng.uniform(x, x + w, 17), rng.uniform(y, y + h, 17)], axis=1)
            visible = np.where(rng.random(17) < 0.15, 0, 2)
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": 1, "iscrowd": 0,
                                "bbox": [x, y, w, h], "area": w * h, "num_keypoints": int((visible > 0).sum()),
                                "keypoints": np.column_stack([points * (visible[:, None] > 0), visible]).ravel().tolist()})
            noisy = points + rng.normal(0, rng.uniform(1, 12), points.shape)
            results.append({"image_id": image_id, "category_id": 1, "score": float(rng.choice([0.5, 0.7, 0.9])),
                            "keypoints": np.column_stack([noisy, np.ones(17)]).ravel().tolist()})
        if rng.random() < 0.5:  # a false positive
            fake = np.column_stack([rng.uniform(0, 320, 17), rng.uniform(0, 240, 17), np.ones(17)])
            results.append({"image_id": image_id, "category_id": 1, "score": 0.7, "keypoints": fake.ravel().tolist()})
    return {"images": gt_images, "annotations": annotations,
            "categories": [{"id": 1, "name": "person", "keypoints": [str(i) for i in range(17)], "skeleton": []}]}, results


def _coco(dataset):
    from pycocotools.coco import COCO

    coco = COCO()
    coco.dataset = copy.deepcopy(dataset)
    coco.createIndex()
    return coco


def _evaluate(dataset, results):
    return run_cocoeval(_coco(dataset), results, np.asarray(SIGMAS, np.float32))


def _resampled_dataset(dataset, results, draws):
    """The dataset holding the drawn images in that order, each repeat a new image (ids 1, 2, ...)."""
    ids = [image["id"] for image in sorted(dataset["images"], key=lambda image: image["id"])]
    images, annotations, new_results = [], [], []
    for new_id, position in enumerate(draws, start=1):
        old_id = ids[position]
        images.append({**next(i for i in dataset["images"] if i["id"] == old_id), "id": new_id})
        for ann in dataset["annotations"]:
            if ann["image_id"] == old_id:
                annotations.append({**ann, "id": len(annotations) + 1, "image_id": new_id})
        new_results += [{**r, "image_id": new_id} for r in results if r["image_id"] == old_id]
    return {**dataset, "images": images, "annotations": annotations}, new_results


def test_resampled_ap_is_cocoeval_on_the_resampled_images():
    dataset, results = _ground_truth_and_results()
    evaluation = _evaluate(dataset, results)
    assert 0.05 < evaluation.stats[0] < 0.95  # neither trivial end: the matches and the order matter
    # all images once, in order: COCOeval's own AP, exactly
    assert resampled_ap(evaluation, range(7)) == evaluation.stats[0]
    for draws in ([2, 0, 0, 5, 3, 3, 3, 1], [6, 6, 4], [1, 0, 2, 3, 4, 5, 6], [3]):
        expected = _evaluate(*_resampled_dataset(dataset, results, draws)).stats[0]
        assert resampled_ap(evaluation, draws) == expected, draws  # the same per-image matches, pooled alike


def test_resampled_ap_leaves_the_evaluation_as_it_was_and_checks_its_draws():
    dataset, results = _ground_truth_and_results(seed=1)
    evaluation = _evaluate(dataset, results)
    stats, image_ids, entries = evaluation.stats.copy(), list(evaluation.params.imgIds), len(evaluation.evalImgs)
    resampled_ap(evaluation, [0, 0, 0])
    assert (evaluation.stats == stats).all() and evaluation.params.imgIds == image_ids
    assert evaluation._paramsEval.imgIds == image_ids and len(evaluation.evalImgs) == entries
    with pytest.raises(ValueError, match="among the 7 evaluated images, got 2 from 0 to 7"):
        resampled_ap(evaluation, [0, 7])
    with pytest.raises(ValueError, match="got 0"):
        resampled_ap(evaluation, [])


def test_paired_bootstrap_interval():
    dataset, results = _ground_truth_and_results(seed=2, images=30)
    reference = _evaluate(dataset, results)
    assert paired_bootstrap(reference, _evaluate(dataset, results), 50) == (0.0, 0.0)  # same results: no difference
    # Every score halved: the ranking and the matches are the same, so the AP of any resample is too.
    halved = [{**r, "score": r["score"] / 2} for r in results]
    assert paired_bootstrap(reference, _evaluate(dataset, halved), 50) == (0.0, 0.0)
    # Worse keypoints in every image: AP drops in every resample, so the whole interval is below 0,
    # and it is the same for the same seed (pairs drawn alike for both runs).
    worse = [{**r, "keypoints": (np.asarray(r["keypoints"]) + np.tile([6.0, 0.0, 0.0], 17)).tolist()} for r in results]
    worse_eval = _evaluate(dataset, worse)
    low, high = paired_bootstrap(reference, worse_eval, 200, seed=3)
    assert low <= worse_eval.stats[0] - reference.stats[0] <= high < 0
    assert paired_bootstrap(reference, worse_eval, 200, seed=3) == (low, high)


def test_a_gate_set_resolves_the_gate_only_when_its_interval_is_within_the_gate():
    def result(difference, interval):
        return GateResult("bf16", 0.5, 0.5 + difference, 10, 0.0, 0.0, 0.0, interval)

    assert result(0.001, None).resolves_gate is None
    assert result(0.001, (-0.0005, 0.0025)).resolves_gate
    # off-centre, as resampled AP differences can be (AVX2 emulation, demo model, 1000 images): narrow enough
    assert result(-0.0006, (-0.0009, 0.0017)).resolves_gate
    assert not result(0.001, (-0.0016, 0.0025)).resolves_gate  # half-width 0.00205
    assert not result(0.0028, (-0.0011, 0.0075)).resolves_gate  # ViTPose-S on the demo's 100 images
    assert "cannot resolve the gate" in result(0.0028, (-0.0011, 0.0075)).line()
    assert "this set resolves the gate" in result(0.0003, (-0.0007, 0.0019)).line()
    assert not result(0.0028, (0.001, 0.004)).passed and result(-0.0019, None).passed
