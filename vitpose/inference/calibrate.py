"""`vitpose calibrate`: what a keypoint score means, fitted on held-out labelled images.

`calibrate(options)` runs the model (the flip test's two views, on the labels' boxes) over a
COCO keypoint set the model was not trained on, labels each predicted keypoint right when it lies
within the skeleton's tolerance (`tolerance_of`: keypoint similarity at least `OKS_LEVEL`, or the
PCK threshold for a skeleton scored by PCK; an absent keypoint is never right), fits per keypoint
type P(right) (logistic, never decreasing in the peak) and the three-state visibility
(multinomial) for every variant of `vitpose.codecs.confidence`, measures them out of fold
(`vitpose.inference.calibration_report`), and writes a copy of the model file whose recorded
`ModelSpec.calibration` holds the fit and the data it was fitted on (file, SHA-256, counts).
Every runtime then applies it (`vitpose.inference.pipeline.TopDown`). On an OKS skeleton it also
runs the rescoring gate (`vitpose.evaluation.rescoring.rescore_gate`) on the held-out predictions
with their out-of-fold p and records its figures (`rescore`) and verdict (`RESCORE_KEPT`), which
`vitpose predict --rescore calibrated` reads.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitpose.codecs.confidence import (
    CALIBRATION_VERSION,
    VARIANTS,
    calibrated,
    fit_monotone_logistic,
    fit_softmax,
    type_columns,
)
from vitpose.errors import UserError
from vitpose.evaluation.rescoring import RESCORE_KEPT
from vitpose.inference.calibration_report import expected_calibration_error, reliability_diagram, visibility_figures

__all__ = ["CalibrateOptions", "CalibrationDataError", "CalibrationRun", "calibrate", "calibration_summary", "default_out",
           "fit_calibration", "gate_rescoring", "right_within_tolerance", "tolerance_of"]

OKS_LEVEL = 0.5  # a keypoint is right when its similarity to the label is at least this (AP50's per keypoint)
FOLDS = 5  # the figures are measured out of fold: no image judges the fit it taught
MIN_PEOPLE = 20  # labelled people a held-out set needs before it can teach anything
IMAGES_PER_PASS = 16


class CalibrationDataError(UserError):
    """A held-out set that cannot be used (missing, too small, or the model's own training set)."""


@dataclass(frozen=True)
class CalibrateOptions:
    """What `vitpose calibrate` was asked: the model file, the held-out COCO set, where to write."""

    model: str
    data: str
    out: str | None = None
    plot: str | None = None
    device: str | None = None
    batch_size: int | None = None
    seed: int = 0
    config: str | None = None  # the training config of weights that do not record their model


@dataclass
class CalibrationRun:
    """The fitted calibration (plain data, as recorded) and what was written."""

    calibration: dict
    out: Path
    plot: Path
    lines: list


def default_out(model) -> Path:
    """M.calibrated<suffix> beside the model file (.pth unless it is .pt or .safetensors); for a
    published name or an HF repo id, <name>.calibrated.pth in the working folder."""
    path = Path(str(model))
    if not path.is_file():
        return Path(str(model).replace("/", "_").replace("@", "_") + ".calibrated.pth")
    suffix = path.suffix if path.suffix in (".pth", ".pt", ".safetensors") else ".pth"
    stem = path.stem if path.suffix == suffix else path.name
    return path.with_name(f"{stem}.calibrated{suffix}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Labels: right within the tolerance


def tolerance_of(skeleton) -> dict:
    """What "right" means for the skeleton: PCK at its threshold (of the box's longer side) for a
    skeleton scored by PCK, else keypoint similarity of at least OKS_LEVEL with its sigmas."""
    if getattr(skeleton, "metric", "coco-oks") == "pck":
        return {"metric": "pck", "threshold": float(skeleton.pck_threshold), "normalizer": "bbox"}
    return {"metric": "oks", "level": OKS_LEVEL, "sigmas": [float(s) for s in skeleton.sigmas]}


def right_within_tolerance(predicted, label, bbox, area, tolerance: dict) -> np.ndarray:
    """(M, K) bool: predicted keypoints (M, K, 2) within the tolerance of the labels (M, K, 3);
    an unlabelled keypoint (v = 0) is never right."""
    predicted, label = np.asarray(predicted, np.float64), np.asarray(label, np.float64)
    distance = np.hypot(*np.moveaxis(predicted - label[..., :2], -1, 0))
    if tolerance["metric"] == "pck":
        longer = np.maximum(np.asarray(bbox, np.float64)[:, 2:4].max(1), 1.0)[:, None]
        right = distance / longer <= tolerance["threshold"]
    else:
        variances = (2 * np.asarray(tolerance["sigmas"], np.float64)) ** 2
        area = np.maximum(np.asarray(area, np.float64), 1.0)[:, None]
        right = np.exp(-distance ** 2 / variances / area / 2) >= tolerance["level"]
    return right & (label[..., 2] > 0)


# ---------------------------------------------------------------------------------------------
# The held-out set


def _recorded_training_sets(config: dict | None) -> list[Path]:
    """The training annotation files a config records that exist here. A relative `data.root` is
    relative to where training ran, which the config does not record: it is looked for from the
    current folder and from each folder above the recorded `train.work_dir` (a work dir lies under
    the folder training ran in), so a check from another folder does not pass by not finding it."""
    config = config or {}
    data_cfg = config.get("data") if isinstance(config.get("data"), dict) else {}
    if not (data_cfg.get("root") and data_cfg.get("train_ann")):
        return []
    relative = Path(data_cfg["root"]) / data_cfg["train_ann"]
    bases = [Path.cwd()]
    work_dir = (config.get("train") or {}).get("work_dir") if isinstance(config.get("train"), dict) else None
    if work_dir and not relative.is_absolute():
        bases += list(Path(work_dir).absolute().parents)
    found = [base / relative for base in bases if (base / relative).is_file()]
    return list(dict.fromkeys(found))


def _held_out(data: str, config: dict | None) -> tuple[Path, Path, dict]:
    """(annotation file, image folder, the COCO file) of `--data`; refused when it is the training
    set the model file records."""
    from vitpose.inference.export_data import coco_set

    ann_file, images = coco_set(data, "--data")
    for trained in _recorded_training_sets(config):
        if trained.resolve() == ann_file.resolve() or _sha256(trained) == _sha256(ann_file):
            raise CalibrationDataError(f"--data {data}: {ann_file} is the training set the model file records "
                                       f"({trained}); calibrate on held-out images (e.g. its validation set)")
    try:
        coco = json.loads(ann_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CalibrationDataError(f"--data {ann_file}: not readable COCO JSON ({e})") from None
    return ann_file, images, coco


def _people_by_image(coco: dict, num_keypoints: int, keep: set | None = None) -> dict:
    """{image record: [annotations with keypoints]} of the labelled, non-crowd people (of `keep`,
    the annotation ids training's reader keeps, where given)."""
    people = {}
    for ann in coco.get("annotations", []):
        keypoints = ann.get("keypoints") or []
        if ann.get("iscrowd") or ann.get("num_keypoints", 1) == 0 or len(keypoints) != 3 * num_keypoints:
            continue
        if keep is not None and ann.get("id") not in keep:
            continue
        people.setdefault(ann["image_id"], []).append(ann)
    return {image["id"]: (image, people[image["id"]]) for image in coco.get("images", []) if image["id"] in people}


def _check_labels(ann_file: Path, coco: dict, k: int) -> set:
    """The labels read as training reads them (`build_coco_index`: a null or NaN keypoint, a NaN box,
    K that is not the model's: one line naming the record), and enough people, before any forward
    pass. Returns the annotation ids that reader keeps (an empty box, say, is dropped there too)."""
    from vitpose.data.coco_index import build_coco_index

    keep = set(build_coco_index(ann_file, num_keypoints=k).ids.tolist())
    people = sum(len(anns) for _, anns in _people_by_image(coco, k, keep).values())
    if people < MIN_PEOPLE:
        raise CalibrationDataError(f"--data: {people} labelled people of {k} keypoints; calibrating needs at least "
                                   f"{MIN_PEOPLE} held-out people")
    return keep


def collect(predictor, coco: dict, images: Path, tolerance: dict, keep: set | None = None) -> dict:
    """Every labelled keypoint of the set through the predictor: {variant: (features (n, F),
    right (n,))} and the labels (n,) of visibility, keypoint types (n,) and images (n,)."""
    from vitpose.data.image_io import load_image

    k = predictor.num_keypoints
    table = _people_by_image(coco, k, keep)
    features = {v: [] for v in VARIANTS}
    right = {v: [] for v in VARIANTS}
    states, image_of, raw, predictions = [], [], [], []
    ids = sorted(table)
    for start in range(0, len(ids), IMAGES_PER_PASS):
        chunk = ids[start:start + IMAGES_PER_PASS]
        pictures = [load_image(images / table[i][0]["file_name"])[0] for i in chunk]
        boxes = [np.array([a["bbox"] for a in table[i][1]], np.float32) for i in chunk]
        evidence = predictor.calibration_evidence(pictures, boxes, box_format="xywh", channels="bgr")
        for image_id, found in zip(chunk, evidence):
            anns = table[image_id][1]
            label = np.array([a["keypoints"] for a in anns], np.float64).reshape(len(anns), k, 3)
            bbox = np.array([a["bbox"] for a in anns], np.float64)
            area = np.array([a.get("area", a["bbox"][2] * a["bbox"][3]) for a in anns], np.float64)
            for variant, (keypoints, scores, feats) in found.items():
                features[variant].append(feats.reshape(-1, feats.shape[-1]))
                right[variant].append(right_within_tolerance(keypoints, label, bbox, area, tolerance).ravel())
            raw.append(found["flip_views"][1].ravel())
            predictions += [{"id": a["id"], "image_id": image_id, "keypoints": kp, "keypoint_scores": sc,
                             "bbox_score": 1.0, "area": float(a["bbox"][2] * a["bbox"][3]), "bbox": a["bbox"]}
                            for a, kp, sc in zip(anns, *found["flip_views"][:2])]
            states.append(np.clip(label[..., 2], 0, 2).astype(int).ravel())
            image_of.append(np.full(len(anns) * k, image_id))
    joined = {v: (np.concatenate(features[v]), np.concatenate(right[v]).astype(np.float64)) for v in VARIANTS}
    count = len(np.concatenate(states))
    return {"variants": joined, "states": np.concatenate(states), "image_of": np.concatenate(image_of),
            "types": np.tile(np.arange(k), count // k), "raw": np.concatenate(raw), "num_keypoints": k,
            "images": len(ids), "people": count // k, "predictions": predictions}


# ---------------------------------------------------------------------------------------------
# The fit


def fit_variant(features: np.ndarray, right: np.ndarray, states: np.ndarray, types: np.ndarray, k: int) -> dict:
    """One variant's fit: per keypoint type P(right) (monotone in the peak, feature 0) and the
    pooled three-state visibility with per-type intercepts."""
    correct = []
    for t in range(k):
        mine = types == t
        correct.append(fit_monotone_logistic(features[mine], right[mine]).tolist())
    x = type_columns(features.reshape(-1, k, features.shape[-1])).reshape(len(features), -1)
    visibility = fit_softmax(x, states, 3)
    return {"correct": correct, "visibility": visibility.tolist()}


def fit_calibration(collected: dict) -> dict:
    """Every variant's fit on all the collected keypoints (the recorded one)."""
    k = collected["num_keypoints"]
    return {variant: fit_variant(feats, right, collected["states"], collected["types"], k)
            for variant, (feats, right) in collected["variants"].items()}


def out_of_fold(collected: dict, variant: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(p (n,), visibility (n,)) of each keypoint from a fit of the other folds' images."""
    k = collected["num_keypoints"]
    feats, right = collected["variants"][variant]
    images = np.unique(collected["image_of"])
    fold_of_image = dict(zip(images, np.random.default_rng(seed).permutation(len(images)) % FOLDS))
    fold = np.array([fold_of_image[i] for i in collected["image_of"]])
    p, visibility = np.zeros(len(right), np.float32), np.zeros(len(right), np.int8)
    for f in range(FOLDS):
        train, test = fold != f, fold == f
        fit = fit_variant(feats[train], right[train], collected["states"][train], collected["types"][train], k)
        got = calibrated({"variants": {variant: fit}}, variant, feats[test].reshape(-1, k, feats.shape[-1]))
        p[test], visibility[test] = got[0].ravel(), got[1].ravel()
    return p, visibility


def measure(collected: dict, seed: int = 0) -> tuple[dict, list[str], tuple]:
    """Out-of-fold figures of every variant: ECE of the raw score and of p, the visibility accuracy
    against the majority class (interval over images). Returns (figures, lines, the default
    variant's (raw, p, right) for the diagram)."""
    figures, lines = {}, []
    states = collected["states"]
    majority = int(np.bincount(states, minlength=3).argmax())
    diagram = None
    for variant in VARIANTS:
        feats, right = collected["variants"][variant]
        raw = 1.0 / (1.0 + np.exp(-feats[:, 0]))  # the peak itself (feature 0 is its logit)
        p, visibility = out_of_fold(collected, variant, seed)
        vis = visibility_figures(visibility, states, collected["image_of"], majority, seed=seed)
        figures[variant] = {"ece_score": expected_calibration_error(raw, right),
                            "ece_p": expected_calibration_error(p, right), "right": float(right.mean()),
                            "visibility_accuracy": vis.accuracy, "majority_accuracy": vis.baseline,
                            "majority_state": vis.majority, "margin_interval": list(vis.interval)}
        f = figures[variant]
        lines.append(f"{variant:>12}: ECE raw score {f['ece_score']:.4f} -> p {f['ece_p']:.4f}; visibility "
                     f"accuracy {vis.accuracy:.3f} vs majority ({vis.majority}) {vis.baseline:.3f}: "
                     f"{vis.margin:+.3f} [{vis.interval[0]:+.3f}, {vis.interval[1]:+.3f}]")
        if variant == "flip_views":
            diagram = (raw, p, right)
    return figures, lines, diagram


# ---------------------------------------------------------------------------------------------
# The run


def calibrate(options: CalibrateOptions, log=print) -> CalibrationRun:
    """Fit, measure and write (see the module docstring). Refused in one line before any work:
    an output that is an input, an exported file, a set that is the model's training set."""
    from vitpose.builders import load_model
    from vitpose.files import check_output
    from vitpose.inference.onnx import is_exported
    from vitpose.inference.predictor import Predictor

    if is_exported(options.model):
        raise CalibrationDataError(f"--model {options.model}: calibrate the weights file, then export it "
                                   f"(the export carries the calibration)")
    out = Path(options.out) if options.out else default_out(options.model)
    if is_exported(out):  # the loaders would read the torch file written there as ONNX / OpenVINO
        raise CalibrationDataError(f"--out {out}: calibrate writes a weights file (.pth or .safetensors); "
                                   f"export that file afterwards (the export carries the calibration)")
    plot = Path(options.plot) if options.plot else out.with_name(out.name.split(".")[0] + ".reliability.png")
    check_output(out, "--out", inputs=(options.model, options.data))
    check_output(plot, "--plot", inputs=(options.model, options.data, out))
    loaded = load_model(options.model, config=options.config, device=options.device)
    ann_file, images, coco = _held_out(options.data, loaded.config)
    if options.config is not None:  # the config's training set is the model's too
        from vitpose.config import load_config

        _held_out(options.data, load_config(options.config).to_dict())
    predictor = Predictor(loaded.model, device=options.device, codec=loaded.codec, skeleton=loaded.skeleton,
                          batch_size=options.batch_size, precision="fp32")
    keep = _check_labels(ann_file, coco, predictor.num_keypoints)
    tolerance = tolerance_of(loaded.skeleton)
    collected = collect(predictor, coco, images, tolerance, keep)
    figures, lines, (raw, p, right) = measure(collected, options.seed)
    calibration = {"version": CALIBRATION_VERSION, "tolerance": tolerance, "variants": fit_calibration(collected),
                   "fitted_on": {"file": str(ann_file), "sha256": _sha256(ann_file), "images": collected["images"],
                                 "people": collected["people"], "keypoints": int(len(right))},
                   "figures": figures}
    gate = gate_rescoring(ann_file, collected["predictions"], p.reshape(-1, collected["num_keypoints"]), tolerance,
                          options.seed)
    calibration[RESCORE_KEPT] = gate is not None and gate.kept
    if gate is not None:
        figures["ap"] = gate.ap_raw  # the model's, with or without p
        calibration["rescore"] = gate.as_dict()
    ap = None if gate is None else gate.ap_raw
    spec = loaded.spec.replace(calibration=calibration)
    write_calibrated(loaded, spec, out)
    what = (f"within PCK@{tolerance['threshold']}" if tolerance["metric"] == "pck"
            else f"keypoint similarity >= {tolerance['level']}")
    reliability_diagram(plot, raw, p, right, f"{Path(options.model).name}: P({what})")
    header = [f"calibrated on {collected['images']} held-out images, {collected['people']} people of {ann_file} "
              f"(right: {what}; {right.mean():.3f} of the keypoints); out of {FOLDS} folds:"]
    same = "the same with and without p: p and visibility are added beside the keypoints and scores, which stay the model's"
    footer = [f"AP {ap:.4f} on the labels' boxes, {same}" if ap is not None else f"AP: {same}",
              *(gate.lines() if gate is not None else ["rescore calibrated: not gated (gated on COCO AP; this skeleton "
                                                       "is scored with PCK): not kept"]),
              f"wrote {out} and the reliability diagram {plot}"]
    for line in header + lines + footer:
        log(line)
    return CalibrationRun(calibration, out, plot, header + lines + footer)


def gate_rescoring(ann_file: Path, predictions: list, p: np.ndarray, tolerance: dict, seed: int = 0):
    """`rescore_gate`'s report on the held-out predictions on the labels' boxes, each with its
    out-of-fold p (N, K) (no image's p comes from a fit it taught); None for a PCK skeleton (the
    gate is of COCO AP). Its `ap_raw` is the model's AP with or without the calibration, which
    changes no keypoint and no score."""
    import warnings

    from vitpose.evaluation.coco_evaluator import CocoEvaluator
    from vitpose.evaluation.rescoring import rescore_gate

    if tolerance["metric"] != "oks" or not predictions:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        evaluator = CocoEvaluator(ann_file, sigmas=tolerance["sigmas"])
        return rescore_gate(evaluator, [{**pred, "keypoint_p": row} for pred, row in zip(predictions, p)], seed=seed)


def calibration_summary(calibration) -> dict:
    """What `vitpose serve`'s /v1/model says of a model's recorded calibration: whether its records
    carry `p` and `visibility`, what "right" means, the data it was fitted on and the gate's verdict
    (`RESCORE_KEPT`)."""
    if calibration is None:
        return {"calibrated": False}
    return {"calibrated": True, "tolerance": calibration.get("tolerance"), "fitted_on": calibration.get("fitted_on"),
            RESCORE_KEPT: calibration.get(RESCORE_KEPT) is True}


def write_calibrated(loaded, spec, out: Path) -> Path:
    """The model's weights with `spec` recorded (and the training config the source recorded): a
    .safetensors file through `save_weights`, else a torch checkpoint {state_dict, spec, config}."""
    import torch

    from vitpose.files import atomic_path, staged_files
    from vitpose.models.checkpoint import save_weights
    from vitpose.models.spec import METADATA_KEY

    if out.suffix == ".safetensors":
        with staged_files(out) as staged:  # save_file writes a new file: staged, then renamed into place
            save_weights(loaded.model, staged, spec)
        return out
    state = {name: t.detach().to("cpu") for name, t in loaded.model.state_dict().items()}
    payload = {"state_dict": state, METADATA_KEY: spec.to_dict()}
    if loaded.config is not None:
        payload["config"] = loaded.config
    with atomic_path(out) as staged:
        torch.save(payload, staged)
    return out
