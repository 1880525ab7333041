"""int8 ONNX files: calibration, ONNX Runtime's quantization and the AP gate on held-out images
(`vitpose export --precision int8`, `to_int8_onnx`, also `vitpose.inference.export.to_int8_onnx`).

    vitpose export --model best.pth --config cfg.yaml --out pose.int8.onnx --precision int8
    vitpose export --model vitpose-s --out s.int8.onnx --precision int8 --gate-data coco/ --calibration crops/

The steps (`to_int8_onnx`):
1. the fp32 graph, written and gated as `vitpose.inference.export_writers.to_onnx` writes it (equal to PyTorch);
   for "dynamic", laid out for the integer kernels (`vitpose.inference.int8_graph`: the head's
   transposed convolutions as matrix products, attention without Transposes) where onnxruntime
   runs opset 23;
2. ONNX Runtime's quantization of it (`quantize_onnx`): "static" (QDQ, int8 weights per output
   channel and uint8 activations whose ranges are calibrated (MinMax) on the crops of the images the
   user names, `--calibration DIR|COCO.json`: a COCO keypoint file gives its people's crops, a folder
   of images its whole images) or "dynamic" (the default: int8 weights of the matrix products, the
   activations' ranges taken at run time; no calibration; MatMuls only, since ONNX Runtime's
   integer Conv ran slower than its float one; then `int8_graph.quantized_gather`);
3. the AP gate (`int8_gate`): the held-out set (a COCO keypoint set, the calibration images taken
   out of it) predicted with its ground-truth boxes and the flip test by the PyTorch model at fp32
   and by the int8 file, the same crops and decode, scored by `CocoEvaluator`; the AP difference
   and its paired bootstrap 95% interval (`vitpose.evaluation.paired_bootstrap`, the interval
   benchmarks/precision_gate.py reports). The file is written only when |difference| <=
   `INT8_MAX_AP_DIFFERENCE` and the interval resolves the gate (half-width at most the bound: a set
   too small to tell a passing file from a failing one passes nothing). The gate's figures go into
   the file's `vitpose.export` metadata (key "gate"), next to the ModelSpec.

Which quantization by default: dynamic. Measured with `benchmarks/bench_predict.py --runtimes`
(ViTPose-S, ONNX Runtime 1.32, AMD EPYC with AVX512-VNNI/BF16, 1 thread, 8 boxes with the flip test,
5 alternating rounds, BENCHMARKS.md "int8"): dynamic 2.79x [2.27-3.02] MMPose's people/s per round,
static QDQ 2.36x [1.25-2.36]: ONNX Runtime runs static QDQ's many QuantizeLinear/DequantizeLinear
pairs around the ops it cannot fuse (softmax, layer norm, GELU), which costs more than dynamic's one
run-time quantization per matrix product. Both passed the gate on the demo model (dynamic +0.0008
[-0.0007, +0.0019], static +0.0014 [-0.0007, +0.0038]). On an AVX2-only AMD EPYC (no VNNI, 2
threads, quiet machine, BENCHMARKS.md "int8 on an AVX2-only CPU") the order is the same: dynamic
1.48x MMPose, static 1.23x; gate dynamic -0.0011 [-0.0021, +0.0007], static +0.0012 [-0.0010, +0.0030];
with the int8 layout dynamic ran 2.04x [1.63-2.17] MMPose there, gate -0.0001 [-0.0011, +0.0022]
(BENCHMARKS.md "int8 dynamic with its own graph layout").
Static stays for users who name their calibration images (`--calibration` implies it) or whose
runtime prefers QDQ graphs.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from vitpose.data.pixels import normalize_images
from vitpose.files import staged_files
from vitpose.inference.export_data import coco_set, existing_path, gate_crops
from vitpose.inference.export_errors import ExportUsageError, GateDataError, GateError
from vitpose.inference.export_graph import EXPORT_KEY

__all__ = ["GATE_BOOTSTRAP", "INT8_MAX_AP_DIFFERENCE", "QUANTIZATIONS", "CalibrationError", "Int8GateError",
           "Int8Report", "calibration_crops", "calibration_split", "coco_set", "held_out_set", "int8_gate",
           "quantize_onnx", "set_metadata", "to_int8_onnx"]

# The most COCO AP an int8 file may cost (or gain) against the fp32 model (int8 rounds far coarser
# than bf16, whose bound is 0.002), and the interval must resolve it.
INT8_MAX_AP_DIFFERENCE = 0.005
GATE_BOOTSTRAP = 200  # paired resamples of the held-out images
QUANTIZATIONS = ("static", "dynamic")
CALIBRATION_CROPS = 64  # crops the static ranges are calibrated on (MinMax: more adds little)
CALIBRATION_SHARE = 4  # without --calibration: 1 in this many gate images calibrates (at most 32 images)
CALIBRATION_IMAGES = 32
MIN_GATE_IMAGES = 10


# The calibration images or the held-out set cannot be used: the one error class of the COCO sets
# the export reads (`vitpose.inference.export_data.coco_set`), under the name this module gave it.
CalibrationError = GateDataError


class Int8GateError(GateError):
    """The int8 file failed the AP gate (or its held-out set could not resolve it); nothing was written.
    `.report` is the `Int8Report`; exit status 1, as for every gate."""


@dataclass
class Int8Report:
    """What the gate measured: the figures that go into the file's metadata."""

    quantization: str
    ap_fp32: float
    ap_int8: float
    interval: tuple[float, float]
    images: int
    instances: int
    held_out: str
    calibration: str
    calibration_crops: int
    bound: float = INT8_MAX_AP_DIFFERENCE
    bootstrap: int = GATE_BOOTSTRAP
    path: str = ""

    @property
    def difference(self) -> float:
        return self.ap_int8 - self.ap_fp32

    @property
    def resolves(self) -> bool:
        low, high = self.interval
        return (high - low) / 2 <= self.bound

    @property
    def passed(self) -> bool:
        return abs(self.difference) <= self.bound and self.resolves

    def lines(self) -> list[str]:
        low, high = self.interval
        verdict = "pass" if self.passed else ("FAIL: the held-out set cannot resolve the gate (give more images "
                                              "with --gate-data)" if abs(self.difference) <= self.bound
                                              else "FAIL: int8 moves AP by more than the bound")
        calibrated = (f"calibrated on {self.calibration_crops} crops of {self.calibration}" if self.calibration_crops
                      else "no calibration")
        return [f"int8 ({self.quantization}, {calibrated}) "
                f"against fp32 on {self.images} held-out images ({self.instances} people) of {self.held_out}:",
                f"  AP {self.ap_int8:.4f} vs fp32 {self.ap_fp32:.4f}: difference {self.difference:+.4f}, 95% interval "
                f"[{low:+.4f}, {high:+.4f}] ({self.bootstrap} paired resamples); gate |d| <= {self.bound} with an "
                f"interval of half-width <= {self.bound}: {verdict}"]

    def metadata(self) -> dict:
        facts = asdict(self)
        facts.pop("path")
        facts.update(difference=round(self.difference, 6), passed=self.passed, interval=list(self.interval))
        return facts


# ----------------------------------------------------------------------------------------------
# Calibration crops and the held-out set


def _image_files(folder: Path) -> list[Path]:
    from vitpose.inference.pipeline import IMAGE_SUFFIXES

    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _whole_image_crops(images: Sequence[Path], input_size, count: int) -> np.ndarray:
    """Each image as one crop (the whole frame as the box, padding 1.25, the UDP warp): a folder
    of person photos, as `--detector full-frame` would crop them."""
    from vitpose.data.geometry import bbox_xyxy2cs
    from vitpose.data.transforms import topdown_affine
    from vitpose.files import read_image

    crops = []
    for path in images[:count]:
        image = read_image(path)  # BGR uint8, the pixel limit checked
        if image is None:
            raise GateDataError(f"--calibration: {path} is not an image OpenCV can read")
        h, w = image.shape[:2]
        center, scale = bbox_xyxy2cs(np.array([0, 0, w, h], np.float32))
        crop = topdown_affine(image[..., ::-1], center, scale, 0.0, tuple(input_size))[0]
        crops.append(np.ascontiguousarray(crop.transpose(2, 0, 1)))
    return np.stack(crops)


def _coco_crops(ann_file: Path, img_dir: Path, input_size, count: int, image_ids=None) -> np.ndarray:
    from vitpose.data.coco import CocoKeypoints

    w, h = input_size
    dataset = CocoKeypoints(ann_file, img_dir, train=False, input_size=(w, h), heatmap_size=(w // 4, h // 4))
    keep = [i for i in range(len(dataset)) if image_ids is None or int(dataset.instance_info(i)["image_id"]) in image_ids]
    if not keep:
        raise GateDataError(f"--calibration {ann_file}: no person with keypoints in its images")
    step = max(1, len(keep) // count)  # spread over the set rather than the first images only
    return np.stack([np.asarray(dataset[i]["image"]) for i in keep[::step][:count]])


def _image_path(img_dir, image: dict) -> Path:
    return (Path(img_dir) / image["file_name"]).resolve()


def calibration_crops(source, input_size, count: int = CALIBRATION_CROPS) -> tuple[np.ndarray, set[Path], str]:
    """(uint8 RGB crops (N, 3, h, w), the image files used (resolved), a label) of `--calibration`:
    a COCO keypoint .json (its people's crops, GT boxes) or folder (MMPose layout / one COCO JSON
    beside its images), else a folder of images (each whole image one crop)."""
    source = existing_path(source, "--calibration")
    if source.is_file() or any(p.suffix.lower() == ".json" for p in source.iterdir()):
        ann_file, img_dir = coco_set(source, "--calibration")
        used = {_image_path(img_dir, im) for im in json.loads(ann_file.read_text())["images"]}
        return _coco_crops(ann_file, img_dir, input_size, count), used, str(source)
    images = _image_files(source)
    if not images:
        raise GateDataError(f"--calibration {source}: no images in this folder ({', '.join(('.jpg', '.png'))}, ...)")
    return _whole_image_crops(images, input_size, count), {p.resolve() for p in images[:count]}, str(source)


def held_out_set(ann_file: Path, img_dir: Path, exclude: set[Path], folder: Path) -> tuple[Path, int]:
    """A COCO file in `folder` of the images of `ann_file` (in `img_dir`) that are not among the
    files `exclude` (resolved paths) and their annotations: what the gate scores. Returns (its
    path, its image count)."""
    data = json.loads(Path(ann_file).read_text())
    images = [im for im in data["images"] if _image_path(img_dir, im) not in exclude]
    kept = {im["id"] for im in images}
    subset = {**data, "images": images, "annotations": [a for a in data["annotations"] if a["image_id"] in kept]}
    path = folder / "held_out.json"
    path.write_text(json.dumps(subset))
    return path, len(images)


# ----------------------------------------------------------------------------------------------
# The int8 graph, and the gate


class OnnxNetwork(nn.Module):
    """An ONNX file as the network step of `vitpose.topdown.forward_heatmaps` (normalised float32
    crops -> heatmaps), so that the gate runs the same normalisation, flip test and decode for the
    file as for the PyTorch model. `spec`: the model's (the pixels it normalises with)."""

    def __init__(self, path, spec, threads: int | None = None):
        super().__init__()
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = int(threads)
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name
        self.spec = spec

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.session.run(None, {self.input_name: np.ascontiguousarray(x.detach().cpu().numpy(), np.float32)})[0]
        return torch.from_numpy(out)


def _predictions(network, dataset, codec, flip_indices, batch_size: int = 16) -> list[dict]:
    """Prediction dicts (what `CocoEvaluator` takes) of `network` on the GT-box crops of `dataset`."""
    from vitpose.codecs.decode import decode_to_image
    from vitpose.topdown import forward_heatmaps

    predictions = []
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=0)
    with torch.no_grad():
        for batch in loader:
            heatmaps = forward_heatmaps(network, batch["image"], True, None, flip_indices, codec.flip_shift)
            center, scale = batch["center"].numpy().astype(np.float32), batch["scale"].numpy().astype(np.float32)
            keypoints, scores = decode_to_image(codec, heatmaps.numpy(), center, scale)
            area = batch["area"].numpy() if "area" in batch else np.prod(scale, axis=1)
            for i in range(len(keypoints)):
                predictions.append({"id": int(batch["id"][i]), "image_id": int(batch["image_id"][i]),
                                    "keypoints": keypoints[i], "keypoint_scores": scores[i],
                                    "bbox_score": float(batch["bbox_score"][i]) if "bbox_score" in batch else 1.0,
                                    "area": float(area[i])})
    return predictions


def int8_gate(model: nn.Module, int8_path, ann_file, img_dir, codec, flip_indices, *, quantization: str,
              calibration: str, calibration_count: int, held_out: str, sigmas=None,
              bootstrap: int = GATE_BOOTSTRAP) -> Int8Report:
    """The AP of the int8 file against the PyTorch model at fp32 on the COCO set `ann_file` (GT
    boxes, flip test), with the paired bootstrap interval of the difference."""
    from vitpose.data.coco import CocoKeypoints
    from vitpose.evaluation.coco_evaluator import CocoEvaluator, paired_bootstrap
    from vitpose.models.spec import spec_of_model
    from vitpose.models.wrappers import unwrap_model

    w, h = codec.input_size
    dataset = CocoKeypoints(ann_file, img_dir, train=False, input_size=(w, h), heatmap_size=tuple(codec.heatmap_size))
    if len(dataset) == 0:
        raise GateDataError(f"--gate-data {held_out}: no people with keypoints among the held-out images")
    evaluator = CocoEvaluator(ann_file, sigmas=sigmas)
    reference_model = unwrap_model(model).cpu().eval()
    network = OnnxNetwork(int8_path, spec_of_model(reference_model), threads=torch.get_num_threads())
    reference = evaluator.cocoeval(_predictions(reference_model, dataset, codec, flip_indices))
    quantized = evaluator.cocoeval(_predictions(network, dataset, codec, flip_indices))
    interval = paired_bootstrap(reference, quantized, bootstrap)
    return Int8Report(quantization, float(reference.stats[0]), float(quantized.stats[0]), interval,
                      len(reference._paramsEval.imgIds), len(dataset), held_out, calibration, calibration_count,
                      bootstrap=bootstrap)


class _CropReader:
    """onnxruntime's CalibrationDataReader protocol over normalised crops, one at a time."""

    def __init__(self, input_name: str, crops: np.ndarray):
        self._items = iter([{input_name: crops[i:i + 1]} for i in range(len(crops))])

    def get_next(self):
        return next(self._items, None)

    def rewind(self):  # not needed by MinMax; part of the protocol
        pass


def quantize_onnx(fp32_path, out_path, quantization: str = "static", calibration: np.ndarray | None = None) -> None:
    """ONNX Runtime's int8 quantization of the fp32 file (see the module's docstring). `calibration`:
    normalised float32 crops (N, 3, h, w), needed for "static"."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization {quantization!r}: choose one of {QUANTIZATIONS}")
    import onnx

    with tempfile.TemporaryDirectory(prefix="vitpose-int8-") as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        # An opset-23 graph (vitpose.inference.int8_graph's layout, or ONNX's own Attention) skips the
        # symbolic shape pass: it mistakes ONNX's Attention for onnxruntime's contrib Attention (an
        # assertion on the bias shape), as the quantizer does (a QAttention that does not load),
        # which the MatMul-only quantization below leaves alone
        layout = any(opset.domain in ("", "ai.onnx") and opset.version >= 23
                     for opset in onnx.load(str(fp32_path), load_external_data=False).opset_import)
        # shape inference and graph folding first: the quantizer needs the shapes of the activations
        with contextlib.redirect_stdout(None):
            quant_pre_process(str(fp32_path), str(prepared), skip_symbolic_shape=layout)
        if quantization == "dynamic":
            # MatMuls only: ONNX Runtime's integer Conv (ConvInteger) ran slower than its float Conv
            # here (84 against 36 ms for the patch embedding and the 1x1 conv of 16 crops, AVX2)
            quantize_dynamic(str(prepared), str(out_path), weight_type=QuantType.QInt8, per_channel=True,
                             op_types_to_quantize=["MatMul"])
            from vitpose.inference.int8_graph import quantized_gather

            quantized = onnx.load(str(out_path))
            if quantized_gather(quantized):
                onnx.checker.check_model(quantized)
                onnx.save(quantized, str(out_path))
            return
        if calibration is None or len(calibration) == 0:
            raise ValueError("static quantization needs calibration crops")
        input_name = onnx.load(str(prepared), load_external_data=False).graph.input[0].name
        with _quiet_root_logger():  # "Axis 1 is out-of-range for weight ...norm1.weight": 1-D norm scales stay per tensor
            quantize_static(str(prepared), str(out_path), _CropReader(input_name, calibration.astype(np.float32)),
                            quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                            weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax)


@contextlib.contextmanager
def _quiet_root_logger():
    import logging

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def set_metadata(path, metadata: dict) -> None:
    """Add (or replace) ONNX metadata entries of the file at `path`."""
    import onnx

    model = onnx.load(str(path))
    kept = {p.key: p.value for p in model.metadata_props}
    kept.update(metadata)
    del model.metadata_props[:]
    for key, value in kept.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))


def calibration_split(ann_file, img_dir, input_size) -> tuple[np.ndarray, set[Path], str]:
    """Without --calibration: 1 in CALIBRATION_SHARE images of the gate's set (spread over it, at
    most CALIBRATION_IMAGES) calibrate; (crops, their image files, a label). The gate leaves them out."""
    ordered = sorted(json.loads(Path(ann_file).read_text())["images"], key=lambda im: im["id"])
    take = max(1, min(CALIBRATION_IMAGES, len(ordered) // CALIBRATION_SHARE))
    chosen = ordered[::max(1, len(ordered) // take)][:take]
    crops = _coco_crops(Path(ann_file), Path(img_dir), input_size, CALIBRATION_CROPS,
                        image_ids={im["id"] for im in chosen})
    return crops, {_image_path(img_dir, im) for im in chosen}, f"{len(chosen)} images of the gate's set (left out of it)"


# ----------------------------------------------------------------------------------------------
# The int8 file


def to_int8_onnx(model: nn.Module, path, *, gate_data, calibration=None, quantization: str = "dynamic",
                 codec=None, flip_indices: Sequence[int] | None = None, flip_test: bool = False,
                 batch="dynamic", sigmas=None, bootstrap: int | None = None, bound: float | None = None,
                 calibration_crops_override=None, log: Callable[[str], None] | None = print) -> Int8Report:
    """Write `model` as an int8 ONNX file at `path`, only if it passes the AP gate (see the module's
    docstring): the fp32 graph (`to_onnx`, gated equal to PyTorch), ONNX Runtime's quantization
    calibrated on `calibration`, the AP of the int8 file against the PyTorch model at fp32 on the
    held-out images of `gate_data` with the paired bootstrap interval; the gate's figures in the
    file's `vitpose.export` metadata ("gate").

    gate_data: the held-out COCO keypoint set (a .json, a folder, or an (annotation file, image
        folder) pair such as a config's validation set: `vitpose.inference.export_data.coco_set`).
    calibration: `--calibration` (a folder of images or a COCO set); None: 1 in CALIBRATION_SHARE
        images of `gate_data` (at most CALIBRATION_IMAGES), which the gate then leaves out.
    bootstrap, bound: the gate's resamples and bound (None: GATE_BOOTSTRAP, INT8_MAX_AP_DIFFERENCE).
    calibration_crops_override: uint8 crops to calibrate on instead (tests: a deliberately bad set).
    Returns the Int8Report; raises Int8GateError (nothing written) when the gate fails, GateDataError
    (one line naming --gate-data or --calibration) for a set that is not there or cannot be used.
    """
    from vitpose.inference.export_graph import _model_spec, own_flip_indices

    spec = _model_spec(model, codec)
    codec = spec.build_codec() if codec is None else codec
    flip_indices = own_flip_indices(model) if flip_indices is None else flip_indices
    ann_file, img_dir = coco_set(gate_data, "--gate-data")
    crops, used, label = _calibration(quantization, calibration, calibration_crops_override, ann_file, img_dir,
                                      codec.input_size)
    calibration_x = (normalize_images(crops, spec.pixel_mean, spec.pixel_std).astype(np.float32) if len(crops)
                     else None)
    with tempfile.TemporaryDirectory(prefix="vitpose-int8-") as tmp:
        held_out, count = held_out_set(ann_file, img_dir, used, Path(tmp))
        if count < MIN_GATE_IMAGES:
            raise GateDataError(f"the held-out set {ann_file}: {count} images are left once the calibration images "
                                f"are taken out; the gate needs at least {MIN_GATE_IMAGES} (and more to resolve it): "
                                f"give a larger set with --gate-data")
        fp32 = Path(tmp) / "fp32.onnx"
        recorded = _gated_fp32_graph(model, fp32, quantization, codec, flip_indices, flip_test, batch)
        with staged_files(Path(path)) as staged:
            quantize_onnx(fp32, staged, quantization, calibration_x)
            report = int8_gate(model, staged, held_out, img_dir, codec, flip_indices, quantization=quantization,
                               calibration=label, calibration_count=len(crops), held_out=str(ann_file), sigmas=sigmas,
                               bootstrap=GATE_BOOTSTRAP if bootstrap is None else bootstrap)
            report.bound = INT8_MAX_AP_DIFFERENCE if bound is None else float(bound)
            report.path = str(path)
            for line in report.lines() if log is not None else ():
                log(line)
            if not report.passed:
                raise Int8GateError(report)
            facts = {**json.loads(recorded[EXPORT_KEY]), "precision": "int8", "quantization": quantization,
                     "gate": report.metadata()}
            set_metadata(staged, {**recorded, EXPORT_KEY: json.dumps(facts, sort_keys=True)})
    return report


def _calibration(quantization: str, calibration, override, ann_file: Path, img_dir: Path,
                 input_size) -> tuple[np.ndarray, set[Path], str]:
    """(uint8 crops to calibrate on, their image files (left out of the gate), a label)."""
    if quantization == "dynamic":  # ranges taken at run time: nothing to calibrate, every image gates
        if calibration is not None or override is not None:
            raise ExportUsageError("--calibration: dynamic quantization takes the activations' ranges at run time; "
                                   "leave out --calibration or use --quantization static")
        return np.zeros((0, 3, *tuple(input_size)[::-1]), np.uint8), set(), "nothing"
    if calibration is not None:
        crops, used, label = calibration_crops(calibration, input_size)
    else:
        crops, used, label = calibration_split(ann_file, img_dir, input_size)
    if override is not None:
        return np.asarray(override), used, "the given crops"
    return crops, used, label


def _gated_fp32_graph(model: nn.Module, path: Path, quantization: str, codec, flip_indices, flip_test: bool,
                      batch) -> dict:
    """The fp32 graph the quantizer reads, written at `path` and gated equal to PyTorch on the
    synthetic crops; returns its ONNX metadata (spec and export facts). Dynamic: the graph laid out
    for the integer kernels (`vitpose.inference.int8_graph`) where this install can run it; static
    QDQ keeps the plain graph (its quantizer reads ONNX's Attention as its own contrib operator)."""
    import onnx

    from vitpose.inference import int8_graph
    from vitpose.inference.export_writers import to_onnx

    crops, labels, source = gate_crops(None, codec.input_size)
    layout = quantization == "dynamic" and int8_graph.available()
    to_onnx(model, path, batch=batch, flip_test=flip_test, codec=codec, flip_indices=flip_indices, crops=crops,
            labels=labels, source=source, int8_layout=layout, log=None)
    return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
