"""After the network, once for every runtime: heatmaps -> image keypoints (`decode_to_image`) and
keypoint scores -> an instance score (`instance_scores`).

Validation (`vitpose.engine.evaluate`), `Predictor` and `OnnxPredictor` (`vitpose.inference.pipeline.TopDown`)
and the COCO evaluator call these; numpy only (the ONNX path imports no torch).
"""

import numpy as np

__all__ = ["crop_to_image", "decode_to_image", "instance_scores"]


def crop_to_image(keypoints, center, scale, input_size=(192, 256)):
    """Map decoded keypoints from crop (input) pixels to image pixels, as MMPose's top-down
    estimator does for every codec: kpt / input_size * scale + center - 0.5 * scale.

    keypoints (..., K, 2), center and scale (..., 2) of the crop box. Works on numpy arrays and
    torch tensors. Together with the UDP decode (x_hm / (W - 1) * w) this is the official UDP
    mapping x_hm * S_w / (W - 1) + c_x - S_w / 2.
    """
    if hasattr(keypoints, "new_tensor"):  # torch
        size = keypoints.new_tensor(tuple(input_size))
        center = keypoints.new_tensor(center) if not hasattr(center, "new_tensor") else center.to(keypoints)
        scale = keypoints.new_tensor(scale) if not hasattr(scale, "new_tensor") else scale.to(keypoints)
    else:
        keypoints = np.asarray(keypoints)
        size = np.asarray(input_size)
        center = np.asarray(center)
        scale = np.asarray(scale)
    center = center[..., None, :]
    scale = scale[..., None, :]
    return keypoints / size * scale + center - 0.5 * scale


def decode_to_image(codec, heatmaps, center, scale) -> tuple[np.ndarray, np.ndarray]:
    """Decode heatmaps (B, K, H, W) with `codec` and map them to image pixels.

    center, scale (B, 2): the crop boxes (aspect-fixed scale). Returns keypoints (B, K, 2) float64
    and scores (B, K) float32. Torch tensors are accepted (moved to the host as float32).
    """
    if hasattr(heatmaps, "detach"):
        heatmaps = heatmaps.detach().float().cpu().numpy()
    keypoints, scores = codec.batch_decode(heatmaps)
    keypoints = crop_to_image(keypoints, np.asarray(center), np.asarray(scale), codec.input_size)
    return keypoints.astype(np.float64, copy=False), scores


def instance_scores(keypoint_scores, bbox_scores, keypoint_score_thr: float = 0.2) -> np.ndarray:
    """MMPose's instance score: bbox_score x mean of the keypoint scores above the threshold (0 when none are).

    keypoint_scores (..., K), bbox_scores (...) -> (...) float64. MMPose compares one numpy
    float32 score at a time with the Python float threshold, which NumPy 1.x does in float64:
    a score of exactly float32(0.2) (0.2000000030) is above 0.2. So the comparison here is in
    float64 whatever the scores' dtype (docs/mmpose-edge-cases.md §2). The COCO evaluator and
    `vitpose predict --json` both score with this function, so the two commands agree.
    """
    bbox_scores = np.asarray(bbox_scores, dtype=np.float64)
    scores = np.asarray(keypoint_scores, dtype=np.float64)
    confident = scores > keypoint_score_thr
    count = confident.sum(axis=-1)
    # MMPose adds the confident scores one by one, left to right, in float64; a cumulative sum
    # adds in that order (adding 0.0 for the others changes nothing), where np.sum would pair.
    total = np.cumsum(np.where(confident, scores, 0.0), axis=-1)[..., -1] if scores.shape[-1] else \
        np.zeros(scores.shape[:-1])
    mean = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
    return bbox_scores * mean
