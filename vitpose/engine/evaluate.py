"""The prediction loop shared by train.py (validation) and evaluate.py.

`predict` turns batches of uint8 crops into the prediction dicts that `CocoEvaluator` takes:
normalise on the device with the model's pixel mean/std -> model (the crop and its mirror as ONE
batch when flip testing) -> the codec's decode (vectorised, on the host) -> image pixels, with the
same helpers as
`vitpose.Predictor` (vitpose/inference/predictor.py). Every step is MMPose's top-down `predict()`
(tests/test_evaluate.py checks it against model_vitpose_s_io.npz).

On CUDA the host decode of batch n overlaps the device forward of batch n + 1: the heatmaps are
copied back asynchronously and only waited for one batch later.

A calibrated model (`calibration=`, its `ModelSpec.calibration`) also gives each prediction
`keypoint_p` and `keypoint_visibility` through the seam every runtime passes
(`vitpose.inference.pipeline.calibrated_views`: the flip test's two views apart, or the plain
view without the flip test); its keypoints and scores are the same as without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

from vitpose.codecs.confidence import variant_of
from vitpose.codecs.decode import decode_to_image
from vitpose.data.geometry import bbox_xywh2xyxy
from vitpose.evaluation.coco_evaluator import STAT_NAMES
from vitpose.inference.pipeline import calibrated_views, decode_views
from vitpose.topdown import forward_flip_views, forward_heatmaps


def _numpy(value, dtype=None) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    return np.asarray(value) if dtype is None else np.asarray(value, dtype=dtype)


def _batch_meta(batch: dict) -> dict:
    """The per-instance fields a prediction carries, as host numpy arrays."""
    if "image" not in batch or "center" not in batch or "scale" not in batch:
        missing = [k for k in ("image", "center", "scale") if k not in batch]
        raise KeyError(f"batch lacks {missing} (expected the keys of a CocoKeypoints sample)")
    scale = _numpy(batch["scale"], np.float32)
    meta = {
        "id": _numpy(batch["id"]).astype(np.int64),
        "image_id": _numpy(batch["image_id"]).astype(np.int64),
        "center": _numpy(batch["center"], np.float32),
        "scale": scale,
        "bbox_score": _numpy(batch.get("bbox_score", np.ones(len(scale))), np.float64),
        # MMPose's area for OKS-NMS: the product of the aspect-fixed crop size (float32).
        "area": _numpy(batch["area"], np.float64) if "area" in batch else np.prod(scale, axis=1).astype(np.float64),
    }
    if "bbox" in batch:
        meta["bbox"] = _numpy(batch["bbox"], np.float64)
    if "category_id" in batch:  # AP-10K: one category per animal family, scored per category
        meta["category_id"] = _numpy(batch["category_id"]).astype(np.int64)
    if "image_size" in batch:
        meta["image_size"] = _numpy(batch["image_size"], np.float64)
    return meta


def _scene(meta: dict):
    """(image sizes (N, 2), person boxes (N, 4) xyxy) of a batch: `calibrated_views`' scene."""
    missing = [k for k in ("image_size", "bbox") if k not in meta]
    if missing:
        raise KeyError(f"batch lacks {missing}, which a calibrated model's p needs (the keys of a CocoKeypoints "
                       f"validation sample)")
    return meta["image_size"], bbox_xywh2xyxy(np.asarray(meta["bbox"], np.float64))


def _decode(heatmaps, ready, meta: dict, codec, calibration=None, variant: str = "plain") -> list[dict]:
    """heatmaps: one tensor (N, K, H, W), or a calibrated model's views (`forward_flip_views`' three
    or the plain one) -> the prediction dicts."""
    if ready is not None:
        ready.synchronize()
    p = visibility = None
    if calibration is None:
        keypoints, scores = decode_to_image(codec, heatmaps.numpy(), meta["center"], meta["scale"])
    else:
        decoded = decode_views(codec, [h.numpy() for h in heatmaps], meta["center"], meta["scale"], sharpness=True)
        keypoints, scores, p, visibility = calibrated_views(calibration, decoded, meta["scale"], _scene(meta), variant)
    predictions = []
    for i in range(len(keypoints)):
        pred = {"id": int(meta["id"][i]), "image_id": int(meta["image_id"][i]),
                "keypoints": keypoints[i], "keypoint_scores": scores[i],
                "bbox_score": float(meta["bbox_score"][i]), "area": float(meta["area"][i])}
        if "bbox" in meta:
            pred["bbox"] = meta["bbox"][i]
        if "category_id" in meta:
            pred["category_id"] = int(meta["category_id"][i])
        if p is not None:
            pred["keypoint_p"], pred["keypoint_visibility"] = p[i], visibility[i]
        predictions.append(pred)
    return predictions


@torch.no_grad()
def predict(model, batches: Iterable[dict], codec, flip_test: bool = True, device=None, amp_dtype=None,
            flip_indices: Sequence[int] | None = None, calibration=None) -> list[dict]:
    """Prediction dicts (docs/evaluation.md §3) for every instance of `batches`.

    batches: dicts of batched CocoKeypoints samples ("image" uint8 (B, 3, h, w) RGB, "id",
        "image_id", "center", "scale", "bbox_score", and "area"/"bbox" when present).
    codec: the model's codec (`spec.build_codec()`: anything with `batch_decode`, `input_size` and
        `flip_shift`, which also says whether the flip test shifts the flipped-back maps).
    device: where the model runs (default: the device of its parameters).
    amp_dtype: torch.bfloat16 / torch.float16 for autocast, None for full precision.
    calibration: the model's recorded calibration (`ModelSpec.calibration`): each prediction also
        gets `keypoint_p` (K,) and `keypoint_visibility` (K,), as `vitpose.Predictor` gives them.
    Returns the local process's predictions; gathering across processes is the caller's job.
    The model runs in eval mode and is put back into its previous mode afterwards.
    """
    if device is None:
        device = next(model.parameters()).device
    device = torch.device(device)
    was_training = model.training
    model.eval()
    variant = variant_of(flip_test, flip_test)  # the two views apart with the flip test, else the plain view
    predictions: list[dict] = []
    pending = None  # the previous batch, decoded while the device works on the next one
    try:
        for batch in batches:
            meta = _batch_meta(batch)
            images = batch["image"].to(device, non_blocking=True)
            shift = getattr(codec, "flip_shift", None)
            if calibration is None:
                heatmaps = forward_heatmaps(model, images, flip_test, amp_dtype, flip_indices, shift)
            elif flip_test:  # the flip test's two views apart: the eager Predictor's features
                heatmaps = forward_flip_views(model, images, amp_dtype, flip_indices, shift)
            else:
                heatmaps = (forward_heatmaps(model, images, False, amp_dtype, flip_indices, shift),)
            ready = None
            if device.type == "cuda":
                heatmaps = _to_host(heatmaps, non_blocking=True)
                ready = torch.cuda.Event()
                ready.record()
            else:
                heatmaps = _to_host(heatmaps)
            if pending is not None:
                predictions.extend(_decode(*pending, codec, calibration, variant))
            pending = (heatmaps, ready, meta)
        if pending is not None:
            predictions.extend(_decode(*pending, codec, calibration, variant))
    finally:
        model.train(was_training)
    return predictions


def _to_host(heatmaps, non_blocking: bool = False):
    if isinstance(heatmaps, torch.Tensor):
        return heatmaps.to("cpu", non_blocking=non_blocking)
    return tuple(h.to("cpu", non_blocking=non_blocking) for h in heatmaps)


def evaluate_model(model, batches: Iterable[dict], evaluator, codec, flip_test: bool = True, device=None,
                   amp_dtype=None, flip_indices: Sequence[int] | None = None) -> dict[str, float]:
    """`predict` then `evaluator.evaluate`: the ten COCO keypoint stats (single process)."""
    predictions = predict(model, batches, codec, flip_test=flip_test, device=device, amp_dtype=amp_dtype,
                          flip_indices=flip_indices)
    return evaluator.evaluate(predictions)


def format_stats(stats: dict[str, float]) -> str:
    """The ten stats as a two-row text table (names over values, values x 100 would hide rounding);
    stats of another metric (MPII's PCKh) all, in their order."""
    names = [n for n in STAT_NAMES if n in stats] or list(stats)
    width = max(8, *(len(n) for n in names))
    head = " | ".join(n.rjust(width) for n in names)
    row = " | ".join(f"{stats[n]:.4f}".rjust(width) for n in names)
    return f"{head}\n{'-' * len(head)}\n{row}"
