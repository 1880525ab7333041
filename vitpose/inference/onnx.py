"""Top-down inference through an exported ONNX file, without torch.

`OnnxPredictor(path).predict(image, boxes)` has the contract of `vitpose.Predictor.predict` and
runs the same steps with numpy, OpenCV and onnxruntime only: box -> centre and scale (padding
1.25) -> UDP warp (`vitpose.data.transforms.topdown_affine`) -> `normalize_images` with the spec's
pixel mean/std -> the graph (`vitpose export` / `vitpose.inference.export.to_onnx`) -> flip test
(baked into the graph, or here with `vitpose.codecs.flip_average`, the function the graph and
`vitpose.flip_test` use) -> the spec's codec's decode -> image pixels (`vitpose.codecs.decode_to_image`).

What the file is comes from its `ModelSpec` (metadata `vitpose.model_spec`, checked as a weights
file's spec is: sizes, codec, pixel mean/std, and the skeleton with its flip order) and from
`vitpose.export` (whether the flip test is inside the graph). Files of earlier versions without a
spec are read from their loose keys (`vitpose.pixel_mean`, `vitpose.flip_indices`, ...), checked
the same way. A file without either is taken as a UDP model with ImageNet pixels, and its flip test
needs `flip_indices=` (or `flip_test=False`): nothing in it says which keypoints mirror which.

Packages this path needs at run time: numpy, opencv-python-headless and onnxruntime (or
onnxruntime-gpu), plus this package's pure-numpy modules. Importing this module imports no torch
(`tests/test_export.py` checks it in a fresh interpreter with torch made unimportable).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vitpose.codecs.flip import flip_average, flip_heatmaps
from vitpose.data.pixels import normalize_images
from vitpose.errors import UserError, require_extra
from vitpose.inference.pipeline import TopDown
from vitpose.inference.results import StageTimer
from vitpose.models.spec import METADATA_KEY, ModelSpec, SpecError, check_flip_indices

__all__ = ["ExportedModelError", "OnnxLoadError", "OnnxMetadataError", "OnnxPredictor", "OpenVinoPredictor",
           "ProviderError", "check_onnx_device", "check_providers", "exported_device", "is_exported", "is_openvino", "load_exported",
           "openvino_device", "openvino_xml"]

EXPORT_KEY = "vitpose.export"  # vitpose.inference.export.EXPORT_KEY (that module imports torch)


class OnnxMetadataError(SpecError):
    """An ONNX file's vitpose metadata that cannot be used (names the file and the key)."""


class OnnxLoadError(UserError, RuntimeError):
    """onnxruntime cannot load the file (not ONNX, damaged, or operators this onnxruntime lacks, e.g.
    an int8 file's opset 23 on onnxruntime < 1.23): one line naming the file and the fix."""


class ProviderError(UserError, RuntimeError):
    """An execution provider (a GPU) was asked for that this onnxruntime cannot give: one line naming
    the package that has it, instead of onnxruntime's silent run on the CPU."""


# The onnxruntime build that carries each accelerator's execution provider (the plain `onnxruntime`
# wheel has the CPU's only; a GPU build replaces it, the two do not mix in one environment).
PROVIDER_PACKAGES = {"CUDAExecutionProvider": "onnxruntime-gpu", "TensorrtExecutionProvider": "onnxruntime-gpu",
                     "ROCMExecutionProvider": "onnxruntime-rocm", "MIGraphXExecutionProvider": "onnxruntime-rocm",
                     "DmlExecutionProvider": "onnxruntime-directml", "OpenVINOExecutionProvider": "onnxruntime-openvino",
                     "CoreMLExecutionProvider": "onnxruntime (the macOS wheel)"}


def _accelerators(providers) -> list[str]:
    return [p if isinstance(p, str) else p[0] for p in providers if (p if isinstance(p, str) else p[0])
            != "CPUExecutionProvider"]


def check_providers(ort, providers, session=None) -> None:
    """Refuse accelerators this onnxruntime does not have (ProviderError naming the package to install).

    Without `session`: against the providers the installed build offers (`get_available_providers`).
    With it: against those the session really took, since onnxruntime builds a session on the CPU
    alone, with a warning only, when the accelerator's libraries (CUDA, cuDNN) fail to load.
    """
    import importlib.metadata

    wanted = _accelerators(providers)
    have = ort.get_available_providers() if session is None else session.get_providers()
    missing = [p for p in wanted if p not in have]
    if not missing:
        return
    name = missing[0]
    package = PROVIDER_PACKAGES.get(name, "an onnxruntime build with it")
    installed = next((f"{d} {importlib.metadata.version(d)}" for d in ("onnxruntime", "onnxruntime-gpu")
                      if _installed(d)), "onnxruntime")
    if session is None:
        raise ProviderError(f"{name} was asked for, but the installed {installed} has only {', '.join(have)}: "
                            f"pip uninstall onnxruntime && pip install {package} (or run on the CPU: --device cpu)")
    raise ProviderError(f"{name} was asked for and {installed} has it, but it could not start (its libraries, e.g. "
                        f"CUDA and cuDNN of the versions {package} needs, did not load; onnxruntime's warning above "
                        f"says which), so the session would run on the CPU alone; fix those or use --device cpu")


def _installed(distribution: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _import_onnxruntime():
    """onnxruntime, or the one "install the extra" error (`vitpose.errors.require_extra`)."""
    require_extra("OnnxPredictor", ["onnxruntime"], "export")
    import onnxruntime

    return onnxruntime


class OnnxPredictor(TopDown):
    """ViTPose on person boxes of one image, through an ONNX file written by `vitpose export`.

    Args:
        path: the .onnx file (its recorded ModelSpec says the crop size, codec, normalisation and
            skeleton; `vitpose.export` whether the flip test is inside the graph).
        flip_test: average with the mirrored crop (on by default, as `Predictor`). With a graph
            that has the flip test baked in it must stay True; otherwise it is done here.
        codec: the heatmap codec (default: the spec's).
        batch_size: boxes per run of a dynamic-batch graph (a fixed-batch graph takes its own
            batch; the last chunk is padded).
        providers: onnxruntime execution providers (default: CPU).
        threads: onnxruntime intra-op threads (None: onnxruntime's default).
        flip_indices: left/right keypoint order (default: the spec's skeleton's; a file that records
            none needs it for the flip test).

    `spec` (the file's `ModelSpec`, None for a file without vitpose metadata) says what the file
    predicts (`spec.skeleton`: keypoint names, flip order, ... as plain data).

    Every step but the network is `vitpose.inference.pipeline.TopDown`'s, as for `Predictor`:
    `predict(image, boxes=None, box_format="xyxy", channels="rgb")` -> keypoints (M, K, 2)
    float64 image pixels, scores (M, K) float32; `predictor(images, boxes=None)` -> `Poses`
    (with `detector=`, a callable such as `FullFrame()`, when boxes are not given).
    """

    def __init__(self, path, flip_test: bool = True, codec=None, batch_size: int = 32,
                 providers: Sequence[str] | None = None, threads: int | None = None,
                 flip_indices: Sequence[int] | None = None, detector=None):
        path = Path(path)
        self.path = path
        self._open(path, providers, threads)  # the runtime's session and the file's metadata
        self._read_shapes()
        self.spec = self._read_spec()
        if self.num_keypoints is None:  # a graph whose output does not say K
            self.num_keypoints = self._spec_or_default().num_keypoints
        self.codec = codec if codec is not None else self._spec_or_default().build_codec()
        if tuple(self.codec.input_size) != self.input_size:
            raise OnnxMetadataError(f"{path}: the graph takes {self.input_size} (w, h) crops, the codec "
                                    f"{tuple(self.codec.input_size)}")
        self.graph_flips = self._graph_flips()
        if self.graph_flips and not flip_test:
            raise ValueError(f"{path} has the flip test baked into its graph; flip_test=False cannot undo "
                             f"it (export without --flip-test for that)")
        self.flip_test = bool(flip_test)
        self.flip_indices = self._flip_indices(flip_indices)
        pixels = self._spec_or_default()
        self.mean, self.std = pixels.pixel_mean, pixels.pixel_std
        if self.graph_flips:
            self._check_graph_flips()
        self.calibration = self.spec.calibration if self.spec is not None else None  # `vitpose calibrate`'s fit
        self.batch_size = int(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.detector = detector
        self.timer = StageTimer()

    def _open(self, path: Path, providers, threads) -> None:
        ort = _import_onnxruntime()
        if not path.is_file():
            raise FileNotFoundError(f"ONNX file not found: {path}")
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = int(threads)
        providers = list(providers or ["CPUExecutionProvider"])
        check_providers(ort, providers)  # before the work: never a silent CPU run of a GPU request
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as e:  # onnxruntime's own exception classes (InvalidProtobuf, InvalidGraph, Fail, ...)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise OnnxLoadError(f"{path}: onnxruntime {ort.__version__} cannot load it ({first}); an int8 file of "
                                f"vitpose export --precision int8 needs onnxruntime >= 1.23 (pip install -U "
                                f"onnxruntime), any other file: export it again with vitpose export") from None
        check_providers(ort, providers, self.session)
        self.metadata = dict(self.session.get_modelmeta().custom_metadata_map)

    def _shapes(self):
        """(input name, input shape, output shape) of the graph; dynamic sizes are not ints."""
        graph_input = self.session.get_inputs()[0]
        return graph_input.name, graph_input.shape, self.session.get_outputs()[0].shape

    def _infer(self, x: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input_name: x})[0]

    def _read_shapes(self) -> None:
        """Input name, crop size (w, h), fixed batch (None: dynamic) and keypoint count of the graph."""
        name, shape, output = self._shapes()
        if len(shape) != 4 or shape[1] != 3 or not all(isinstance(s, int) for s in shape[2:]):
            raise ValueError(f"{self.path}: input {name!r} has shape {shape}, expected (N, 3, h, w)")
        self.input_name = name
        self.graph_batch = shape[0] if isinstance(shape[0], int) else None
        self.input_size = (int(shape[3]), int(shape[2]))
        self.num_keypoints = int(output[1]) if len(output) == 4 and isinstance(output[1], int) else None
        self.heatmap_size = (int(output[3]), int(output[2])) if len(output) == 4 and all(
            isinstance(v, int) for v in output[2:]) else None

    # ------------------------------------------------------------------ what the file records

    def _key(self, key: str, default=None):
        """A JSON metadata value; OnnxMetadataError naming the file and key when it is not JSON."""
        if key not in self.metadata:
            return default
        try:
            return json.loads(self.metadata[key])
        except ValueError as e:
            raise OnnxMetadataError(f"{self.path}: metadata {key} is not valid JSON ({e}); re-export the file "
                                    f"with vitpose export") from None

    def _read_spec(self) -> ModelSpec | None:
        """The recorded spec (checked); else one made of an older file's loose keys; else None."""
        if METADATA_KEY in self.metadata:
            spec = ModelSpec.from_json(self.metadata[METADATA_KEY], origin=f"{self.path} (metadata {METADATA_KEY})")
        elif any(key.startswith("vitpose.") for key in self.metadata):
            spec = self._legacy_spec()
        else:
            return None
        problems = []
        if self.num_keypoints is not None and spec.num_keypoints != self.num_keypoints:
            problems.append(f"{spec.num_keypoints} keypoints, the graph gives {self.num_keypoints}")
        if spec.input_size != self.input_size:
            problems.append(f"crops of {spec.input_size} (w, h), the graph takes {self.input_size}")
        if self.heatmap_size is not None and spec.heatmap_size != self.heatmap_size:
            problems.append(f"heatmaps of {spec.heatmap_size} (w, h), the graph gives {self.heatmap_size}")
        if problems:
            raise OnnxMetadataError(f"{self.path}: its recorded spec ({spec.origin}) says {'; '.join(problems)}: "
                                    f"the metadata does not describe this graph; re-export it with vitpose export")
        return spec

    def _legacy_spec(self) -> ModelSpec:
        """The spec of a file written before specs were recorded (nine loose `vitpose.*` keys)."""
        origin = f"{self.path} (loose vitpose.* metadata)"
        fields = {}
        for field, key in (("pixel_mean", "vitpose.pixel_mean"), ("pixel_std", "vitpose.pixel_std"),
                           ("input_size", "vitpose.input_size"), ("heatmap_size", "vitpose.heatmap_size"),
                           ("sigma", "vitpose.codec_sigma"), ("num_keypoints", "vitpose.num_keypoints")):
            value = self._key(key)
            if value is not None:
                fields[field] = value
        fields.setdefault("input_size", list(self.input_size))
        fields.setdefault("heatmap_size", list(self.heatmap_size or (self.input_size[0] // 4, self.input_size[1] // 4)))
        fields.setdefault("num_keypoints", self.num_keypoints or 17)
        codec = self.metadata.get("vitpose.codec", "UDPHeatmap")
        fields["codec"] = codec
        flip = self._key("vitpose.flip_indices")
        if flip is not None:
            if not (isinstance(flip, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in flip)):
                raise OnnxMetadataError(f"{origin}: vitpose.flip_indices must be a list of keypoint indices, "
                                        f"got {flip!r}")
            count = len(flip)
            fields["skeleton"] = {"name": "unnamed", "keypoint_names": [f"keypoint_{k}" for k in range(count)],
                                  "flip_indices": flip}
        return ModelSpec.from_dict(fields, origin=origin)

    def _spec_or_default(self) -> ModelSpec:
        """The file's spec, else UDP and ImageNet pixels with the graph's sizes (a file without metadata)."""
        if self.spec is not None:
            return self.spec
        heatmap = self.heatmap_size or (self.input_size[0] // 4, self.input_size[1] // 4)
        return ModelSpec(input_size=self.input_size, heatmap_size=heatmap, num_keypoints=self.num_keypoints or 17,
                         origin=f"{self.path} (no vitpose metadata: UDP and ImageNet pixels assumed)")

    def _graph_flips(self) -> bool:
        """Whether the graph has the flip test inside (`vitpose.export`, or an older file's `vitpose.flip_test`)."""
        facts = self._key(EXPORT_KEY)
        if facts is not None:
            value = facts.get("flip_test") if isinstance(facts, dict) else None
            if not isinstance(value, bool):
                raise OnnxMetadataError(f"{self.path}: metadata {EXPORT_KEY} must be an object with a true/false "
                                        f"flip_test, got {self.metadata[EXPORT_KEY]!r}")
            return value
        legacy = self.metadata.get("vitpose.flip_test", "0")
        if legacy not in ("0", "1"):
            raise OnnxMetadataError(f"{self.path}: metadata vitpose.flip_test must be 0 or 1, got {legacy!r}")
        return legacy == "1"

    def _check_graph_flips(self) -> None:
        """A graph that says it averages with the mirrored crop must be mirror-symmetric: its output on
        a mirrored input is its output flipped back (exact up to rounding for UDP, whose flip needs no
        shift). One probe run at load time; a graph without the flip test (even a well-trained one,
        only roughly symmetric) fails it by far more than rounding."""
        if getattr(self.codec, "flip_shift", False) or self.flip_indices is None:
            return  # a shifted flip is not symmetric; without the order nothing can be checked
        facts = self._key(EXPORT_KEY) or {}
        if isinstance(facts, dict) and facts.get("precision") in ("float16", "int8"):
            return  # float16 / int8 rounding is of the size of what this would test
        w, h = self.input_size
        x = np.random.default_rng(0).standard_normal((1, 3, h, w)).astype(np.float32)
        out = self._run(x)
        mirrored = self._run(np.ascontiguousarray(x[..., ::-1]))
        diff = float(np.abs(flip_heatmaps(out, self.flip_indices) - mirrored).max())
        peak = float(np.abs(out).max())
        if not diff <= 1e-3 * peak + 1e-5:
            raise OnnxMetadataError(f"{self.path}: its metadata says the flip test is inside the graph, but the graph "
                                    f"is not mirror-symmetric (max |diff| {diff:.3g} on heatmaps of peak {peak:.3g}): "
                                    f"the metadata is wrong; re-export the file with vitpose export")

    def _flip_indices(self, flip_indices) -> list[int] | None:
        """The given order, else the recorded skeleton's; required for a flip test done here."""
        if flip_indices is None and self.spec is not None and self.spec.skeleton is not None:
            flip_indices = self.spec.skeleton["flip_indices"]  # checked with the spec
        needed = self.flip_test and not self.graph_flips
        k = self.num_keypoints
        if needed and flip_indices is None:
            raise OnnxMetadataError(f"{self.path} records no skeleton, so nothing says which of its {k} keypoints "
                                    f"mirror which: pass flip_indices= (the skeleton's, e.g. "
                                    f"vitpose.data.dataset_info('coco').flip_indices) or flip_test=False")
        if flip_indices is None:
            return None
        return check_flip_indices(list(flip_indices), k, f"{self.path}: flip_indices") if needed else \
            [int(i) for i in flip_indices]

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
            outputs.append(self._infer(np.ascontiguousarray(chunk))[:len(chunk) - pad])
        return np.concatenate(outputs)

    def heatmaps(self, crops: np.ndarray) -> np.ndarray:
        """Heatmaps (N, K, H, W) float32 of uint8 RGB crops (N, 3, h, w), with the flip test if on.

        `normalize_images` with the spec's mean/std and the flip-test average `flip_average` (with
        the codec's shift) are the functions `vitpose.topdown.forward_heatmaps` runs, so only the
        graph's arithmetic can differ from PyTorch.
        """
        if not self.flip_test or self.graph_flips:
            return self._run(normalize_images(crops, self.mean, self.std))
        plain, mirrored = self._plain_and_mirrored(crops)
        return flip_average(plain, mirrored, self.flip_indices, getattr(self.codec, "flip_shift", False))

    run_network = heatmaps  # what `TopDown` calls between the crops and the decode

    def gives_views(self) -> bool:
        """The flip test done here (not inside the graph) gives both views."""
        return self.flip_test and not self.graph_flips and self.flip_indices is not None

    def _plain_and_mirrored(self, crops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The graph's heatmaps of the normalised crops and of their mirrors, as one batch (as Predictor)."""
        x = normalize_images(crops, self.mean, self.std)
        both = self._run(np.concatenate([x, x[..., ::-1]]))
        return both[:len(x)], both[len(x):]

    def run_network_views(self, crops: np.ndarray):
        """uint8 RGB crops -> (flip-averaged, plain, mirrored-and-flipped-back) heatmaps (N, K, H, W),
        the flip test's two views kept apart (`TopDown.flip_views`, what `vitpose select` and
        `vitpose audit` read): the plain graph on the crops and their mirrors, the mirrors' maps
        turned back by `flip_heatmaps` with the codec's shift, the average `flip_average` (the
        arithmetic of `vitpose.topdown.forward_flip_views`, so only the graph's can differ). The
        flip test runs here whether `flip_test` is on or not. A graph with the flip test inside
        gives the average only: ExportedModelError."""
        if self.graph_flips:
            raise ExportedModelError(f"{self.path}: the flip test is inside its graph (vitpose export --flip-test), "
                                     f"which gives the average of the plain and mirrored views, not each; export it "
                                     f"again without --flip-test")
        if self.flip_indices is None:
            raise OnnxMetadataError(f"{self.path} records no skeleton, so nothing says which of its "
                                    f"{self.num_keypoints} keypoints mirror which: pass flip_indices=")
        # checked at load time only where the flip test was to run
        flip_indices = check_flip_indices(list(self.flip_indices), self.num_keypoints, f"{self.path}: flip_indices")
        shift = getattr(self.codec, "flip_shift", False)
        plain, mirrored = self._plain_and_mirrored(crops)
        return flip_average(plain, mirrored, flip_indices, shift), plain, flip_heatmaps(mirrored, flip_indices, shift)


# ----------------------------------------------------------------------------------------------
# OpenVINO IR (`vitpose export --format openvino`): the same steps, OpenVINO's runtime

# Where `vitpose export` keeps the ModelSpec and the export facts in an IR's rt_info (XML element
# names cannot hold the dots of the ONNX metadata keys).
OPENVINO_RT_INFO = {METADATA_KEY: ["vitpose", "model_spec"], EXPORT_KEY: ["vitpose", "export"]}
# What a device asked of OpenVINO needs besides the openvino wheel.
OPENVINO_DEVICE_NEEDS = {"GPU": "Intel's GPU compute runtime (intel-opencl-icd / Level Zero, and libOpenCL.so.1)",
                         "NPU": "Intel's NPU driver (intel-driver-compiler-npu)"}


def openvino_xml(path) -> Path:
    """The .xml of an IR named as the .xml itself or as the folder that holds exactly one."""
    path = Path(path)
    if path.is_dir():
        found = sorted(path.glob("*.xml"))
        if len(found) != 1:
            raise FileNotFoundError(f"{path}: an OpenVINO IR folder holds one .xml (and its .bin); found "
                                    f"{len(found)}: {[p.name for p in found]}")
        return found[0]
    if not path.is_file():
        raise FileNotFoundError(f"OpenVINO IR not found: {path}")
    return path


def _import_openvino():
    """openvino, or the one "install the extra" error (`vitpose.errors.require_extra`)."""
    require_extra("OpenVinoPredictor", ["openvino"], "openvino")
    import openvino

    return openvino


def check_openvino_device(core, device: str) -> None:
    """A device OpenVINO does not see here (its plugin's libraries missing, or no such hardware):
    ProviderError naming what to install, instead of an error deep in the plugin loader."""
    wanted = device.split(".")[0].split(":")[0].upper()
    if wanted in ("AUTO", "HETERO", "MULTI"):
        return
    available = list(core.available_devices)  # e.g. ["CPU"], ["CPU", "GPU.0", "GPU.1"]
    if any(d.split(".")[0].upper() == wanted for d in available):
        return
    needs = OPENVINO_DEVICE_NEEDS.get(wanted, "its OpenVINO plugin and driver")
    raise ProviderError(f"OpenVINO device {device} was asked for, but this machine offers only {', '.join(available)}: "
                        f"install {needs}, or run on the CPU: --device cpu")


class OpenVinoPredictor(OnnxPredictor):
    """`OnnxPredictor` through an OpenVINO IR written by `vitpose export --format openvino` (the
    .xml, or the folder holding it): the same steps, spec, flip test and decode; OpenVINO runs the
    network. `device`: OpenVINO's ("CPU", "GPU", ...; a device it does not see is a ProviderError).
    The CPU plugin runs in fp32 (`INFERENCE_PRECISION_HINT`): on CPUs with bf16 it would otherwise
    choose bf16 by itself, and the file was gated in fp32."""

    def __init__(self, path, flip_test: bool = True, codec=None, batch_size: int = 32, device: str = "CPU",
                 threads: int | None = None, flip_indices: Sequence[int] | None = None, detector=None):
        self.device_name = str(device).upper()
        super().__init__(openvino_xml(path), flip_test=flip_test, codec=codec, batch_size=batch_size,
                         threads=threads, flip_indices=flip_indices, detector=detector)

    def _open(self, path: Path, providers, threads) -> None:
        ov = _import_openvino()
        core = ov.Core()
        check_openvino_device(core, self.device_name)
        model = core.read_model(str(path))
        self.metadata = {key: str(model.get_rt_info(where).astype(str)) for key, where in OPENVINO_RT_INFO.items()
                         if model.has_rt_info(where)}
        config = {"INFERENCE_PRECISION_HINT": "f32"} if self.device_name.startswith("CPU") else {}
        if threads is not None:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        self.ov_model = model
        self.session = core.compile_model(model, self.device_name, config)

    def _shapes(self):
        def dims(port):
            return [d.get_length() if d.is_static else None for d in port.get_partial_shape()]

        return self.ov_model.inputs[0].get_any_name(), dims(self.ov_model.inputs[0]), dims(self.ov_model.outputs[0])

    def _infer(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.session(x)[0])


# ----------------------------------------------------------------------------------------------
# The one door for exported files: `vitpose predict --model` and `vitpose serve --model`


class ExportedModelError(UserError):
    """A flag that does not fit an exported file (one line, exit status 2)."""


def is_openvino(model) -> bool:
    """`model` names an OpenVINO IR: its .xml, or a folder holding one."""
    path = Path(model)
    return path.suffix.lower() == ".xml" or (path.is_dir() and any(path.glob("*.xml")))


def is_exported(model) -> bool:
    """`model` names an exported file: an .onnx file or an OpenVINO IR (these load through `load_exported`)."""
    return Path(str(model)).suffix.lower() == ".onnx" or is_openvino(model)


def check_onnx_device(requested) -> None:
    """`--device cuda[:N]` with an ONNX file: onnxruntime must have CUDA (ProviderError names the package)."""
    if requested is not None and str(requested).startswith("cuda"):
        check_providers(_import_onnxruntime(), ["CUDAExecutionProvider", "CPUExecutionProvider"])


def openvino_device(requested) -> str:
    """`--device` for an OpenVINO IR: cpu/auto -> CPU, gpu -> Intel's GPU (checked: ProviderError naming
    what to install when OpenVINO does not see one)."""
    text = "auto" if requested is None else str(requested).lower()
    if text in ("auto", "cpu"):
        return "CPU"
    if text.startswith("gpu"):
        check_openvino_device(_import_openvino().Core(), text.upper())
        return text.upper()
    raise ExportedModelError(f"--device {requested}: an OpenVINO IR runs on cpu or gpu (Intel's GPU through "
                             f"OpenVINO); for CUDA export an ONNX file")


def exported_device(model, requested):
    """The torch device of the steps around an exported file's network (crops, the detector), after
    the runtime's own device checks: CUDA asked of onnxruntime needs its GPU package; an OpenVINO
    IR's GPU is Intel's, checked by OpenVINO, and the rest runs on the CPU. ValueError: a bad --device."""
    from vitpose.device import resolve_device

    if is_openvino(model):
        openvino_device(requested)
        return resolve_device("cpu")
    check_onnx_device(requested)
    return resolve_device(requested)


def _onnx_on_cuda(requested, device) -> bool:
    """CUDA asked for (checked by `check_onnx_device`), or `auto` on a CUDA machine whose onnxruntime has it."""
    if device.type != "cuda":
        return False
    if requested is not None and str(requested).startswith("cuda"):
        return True
    return "CUDAExecutionProvider" in _import_onnxruntime().get_available_providers()


def load_exported(model, device, *, requested_device=None, config=None, precision="auto", flip_test: bool = True,
                  batch_size: int | None = None, detector=None, detector_threshold: float | None = None,
                  det_classes=None) -> OnnxPredictor:
    """`--model FILE.onnx | IR`: an `OnnxPredictor` (onnxruntime) or `OpenVinoPredictor` with the
    command line's detector, and the skeleton the file's ModelSpec records (COCO's for a 17-keypoint
    file that records none, else None) for the drawings and the detector's classes. The flip test
    and the crops are the file's. `device`: from `exported_device`."""
    from vitpose.builders import skeleton_of
    from vitpose.data.metainfo import dataset_info
    from vitpose.device import default_batch_size
    from vitpose.inference.detect import DEFAULT_SCORE_THRESHOLD, detector_labels, make_detector

    openvino = is_openvino(model)
    if config is not None:
        raise ExportedModelError(f"--config: {model} is an exported file, which carries its model; leave out --config")
    if precision not in ("auto", "fp32"):
        raise ExportedModelError(f"--precision {precision}: an exported file runs in the precision it was exported in "
                                 f"(vitpose export --fp16 / --precision int8 write other ones)")
    if not openvino and not Path(model).is_file():
        raise ExportedModelError(f"--model {model}: no such ONNX file")
    batch = batch_size or default_batch_size(device)
    if openvino:
        predictor = OpenVinoPredictor(model, flip_test=flip_test, device=openvino_device(requested_device),
                                      batch_size=batch)
    else:
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if _onnx_on_cuda(requested_device, device) else \
            ["CPUExecutionProvider"]
        predictor = OnnxPredictor(model, flip_test=flip_test, providers=providers, batch_size=batch)
    spec = getattr(predictor, "spec", None)
    recorded = predictor.metadata.get(METADATA_KEY)
    if spec is None and recorded:
        spec = ModelSpec.from_json(recorded, origin=f"recorded in {model}")
    if spec is not None and spec.skeleton is not None:
        predictor.skeleton = skeleton_of(spec)
    else:
        predictor.skeleton = dataset_info("coco") if predictor.num_keypoints == 17 else None
    threshold = DEFAULT_SCORE_THRESHOLD if detector_threshold is None else detector_threshold
    predictor.detector = make_detector(detector, device, threshold, detector_labels(predictor.skeleton, det_classes))
    return predictor
