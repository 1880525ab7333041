"""Heatmap codecs against MMPose 1.3.2 (fixtures codec_udp.npz / codec_msra.npz) and analytic facts."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vitpose.codecs import MSRAHeatmap, UDPHeatmap, flip_heatmaps, udp_encode_torch

INPUT_SIZE, HEATMAP_SIZE = (192, 256), (48, 64)
# Pure noise has a flat log landscape where one-ulp differences in the blur (another OpenCV
# build) move the Newton step visibly: compared loosely, as tests/fixtures/README.md §3 says.
SENSITIVE_ATOL = 1.0


@pytest.fixture(scope="module")
def udp_fx(fixtures_dir):
    data = np.load(fixtures_dir / "codec_udp.npz")
    out = {k: data[k] for k in data.files}
    out["info"] = json.loads(str(data["info_json"]))
    return out


@pytest.fixture(scope="module")
def msra_fx(fixtures_dir):
    data = np.load(fixtures_dir / "codec_msra.npz")
    return {k: data[k] for k in data.files}


def assert_keypoints_close(actual, expected, atol, what):
    assert actual.shape == expected.shape, what
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), err_msg=f"{what}: NaN positions")
    ok = ~np.isnan(expected)
    np.testing.assert_allclose(actual[ok], expected[ok], rtol=0, atol=atol, err_msg=what)


# ----------------------------------------------------------------------------- UDP encode

def test_udp_encode_matches_mmpose(udp_fx):
    codec = UDPHeatmap(INPUT_SIZE, HEATMAP_SIZE, sigma=2.0)
    for s, name in enumerate(udp_fx["info"]["case_names"]):
        heatmaps, weights = codec.encode(udp_fx["keypoints"][s], udp_fx["keypoints_visible"][s])
        assert heatmaps.dtype == np.float32 and weights.dtype == np.float32, name
        assert heatmaps.shape == (17, 64, 48) and weights.shape == (1, 17), name
        np.testing.assert_allclose(heatmaps, udp_fx["heatmaps"][s], rtol=0, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(weights, udp_fx["keypoint_weights"][s], err_msg=name)


def test_udp_encode_analytic_values():
    codec = UDPHeatmap()
    stride = np.array([191 / 47, 255 / 63])
    # A point exactly on heatmap cell (10, 20): peak 1 there, exp(-d^2/8) around, 0 outside the window.
    keypoints = (np.array([[[10.0, 20.0]]]) * stride).astype(np.float32)
    heatmaps, weights = codec.encode(keypoints, np.array([[0.7]], np.float32))
    hm = heatmaps[0]
    assert weights[0, 0] == np.float32(0.7)  # fractional visibility passes through as the weight
    assert hm[20, 10] == pytest.approx(1.0, abs=1e-6)
    assert hm[20, 11] == pytest.approx(np.exp(-1 / 8), abs=1e-6)
    assert hm[23, 13] == pytest.approx(np.exp(-18 / 8), abs=1e-6)
    assert hm[20, 16] > 0 and hm[20, 17] == 0 and hm[26, 10] > 0 and hm[27, 10] == 0
    # Visibility below 0.5 draws nothing but keeps its weight.
    heatmaps, weights = codec.encode(keypoints, np.array([[0.49]], np.float32))
    assert heatmaps.max() == 0 and weights[0, 0] == np.float32(0.49)


def test_udp_encode_weight_rules_at_the_border():
    codec = UDPHeatmap()
    stride = np.array([191 / 47, 255 / 63])
    # Heatmap x = -6: window [-12, 1) still covers column 0 -> drawn there, weight kept.
    # x = -7.6: int(-7.1) = -7 (toward zero), window [-13, 0) covers nothing, but MMPose's test
    # is `right < 0`, so the weight stays 1 with an empty map (kept as MMPose does it).
    # x = -8.6: int(-8.1) = -8, right = -1 < 0 -> weight 0.  x = 60 (>= W + 6): weight 0.
    points = [[-6.0, 30.0], [-7.6, 30.0], [-8.6, 30.0], [60.0, 30.0]]
    keypoints = (np.array([points]) * stride).astype(np.float32)
    heatmaps, weights = codec.encode(keypoints, np.ones((1, 4), np.float32))
    np.testing.assert_array_equal(weights, [[1, 1, 0, 0]])
    assert heatmaps[0, 30, 0] == pytest.approx(np.exp(-36 / 8), rel=1e-5)
    assert heatmaps[1:].max() == 0


def test_udp_encode_merges_instances_by_max(udp_fx):
    codec = UDPHeatmap()
    a, b = udp_fx["keypoints"][0], udp_fx["keypoints"][1]
    va, vb = udp_fx["keypoints_visible"][0], udp_fx["keypoints_visible"][1]
    merged, weights = codec.encode(np.concatenate([a, b]), np.concatenate([va, vb]))
    np.testing.assert_array_equal(merged, np.maximum(codec.encode(a, va)[0], codec.encode(b, vb)[0]))
    np.testing.assert_array_equal(weights, np.concatenate([codec.encode(a, va)[1], codec.encode(b, vb)[1]]))


def test_udp_encode_bad_shapes_and_nonfinite_keypoints():
    codec = UDPHeatmap()
    with pytest.raises(ValueError, match=r"\(N, K, 2\)"):
        codec.encode(np.zeros((17, 2)), np.ones(17))
    # A labelled keypoint with a non-finite coordinate gets no Gaussian and weight 0 (the shared
    # rule, gaussian_keypoint_weights); an unlabelled NaN keypoint keeps its visibility.
    heatmaps, weights = codec.encode(np.array([[[1.0, 2.0], [np.nan, 3.0], [np.nan, np.nan]]]),
                                     np.array([[1.0, 1.0, 0.0]]))
    np.testing.assert_array_equal(weights, [[1, 0, 0]])
    assert heatmaps[0].max() > 0.9 and heatmaps[1:].max() == 0


# ----------------------------------------------------------------------------- UDP decode

def test_udp_decode_matches_mmpose(udp_fx):
    codec = UDPHeatmap()
    for s, name in enumerate(udp_fx["info"]["case_names"]):
        keypoints, scores = codec.decode(udp_fx["heatmaps"][s])
        assert keypoints.dtype == np.float64 and keypoints.shape == (1, 17, 2), name
        assert scores.dtype == np.float32 and scores.shape == (1, 17), name
        assert_keypoints_close(keypoints, udp_fx["decoded_keypoints"][s], 1e-4, name)
        np.testing.assert_allclose(scores, udp_fx["decoded_scores"][s], rtol=0, atol=1e-7, err_msg=name)


def test_udp_decode_noisy_and_degenerate_maps(udp_fx):
    codec = UDPHeatmap()
    for i, kind in enumerate(udp_fx["info"]["noisy_kinds"]):
        keypoints, scores = codec.decode(udp_fx["noisy_heatmaps"][i])
        atol = SENSITIVE_ATOL if "SENSITIVE" in kind else 1e-4
        assert_keypoints_close(keypoints, udp_fx["noisy_decoded_keypoints"][i], atol, kind)
        np.testing.assert_allclose(scores, udp_fx["noisy_decoded_scores"][i], rtol=0, atol=1e-7, err_msg=kind)
    kinds = udp_fx["info"]["noisy_kinds"]
    # All-zero maps: NaN keypoints, score 0. All-negative maps: the argmax becomes -1.
    zero, _ = codec.decode(udp_fx["noisy_heatmaps"][kinds.index("all_zero_DEGENERATE")])
    assert np.isnan(zero).all()
    negative, _ = codec.decode(udp_fx["noisy_heatmaps"][kinds.index("all_negative_DEGENERATE")])
    np.testing.assert_allclose(negative[0], np.broadcast_to([-192 / 47, -256 / 63], (17, 2)), atol=1e-6)


def test_udp_batch_decode_equals_decode(udp_fx):
    codec = UDPHeatmap()
    maps = np.concatenate([udp_fx["heatmaps"], udp_fx["noisy_heatmaps"]])
    keypoints, scores = codec.batch_decode(maps)
    assert keypoints.shape == (len(maps), 17, 2) and scores.shape == (len(maps), 17)
    for i in range(len(maps)):
        k, s = codec.decode(maps[i])
        np.testing.assert_array_equal(keypoints[i], k[0])
        np.testing.assert_array_equal(scores[i], s[0])
    # torch input (what a model returns) decodes the same
    k_torch, s_torch = codec.batch_decode(torch.from_numpy(maps))
    np.testing.assert_array_equal(k_torch, keypoints)
    np.testing.assert_array_equal(s_torch, scores)


def test_udp_round_trip_keeps_mmpose_scale_asymmetry():
    # Encode divides by (w-1)/(W-1), decode multiplies by w/(W-1): the round trip scales by w/(w-1).
    codec = UDPHeatmap()
    rng = np.random.default_rng(0)
    keypoints = rng.uniform([30, 30], [160, 220], (1, 17, 2)).astype(np.float32)
    heatmaps, _ = codec.encode(keypoints, np.ones((1, 17), np.float32))
    decoded, scores = codec.decode(heatmaps)
    np.testing.assert_allclose(decoded, keypoints * np.array([192 / 191, 256 / 255]), atol=1e-3)
    assert (scores > 0.9).all()


def test_udp_decode_rejects_wrong_shapes():
    codec = UDPHeatmap()
    with pytest.raises(ValueError, match="heatmap_size"):
        codec.decode(np.zeros((17, 32, 24), np.float32))
    with pytest.raises(ValueError, match=r"\(K, H, W\)"):
        codec.decode(np.zeros((64, 48), np.float32))


# ----------------------------------------------------------------------------- MSRA

@pytest.mark.parametrize("prefix,unbiased", [("plain", False), ("dark", True)])
def test_msra_matches_mmpose(msra_fx, udp_fx, prefix, unbiased):
    codec = MSRAHeatmap(INPUT_SIZE, HEATMAP_SIZE, sigma=2.0, unbiased=unbiased)
    names = udp_fx["info"]["case_names"]
    for s, name in enumerate(names):
        heatmaps, weights = codec.encode(msra_fx["keypoints"][s], msra_fx["keypoints_visible"][s])
        np.testing.assert_allclose(heatmaps, msra_fx[f"{prefix}_heatmaps"][s], rtol=0, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(weights, msra_fx[f"{prefix}_keypoint_weights"][s], err_msg=name)
    keypoints, scores = codec.batch_decode(msra_fx[f"{prefix}_heatmaps"])
    assert keypoints.dtype == np.float32
    assert_keypoints_close(keypoints, msra_fx[f"{prefix}_decoded_keypoints"][:, 0], 1e-4, prefix)
    np.testing.assert_array_equal(scores, msra_fx[f"{prefix}_decoded_scores"][:, 0])
    single, _ = codec.decode(msra_fx[f"{prefix}_heatmaps"][3])
    np.testing.assert_array_equal(single[0], keypoints[3])
    # Noisy maps: DARK's Taylor step on noise is sensitive to the blur's last bits: looser.
    keypoints, scores = codec.batch_decode(udp_fx["noisy_heatmaps"])
    for i, kind in enumerate(udp_fx["info"]["noisy_kinds"]):
        atol = SENSITIVE_ATOL if "SENSITIVE" in kind else (1e-2 if unbiased else 1e-4)
        assert_keypoints_close(keypoints[i], msra_fx[f"{prefix}_noisy_decoded_keypoints"][i, 0], atol, kind)
        np.testing.assert_array_equal(scores[i], msra_fx[f"{prefix}_noisy_decoded_scores"][i, 0])


def test_msra_plain_decode_quarter_pixel_rule():
    codec = MSRAHeatmap()
    heatmaps = np.zeros((1, 64, 48), np.float32)
    heatmaps[0, 30, 20] = 1.0
    heatmaps[0, 30, 21] = 0.5  # right neighbour larger -> +0.25 in x
    heatmaps[0, 29, 20] = 0.5  # upper neighbour larger -> -0.25 in y
    keypoints, scores = codec.decode(heatmaps)
    np.testing.assert_allclose(keypoints[0, 0], [(20 + 0.25) * 4, (30 - 0.25) * 4])
    assert scores[0, 0] == 1.0


# ----------------------------------------------------------------------------- torch encode

def test_udp_encode_torch_equals_numpy(udp_fx):
    keypoints = torch.from_numpy(udp_fx["keypoints"][:, 0])
    visible = torch.from_numpy(udp_fx["keypoints_visible"][:, 0])
    heatmaps, weights = udp_encode_torch(keypoints, visible, INPUT_SIZE, HEATMAP_SIZE, 2.0)
    assert heatmaps.dtype == torch.float32 and heatmaps.shape == (21, 17, 64, 48)
    assert weights.dtype == torch.float32 and weights.shape == (21, 17)
    codec = UDPHeatmap()
    for s, name in enumerate(udp_fx["info"]["case_names"]):
        ref_heatmaps, ref_weights = codec.encode(udp_fx["keypoints"][s], udp_fx["keypoints_visible"][s])
        np.testing.assert_allclose(heatmaps[s].numpy(), ref_heatmaps, rtol=0, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(weights[s].numpy(), ref_weights[0], err_msg=name)


def test_udp_encode_torch_nonfinite_and_dtypes():
    keypoints = torch.tensor([[[10.0, 20.0], [float("nan"), 5.0], [float("inf"), 5.0]]], dtype=torch.float64)
    visible = torch.tensor([[1.0, 1.0, 0.0]])
    heatmaps, weights = udp_encode_torch(keypoints, visible)
    torch.testing.assert_close(weights, torch.tensor([[1.0, 0.0, 0.0]]))
    assert heatmaps[0, 1:].abs().max() == 0 and heatmaps[0, 0].max() > 0.9
    ref, _ = UDPHeatmap().encode(keypoints[:, :1].numpy().astype(np.float32), np.ones((1, 1)))
    np.testing.assert_allclose(heatmaps[0, :1].numpy(), ref, atol=1e-6)


def test_udp_encode_torch_equals_numpy_on_random_edge_cases():
    # Beyond the fixture: points in and far around the crop, exact half-cell ties, fractional
    # visibility; the torch targets must follow the numpy (MMPose) rules cell for cell.
    rng = np.random.default_rng(7)
    B, K = 64, 17
    keypoints = rng.uniform(-60, 260, (B, K, 2)).astype(np.float32)
    stride = np.float32([191 / 47, 255 / 63])
    ties = (rng.integers(-8, 56, (B, K, 2)) + 0.5).astype(np.float32) * stride
    keypoints = np.where(rng.random((B, K, 1)) < 0.25, ties, keypoints).astype(np.float32)
    visible = rng.choice(np.float32([0, 0.3, 0.5, 0.7, 1, 2]), (B, K))
    heatmaps, weights = udp_encode_torch(torch.from_numpy(keypoints), torch.from_numpy(visible))
    codec = UDPHeatmap()
    for b in range(B):
        ref_heatmaps, ref_weights = codec.encode(keypoints[b:b + 1], visible[b:b + 1])
        np.testing.assert_allclose(heatmaps[b].numpy(), ref_heatmaps, rtol=0, atol=1e-6, err_msg=f"sample {b}")
        np.testing.assert_array_equal(weights[b].numpy(), ref_weights[0], err_msg=f"sample {b}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_udp_encode_torch_on_cuda(udp_fx):
    keypoints = torch.from_numpy(udp_fx["keypoints"][:, 0])
    visible = torch.from_numpy(udp_fx["keypoints_visible"][:, 0])
    cpu = udp_encode_torch(keypoints, visible)
    gpu = udp_encode_torch(keypoints.cuda(), visible.cuda())
    assert gpu[0].device.type == "cuda"
    torch.testing.assert_close(gpu[0].cpu(), cpu[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(gpu[1].cpu(), cpu[1], rtol=0, atol=0)


# ----------------------------------------------------------------------------- flip

@pytest.mark.parametrize("shift,key", [(False, "flip_heatmaps_noshift"), (True, "flip_heatmaps_shift")])
def test_flip_heatmaps_matches_mmpose(udp_fx, shift, key):
    maps, indices, expected = udp_fx["flip_input"], udp_fx["flip_indices"], udp_fx[key]
    np.testing.assert_array_equal(flip_heatmaps(maps, indices, shift=shift), expected)
    flipped = flip_heatmaps(torch.from_numpy(maps), indices.tolist(), shift=shift)
    assert isinstance(flipped, torch.Tensor)
    np.testing.assert_array_equal(flipped.numpy(), expected)
    # one (K, H, W) map set works too, and the input is left untouched
    before = maps.copy()
    np.testing.assert_array_equal(flip_heatmaps(maps[0], indices, shift=shift), expected[0])
    np.testing.assert_array_equal(maps, before)


def test_flip_heatmaps_is_an_involution_without_shift(udp_fx):
    maps, indices = udp_fx["flip_input"], udp_fx["flip_indices"]
    np.testing.assert_array_equal(flip_heatmaps(flip_heatmaps(maps, indices), indices), maps)
    with pytest.raises(ValueError, match="flip indices"):
        flip_heatmaps(maps, indices[:5])


def test_msra_dark_step_in_float64_as_mmpose():
    """tests/fixtures/numeric_cases.npz (tools/reference/make_numeric_cases.py): MMPose's
    MSRAHeatmap(unbiased=True).decode, whose DARK step NumPy 1.x computes in float64, on clean
    sub-pixel Gaussians (three near the borders, left unrefined) and on the same maps with noise."""
    with np.load(Path(__file__).parent / "fixtures" / "numeric_cases.npz") as data:
        heatmaps, expected, scores = data["dark/heatmaps"], data["dark/keypoints"], data["dark/scores"]
    codec = MSRAHeatmap(INPUT_SIZE, HEATMAP_SIZE, sigma=2.0, unbiased=True)
    keypoints, ours = codec.batch_decode(heatmaps)
    np.testing.assert_array_equal(keypoints, expected)
    np.testing.assert_array_equal(ours, scores)
    for i in range(len(heatmaps)):
        np.testing.assert_array_equal(codec.decode(heatmaps[i])[0][0], expected[i])
