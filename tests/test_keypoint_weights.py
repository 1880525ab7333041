"""The UDP keypoint-weight rule: one function (`gaussian_keypoint_weights`) behind the numpy
encode, the torch encode and the dataset's weights without heatmaps; equal to MMPose 1.3.2's
UDPHeatmap on the window's edges (tests/fixtures/udp_weight_cases.json, made in the reference
venv by tools/reference/make_udp_weight_cases.py), and defined where MMPose's is not."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vitpose.codecs import UDPHeatmap, udp_encode_torch
from vitpose.codecs.udp import gaussian_keypoint_weights, udp_stride
from vitpose.data.coco import CocoKeypoints

FIXTURE = Path(__file__).parent / "fixtures" / "udp_weight_cases.json"


@pytest.fixture(scope="module")
def mmpose_cases():
    return json.loads(FIXTURE.read_text())["cases"]


def _three_ways(keypoints, visible, input_size=(192, 256), heatmap_size=(48, 64), sigma=2.0):
    """Weights (N, K) of the numpy encode, the weights-only path and the torch encode."""
    codec = UDPHeatmap(input_size, heatmap_size, sigma)
    encoded = codec.encode(keypoints, visible)[1]
    weights_only = codec.keypoint_weights(keypoints, visible)
    on_torch = udp_encode_torch(torch.from_numpy(keypoints), torch.from_numpy(visible), input_size,
                                heatmap_size, sigma)[1].numpy()
    for w in (encoded, weights_only, on_torch):
        assert w.dtype == np.float32 and w.shape == keypoints.shape[:2]
    return encoded, weights_only, on_torch


def test_all_three_equal_mmpose_at_the_window_edges(mmpose_cases):
    for case in mmpose_cases:
        keypoints = np.array(case["keypoints"], np.float32)
        visible = np.array(case["keypoints_visible"], np.float32)
        want = np.array(case["keypoint_weights"], np.float32)
        # The fixture exercises both outcomes for labelled keypoints on every setting.
        labelled = visible >= 0.5
        assert (want[labelled] == 0).sum() > 20 and (want[labelled] > 0).sum() > 20
        for got in _three_ways(keypoints, visible, case["input_size"], case["heatmap_size"], case["sigma"]):
            np.testing.assert_array_equal(got, want, err_msg=str(case["sigma"]))


def test_far_away_and_nonfinite_keypoints_get_weight_zero():
    """Where MMPose's int64 cast is undefined (|x| >= 2^63, inf, NaN) the rule still answers:
    a labelled keypoint gets weight 0, an unlabelled one keeps its visibility."""
    big = np.finfo(np.float32).max
    coords = [1e19, -1e19, 1e30, -1e30, big, -big, np.inf, -np.inf, np.nan]
    points = [(c, 50.0) for c in coords] + [(50.0, c) for c in coords] + [(np.nan, np.nan), (100.0, 100.0)]
    keypoints = np.array([points], np.float32)
    for visible_value in (1.0, 0.7, 0.3, 0.0):
        visible = np.full(keypoints.shape[:2], visible_value, np.float32)
        want = np.full(keypoints.shape[:2], 0.0 if visible_value >= 0.5 else visible_value, np.float32)
        want[0, -1] = visible_value  # the one keypoint on the map
        for got in _three_ways(keypoints, visible):
            np.testing.assert_array_equal(got, want, err_msg=str(visible_value))


def test_boundary_by_the_integer_casts_for_noninteger_radius():
    """sigma 1.5 (radius 4.5): the thresholds are where MMPose's two truncations put them, here
    worked out by hand in heatmap cells. x >= 52.5: int(x + 0.5) >= 53 and int(53 - 4.5) = 48 >= W,
    dropped; x just below 52.5 stays. x <= -7.5: int(x + 0.5) <= -7, int(-7 + 5.5) = -1 < 0,
    dropped; x just above -7.5 gives int(-6 + 5.5) = 0, kept."""
    stride = udp_stride((192, 256), (48, 64))
    cells = np.array([52.5, np.nextafter(np.float32(52.5), np.float32(0)), -7.5,
                      np.nextafter(np.float32(-7.5), np.float32(0))], np.float32)
    keypoints_hm = np.stack([cells, np.full(4, 30, np.float32)], axis=-1)[None]
    weights, drawn = gaussian_keypoint_weights(keypoints_hm, np.ones((1, 4), np.float32), (48, 64), 1.5)
    np.testing.assert_array_equal(weights, [[0, 1, 0, 1]])
    np.testing.assert_array_equal(drawn, [[False, True, False, True]])
    # The same through the codecs, from input pixels placed where those cells come out.
    keypoints = keypoints_hm * stride
    assert np.array_equal(keypoints / stride, keypoints_hm)
    for got in _three_ways(keypoints.astype(np.float32), np.ones((1, 4), np.float32), sigma=1.5):
        np.testing.assert_array_equal(got, [[0, 1, 0, 1]])


def test_torch_and_numpy_rule_are_one_function():
    """The rule takes numpy arrays and torch tensors and gives the same answer in each."""
    rng = np.random.default_rng(3)
    keypoints = rng.uniform(-20, 80, (16, 17, 2)).astype(np.float32)
    keypoints[0, 0], keypoints[0, 1], keypoints[0, 2, 1] = np.nan, np.inf, -np.inf
    visible = rng.choice(np.float32([0, 0.3, 0.5, 1, 2]), (16, 17))
    w_np, d_np = gaussian_keypoint_weights(keypoints, visible, (48, 64), 2.0)
    w_t, d_t = gaussian_keypoint_weights(torch.from_numpy(keypoints), torch.from_numpy(visible), (48, 64), 2.0)
    assert isinstance(w_t, torch.Tensor) and w_t.dtype == torch.float32 and d_t.dtype == torch.bool
    np.testing.assert_array_equal(w_t.numpy(), w_np)
    np.testing.assert_array_equal(d_t.numpy(), d_np)


def test_dataset_weights_without_heatmaps_follow_the_rule(coco_mini_dir):
    """The dataset's lazy-target path (encode_targets=False) gives the codec's weights."""
    lazy = CocoKeypoints(coco_mini_dir / "test_coco.json", coco_mini_dir, train=True, encode_targets=False)
    codec = UDPHeatmap()
    for epoch in range(3):
        for i in range(len(lazy)):
            s = lazy[(i, epoch)]
            _, want = codec.encode(s["keypoints"].numpy()[None], s["keypoints_visible"].numpy()[None])
            np.testing.assert_array_equal(s["keypoint_weights"].numpy(), want[0])
