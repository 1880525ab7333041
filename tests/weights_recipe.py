"""The fixtures' random-weight recipe (tests/fixtures/README.md §1), numpy only.

`make_weights(spec, seed)` draws every tensor of an MMPose 1.x key spec from one PCG64 rng in
spec order (float64 draws cast to float32); `derive(weights, spec)` builds the official 0.x and
HF layouts from those arrays. `spec_digest` is the sha256 the README gives for a draw.
"""

import hashlib
import json
from pathlib import Path

import numpy as np


def _draw(rng, kind, shape):
    if kind == "weight":
        return rng.standard_normal(shape) * 0.05
    if kind == "bias":
        return rng.standard_normal(shape) * 0.1
    if kind == "norm_weight":
        return rng.uniform(0.5, 1.5, shape)
    if kind == "pos_embed":
        return rng.standard_normal(shape) * 0.5
    if kind == "bn_mean":
        return rng.standard_normal(shape) * 0.3
    if kind == "bn_var":
        return rng.uniform(0.5, 2.0, shape)
    raise ValueError(f"unknown weight kind {kind!r} in the key spec")


def make_weights(spec, seed):
    rng = np.random.default_rng(seed)
    weights = {}
    for entry in spec:
        shape = tuple(entry["shape"])
        if entry["kind"] == "count":  # BN num_batches_tracked: zeros, no draw
            weights[entry["name"]] = np.zeros(shape, np.int64)
        else:
            weights[entry["name"]] = _draw(rng, entry["kind"], shape).astype(np.float32)
    return weights


def derive(weights, spec):
    out = {}
    for entry in spec:
        array = weights[entry["src"]]
        if entry["op"] == "prepend_zero_token":
            array = np.concatenate([np.zeros_like(array[:, :1]), array], axis=1)
        elif entry["op"] == "rows":
            start, stop = entry["rows"]
            array = array[start:stop]
        elif entry["op"] != "copy":
            raise ValueError(f"unknown op {entry['op']!r} for {entry['name']}")
        out[entry["name"]] = np.array(array, order="C")  # a C-contiguous copy (keeps 0-d shapes)
        assert list(out[entry["name"]].shape) == list(entry["shape"]), entry["name"]
    return out


def spec_digest(weights, spec):
    h = hashlib.sha256()
    for entry in spec:
        h.update(np.array(weights[entry["name"]], order="C").tobytes())
    return h.hexdigest()


def load_spec(fixtures_dir, decoder, layout):
    return json.loads((Path(fixtures_dir) / f"weights_spec_{decoder}_{layout}.json").read_text())


def layout_weights(fixtures_dir, decoder, layout, seed=7):
    """{name: array} of one decoder ('classic'|'simple') in one layout ('mmpose1x'|'official0x'|'hf')."""
    weights = make_weights(load_spec(fixtures_dir, decoder, "mmpose1x"), seed)
    if layout == "mmpose1x":
        return weights
    return derive(weights, load_spec(fixtures_dir, decoder, layout))


DIGESTS_SEED7 = {
    "classic": "9ed20b39e48bb870e63d7c6c7e7efdc744543ac90e64eefe9b7009bdd6f4ceef",
    "simple": "621ef5ad1a69ce3e58a1bedcdd97f7b0029a0bd08fbcb4d616bf051759e3fede",
}
