"""UDP keypoint weights of MMPose 1.3.2's UDPHeatmap at the window's edges -> tests/fixtures/udp_weight_cases.json.

Run in the MMPose reference venv (never a dependency of vitpose):

    ~/.cache/mmpose-ref-venv/bin/python tools/reference/make_udp_weight_cases.py

For a few codec settings (sigma 2 as ViTPose, a non-integer window radius, another size) it
encodes keypoints placed on, and one or two float32 steps around, the coordinates where the
(6 sigma + 1)-cell window leaves the heatmap on each side, plus far-away and random ones, with
visibilities 0, 0.3, 0.5, 1 and 2, and stores MMPose's keypoint_weights. Only finite keypoints
whose int64 cast is defined are used (MMPose's result is undefined beyond that).
tests/test_keypoint_weights.py reads it.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
# mmcompat.py (the import shim of the reference venv) lives beside this script (tools/reference/README.md).
MMPOSE_REF = Path(os.environ.get("VITPOSE_MMPOSE_REF", Path(__file__).resolve().parent))
OUT = REPO / "tests" / "fixtures" / "udp_weight_cases.json"
SETTINGS = [  # input_size (w, h), heatmap_size (W, H), sigma
    ((192, 256), (48, 64), 2.0),
    ((192, 256), (48, 64), 1.5),
    ((288, 384), (72, 96), 3.0),
]
K = 17


def edge_keypoints(input_size, heatmap_size, sigma, rng):
    """Keypoints (N, K, 2) float32 in input pixels around the four window edges, and beyond."""
    stride = ((np.array(input_size) - 1) / (np.array(heatmap_size) - 1)).astype(np.float32)
    radius = 3 * sigma
    values = []
    for axis, size in enumerate(heatmap_size):
        # Heatmap coordinates where int(int(x + 0.5) -/+ radius ...) changes near each edge.
        edges = [size + radius - 0.5, size + radius - 1.5, -radius - 1.5, -radius - 2.5, -0.5, size - 0.5]
        for edge in edges:
            for delta in (-0.5, -1e-3, 0.0, 1e-3, 0.5):
                pixel = np.float32((edge + delta) * stride[axis])
                for steps in (-2, -1, 0, 1, 2):  # float32 neighbours of that pixel
                    p = pixel
                    for _ in range(abs(steps)):
                        p = np.nextafter(p, np.float32(np.inf if steps > 0 else -np.inf))
                    values.append((axis, p))
    rest = rng.uniform(-50, 300, (K * 8, 2)).astype(np.float32)
    far = np.float32([1e4, -1e4, 1e7, -1e7, 1e15, -1e15])
    points = []
    for axis, p in values:
        other = np.float32(rng.uniform(0, 150))
        points.append((p, other) if axis == 0 else (other, p))
    points += [tuple(r) for r in rest]
    points += [(f, np.float32(50)) for f in far] + [(np.float32(50), f) for f in far]
    points = np.array(points, np.float32)
    n = -(-len(points) // K)
    padded = np.concatenate([points, rest[:n * K - len(points)]])
    return padded.reshape(n, K, 2)


def main():
    sys.path.insert(0, str(MMPOSE_REF))
    import mmcompat  # noqa: F401  (must precede mmpose)
    import mmpose
    from mmpose.codecs import UDPHeatmap

    rng = np.random.default_rng(9)
    cases = []
    for input_size, heatmap_size, sigma in SETTINGS:
        keypoints = edge_keypoints(input_size, heatmap_size, sigma, rng)
        visible = rng.choice(np.float32([0, 0.3, 0.5, 1, 1, 1, 2]), keypoints.shape[:2]).astype(np.float32)
        codec = UDPHeatmap(input_size=input_size, heatmap_size=heatmap_size, sigma=sigma)
        # MMPose's UDPHeatmap encodes one instance at a time.
        weights = np.concatenate([codec.encode(keypoints[n:n + 1], visible[n:n + 1])["keypoint_weights"]
                                  for n in range(len(keypoints))])
        cases.append({"input_size": list(input_size), "heatmap_size": list(heatmap_size), "sigma": sigma,
                      "keypoints": keypoints.tolist(), "keypoints_visible": visible.tolist(),
                      "keypoint_weights": np.asarray(weights, np.float32).tolist()})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "about": "MMPose UDPHeatmap(input_size, heatmap_size, sigma).encode(keypoints, keypoints_visible)"
                 "['keypoint_weights'] (float32 values); made by tools/reference/make_udp_weight_cases.py",
        "mmpose_version": mmpose.__version__, "cases": cases}) + "\n")
    print(f"wrote {OUT}: {sum(np.size(c['keypoint_weights']) for c in cases)} keypoints")


if __name__ == "__main__":
    main()
