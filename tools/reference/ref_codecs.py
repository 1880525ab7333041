"""codec_udp.npz and codec_msra.npz: MMPose's UDP and MSRA heatmap codecs (tests/fixtures/README.md §2, §4.1-4.4)."""

import warnings

import cases as case_recipes
import numpy as np
import torch
from common import FLIP_INDICES, HEATMAP_SIZE, INPUT_SIZE, load_cases, save_npz
from mmpose.codecs import MSRAHeatmap, UDPHeatmap
from mmpose.models.utils.tta import flip_heatmaps

SIGMA = 2
# DARK encodes a Gaussian over the whole map; its far tail (values far below the tests' 1e-6
# tolerance) does not compress. The stored maps are rounded to multiples of 2^-22 (error
# <= 1.2e-7) and every DARK reference is decoded from the stored values.
DARK_GRID = 2.0**-22

UDP_NOTES = (
    "encode: keypoints / ((input-1)/(heatmap-1)); decode: argmax -> refine_keypoints_dark_udp(blur 11) -> "
    "kpt / [W-1,H-1] * input_size. keypoint_weights is a copy of visibility (fractional values kept) and set "
    "to 0 when the 3-sigma square is fully outside; visibility < 0.5 gets no gaussian. Decoded arrays have "
    "shape (S,1,K,2)/(S,1,K) and MMPose's own dtype (UDP decoded keypoints are float64). flip_* = "
    "flip_heatmaps(heatmaps[:4], COCO flip_indices, flip_mode=heatmap, shift_heatmap False/True). "
    "noisy_heatmaps hold float16 values. Made by tools/reference/make_fixtures.py (ref_codecs.py).")
MSRA_NOTES = (
    "Prefix plain_ = MSRAHeatmap(unbiased=False), dark_ = MSRAHeatmap(unbiased=True). plain encode: Gaussian "
    "at int(kpt/4+0.5) in a 3-sigma window; decode: argmax + 0.25 px towards the larger neighbour, x4. dark "
    "encode: Gaussian at the exact sub-pixel position over the whole map; decode: blur(11) + log + Taylor "
    "step, x4. *_noisy_decoded_* decode codec_udp.npz['noisy_heatmaps']. dark_heatmaps: {dark_note}. Made by "
    "tools/reference/make_fixtures.py (ref_codecs.py).")


def codec_cases(cases_dir):
    """The keypoint sets and noisy maps: from an existing codec_udp.npz, or freshly drawn."""
    loaded = load_cases(cases_dir, "codec_udp.npz")
    if loaded is None:
        return case_recipes.draw_codec_cases()
    arrays, info = loaded
    return {"keypoints": arrays["keypoints"], "keypoints_visible": arrays["keypoints_visible"],
            "case_names": info["case_names"], "noisy_heatmaps": arrays["noisy_heatmaps"],
            "noisy_kinds": info["noisy_kinds"], "seed": info.get("seed")}


def _decode_all(codec, heatmap_sets):
    """MMPose decode of each (17,64,48) set; returns keypoints, scores, warning count."""
    keypoints, scores = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for maps in heatmap_sets:
            k, s = codec.decode(maps)
            keypoints.append(k)
            scores.append(s)
    return np.stack(keypoints), np.stack(scores), len(caught)


def _encode_all(codec, case):
    heatmaps, weights = [], []
    for keypoints, visible in zip(case["keypoints"], case["keypoints_visible"]):
        encoded = codec.encode(keypoints, visible)
        heatmaps.append(encoded["heatmaps"])
        weights.append(encoded["keypoint_weights"])
    return np.stack(heatmaps), np.stack(weights)


def make_udp(case):
    """codec_udp.npz arrays and info; draws the noisy maps first if the cases are fresh."""
    codec = UDPHeatmap(input_size=INPUT_SIZE, heatmap_size=HEATMAP_SIZE, sigma=SIGMA)
    heatmaps, weights = _encode_all(codec, case)
    if "noisy_heatmaps" not in case:
        case_recipes.noisy_from_clean(case, heatmaps)
    decoded, scores, clean_warnings = _decode_all(codec, heatmaps)
    noisy_decoded, noisy_scores, noisy_warnings = _decode_all(codec, case["noisy_heatmaps"])
    flip_input = heatmaps[:4]
    flipped = {shift: flip_heatmaps(torch.from_numpy(flip_input), flip_indices=FLIP_INDICES, flip_mode="heatmap",
                                    shift_heatmap=shift).numpy() for shift in (False, True)}
    arrays = {
        "keypoints": case["keypoints"], "keypoints_visible": case["keypoints_visible"],
        "heatmaps": heatmaps, "keypoint_weights": weights,
        "decoded_keypoints": decoded, "decoded_scores": scores,
        "noisy_heatmaps": case["noisy_heatmaps"],
        "noisy_decoded_keypoints": noisy_decoded, "noisy_decoded_scores": noisy_scores,
        "flip_indices": np.array(FLIP_INDICES, np.int64), "flip_input": flip_input,
        "flip_heatmaps_noshift": flipped[False], "flip_heatmaps_shift": flipped[True],
    }
    info = {"codec": "UDPHeatmap", "input_size": list(INPUT_SIZE), "heatmap_size": list(HEATMAP_SIZE),
            "sigma": SIGMA, "heatmap_type": "gaussian", "blur_kernel_size": codec.blur_kernel_size,
            "case_names": case["case_names"], "noisy_kinds": case["noisy_kinds"], "seed": case["seed"],
            "decode_warnings": [clean_warnings, noisy_warnings], "notes": UDP_NOTES}
    return arrays, info


def make_msra(case, compact):
    """codec_msra.npz arrays and info for the same keypoint sets and noisy maps.

    Args:
        case: the codec cases, noisy maps included (make_udp adds them).
        compact: round the DARK maps to DARK_GRID before decoding them (the committed form).
    """
    arrays = {"keypoints": case["keypoints"], "keypoints_visible": case["keypoints_visible"]}
    info = {"codec": "MSRAHeatmap", "input_size": list(INPUT_SIZE), "heatmap_size": list(HEATMAP_SIZE),
            "sigma": SIGMA, "blur_kernel_size": 11, "case_names": case["case_names"],
            "noisy_kinds": case["noisy_kinds"], "seed": case["seed"]}
    for prefix, unbiased in (("plain", False), ("dark", True)):
        codec = MSRAHeatmap(input_size=INPUT_SIZE, heatmap_size=HEATMAP_SIZE, sigma=SIGMA, unbiased=unbiased)
        heatmaps, weights = _encode_all(codec, case)
        if unbiased and compact:
            heatmaps = (np.round(heatmaps.astype(np.float64) / DARK_GRID) * DARK_GRID).astype(np.float32)
        decoded, scores, clean_warnings = _decode_all(codec, heatmaps)
        noisy_decoded, noisy_scores, noisy_warnings = _decode_all(codec, case["noisy_heatmaps"])
        arrays.update({f"{prefix}_heatmaps": heatmaps, f"{prefix}_keypoint_weights": weights,
                       f"{prefix}_decoded_keypoints": decoded, f"{prefix}_decoded_scores": scores,
                       f"{prefix}_noisy_decoded_keypoints": noisy_decoded,
                       f"{prefix}_noisy_decoded_scores": noisy_scores})
        info[f"{prefix}_decode_warnings"] = [clean_warnings, noisy_warnings]
    dark_note = ("rounded to multiples of 2^-22 (<= 1.2e-7 from MMPose's encode); the dark decodes are of these "
                 "rounded maps" if compact else "MMPose's encode output as is")
    info["notes"] = MSRA_NOTES.format(dark_note=dark_note)
    return arrays, info


def write(out_dir, cases_dir, compact):
    """Writes codec_udp.npz and codec_msra.npz; returns the file names."""
    case = codec_cases(cases_dir)
    udp_arrays, udp_info = make_udp(case)
    save_npz(out_dir / "codec_udp.npz", udp_arrays, udp_info)
    msra_arrays, msra_info = make_msra(case, compact)
    save_npz(out_dir / "codec_msra.npz", msra_arrays, msra_info)
    return ["codec_udp.npz", "codec_msra.npz"]

