"""Top-down inference through an exported ONNX file, without torch.

`OnnxPredictor(path).predict(image, boxes)` has the contract of `vitpose.Predictor.predict` and
runs the same steps with numpy, OpenCV and onnxruntime only: box -> centre and scale (padding
1.25) -> UDP warp (`vitpose.data.transforms.topdown_affine`) -> `(x - mean) / std` in float32 ->
the graph (`vitpose export` / `vitpose.inference.export.to_onnx`) -> flip test (baked into the graph, or
here with `vitpose.codecs.flip_heatmaps`) -> UDP decode -> image pixels (`crop_to_image`).

Packages this path needs at run time: numpy, opencv-python-headless and onnxruntime (or
onnxruntime-gpu), plus this package's pure-numpy modules. Importing this module imports no torch
(`tests/test_export.py` checks it in a fresh interpreter with torch made unimportable).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vitpose.coco_meta import FLIP_INDICES, PIXEL_MEAN, PIXEL_STD
from vitpose.codecs.flip import flip_heatmaps
from vitpose.codecs.udp import UDPHeatmap
from vitpose.inference.pipeline import TopDown
from vitpose.inference.results import StageTimer

__all__ = ["OnnxPredictor"]

EXTRA_HINT = 'pip install onnxruntime (or pip install "vitpose[export]")'


def _import_onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise ImportError(f"OnnxPredictor needs onnxruntime, not installed: {EXTRA_HINT}") from None
    return onnxruntime


class OnnxPredictor(TopDown):
    """ViTPose on person boxes of one image, through an ONNX file written by `vitpose export`.

    Args:
        path: the .onnx file (its metadata says the crop size, codec, normalisation and whether
            the flip test is inside the graph).
        flip_test: average with the mirrored crop (on by default, as `Predictor`). With a graph
            that has the flip test baked in it must stay True; otherwise it is done here.
        codec: the heatmap codec (default: UDPHeatmap with the sizes in the file's metadata).
        batch_size: boxes per run of a dynamic-batch graph (a fixed-batch graph takes its own
            batch; the last chunk is padded).
        providers: onnxruntime execution providers (default: CPU).
        threads: onnxruntime intra-op threads (None: onnxruntime's default).
        flip_indices: left/right keypoint order (default: the file's metadata, else COCO-17).

    Every step but the network is `vitpose.inference.pipeline.TopDown`'s, as for `Predictor`:
    `predict(image, boxes=None, box_format="xyxy", channels="rgb")` -> keypoints (M, K, 2)
    float64 image pixels, scores (M, K) float32; `predictor(images, boxes=None)` -> `Poses`
    (with `detector=`, a callable such as `FullFrame()`, when boxes are not given).
    """

    def __init__(self, path, flip_test: bool = True, codec=None, batch_size: int = 32,
                 providers: Sequence[str] | None = None, threads: int | None = None,
                 flip_indices: Sequence[int] | None = None, detector=None):
        ort = _import_onnxruntime()
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"ONNX file not found: {path}")
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = int(threads)
        self.session = ort.InferenceSession(str(path), options,
                                            providers=list(providers or ["CPUExecutionProvider"]))
        self.path = path
        self.metadata = dict(self.session.get_modelmeta().custom_metadata_map)
        self._read_shapes()
        self.codec = codec if codec is not None else self._codec_from_metadata()
        if tuple(self.codec.input_size) != self.input_size:
            raise ValueError(f"{path}: the graph takes {self.input_size} (w, h) crops, the codec "
                             f"{tuple(self.codec.input_size)}")
        self.graph_flips = self.metadata.get("vitpose.flip_test") == "1"
        if self.graph_flips and not flip_test:
            raise ValueError(f"{path} has the flip test baked into its graph; flip_test=False cannot undo "
                             f"it (export without --flip-test for that)")
        self.flip_test = bool(flip_test)
        self.flip_indices = self._flip_indices(flip_indices)
        self.mean = self._constant("vitpose.pixel_mean", PIXEL_MEAN)
        self.std = self._constant("vitpose.pixel_std", PIXEL_STD)
        self.batch_size = int(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.detector = detector
        self.timer = StageTimer()

    def _read_shapes(self) -> None:
        """Input name, crop size (w, h), fixed batch (None: dynamic) and keypoint count of the graph."""
        graph_input = self.session.get_inputs()[0]
        shape = graph_input.shape
        if len(shape) != 4 or shape[1] != 3 or not all(isinstance(s, int) for s in shape[2:]):
            raise ValueError(f"{self.path}: input {graph_input.name!r} has shape {shape}, expected (N, 3, h, w)")
        self.input_name = graph_input.name
        self.graph_batch = shape[0] if isinstance(shape[0], int) else None
        self.input_size = (int(shape[3]), int(shape[2]))
        output = self.session.get_outputs()[0].shape
        self.num_keypoints = int(output[1]) if len(output) == 4 and isinstance(output[1], int) \
            else int(self.metadata.get("vitpose.num_keypoints", len(FLIP_INDICES)))

    def _flip_indices(self, flip_indices) -> list[int] | None:
        """The given order, else the file's, else COCO's for 17 keypoints; required for a flip test here."""
        if flip_indices is None:
            flip_indices = json.loads(self.metadata.get("vitpose.flip_indices", "null"))
        if flip_indices is None and self.num_keypoints == len(FLIP_INDICES):
            flip_indices = FLIP_INDICES
        needed = self.flip_test and not self.graph_flips
        if needed and (flip_indices is None or len(flip_indices) != self.num_keypoints):
            raise ValueError(f"{self.path}: the flip test of {self.num_keypoints} keypoints needs flip_indices "
                             f"of that length (got {None if flip_indices is None else len(flip_indices)})")
        return None if flip_indices is None else [int(i) for i in flip_indices]

    def _constant(self, key: str, default) -> np.ndarray:
        """A per-channel float32 constant (1, 3, 1, 1) from the metadata, else the project's."""
        return np.asarray(json.loads(self.metadata.get(key, "null")) or default, np.float32).reshape(1, 3, 1, 1)

    def _codec_from_metadata(self) -> UDPHeatmap:
        name = self.metadata.get("vitpose.codec", "UDPHeatmap")
        if name != "UDPHeatmap":
            raise ValueError(f"{self.path} was exported with codec {name}; pass codec= (an instance of it)")
        output = self.session.get_outputs()[0].shape
        default_hm = (output[3], output[2]) if len(output) == 4 and all(isinstance(s, int) for s in output[2:]) \
            else (self.input_size[0] // 4, self.input_size[1] // 4)
        heatmap_size = json.loads(self.metadata.get("vitpose.heatmap_size", "null")) or default_hm
        return UDPHeatmap(self.input_size, heatmap_size, float(self.metadata.get("vitpose.codec_sigma", 2.0)),
                          int(self.metadata.get("vitpose.codec_blur_kernel_size", 11)))

    # ------------------------------------------------------------------ the network step

    def _run(self, x: np.ndarray) -> np.ndarray:
        """The graph on normalised crops (N, 3, h, w), in chunks of its batch (padded when fixed)."""
        step = self.graph_batch or len(x)  # `predict` already cut the boxes into batch_size chunks
        outputs = []
        for start in range(0, len(x), step):
            chunk = x[start:start + step]
            pad = (self.graph_batch or len(chunk)) - len(chunk)
            if pad:
                chunk = np.concatenate([chunk, np.zeros((pad, *chunk.shape[1:]), chunk.dtype)])
            outputs.append(self.session.run(None, {self.input_name: np.ascontiguousarray(chunk)})[0][:len(chunk) - pad])
        return np.concatenate(outputs)

    def heatmaps(self, crops: np.ndarray) -> np.ndarray:
        """Heatmaps (N, K, H, W) float32 of uint8 RGB crops (N, 3, h, w), with the flip test if on.

        `(x - mean) / std` in float32 and the flip-test average `(h + flipped) * 0.5` are the
        operations of `vitpose.topdown.forward_heatmaps` in the same order, so only the graph's
        arithmetic can differ from PyTorch.
        """
        x = (crops.astype(np.float32) - self.mean) / self.std
        if not self.flip_test or self.graph_flips:
            return self._run(x)
        n = len(x)
        both = self._run(np.concatenate([x, x[..., ::-1]]))  # crops and mirrors as one batch, as Predictor
        return (both[:n] + flip_heatmaps(both[n:], self.flip_indices)) * np.float32(0.5)

    run_network = heatmaps  # what `TopDown` calls between the crops and the decode
