"""Instance scores from a calibrated model's keypoints (`--rescore calibrated`), and the gate that
decides whether they are kept.

A person's score ranks it against the others in COCO's AP. MMPose's `bbox_keypoint` form is the box
score x the mean of the keypoint scores above a floor (`vitpose.codecs.instance_scores`); a model
with a calibration (`vitpose calibrate`) gives each keypoint `p`, the probability that it is right,
so the rescored instance is the box score x the mean p above the same floor
(`calibrated_instance_scores`: the one formula, only its input changes).

A rescoring is a change to what a model outputs, so it is gated like a precision: `rescore_gate`
scores the same predictions both ways with the evaluator's protocol (the same NMS, COCOeval) and
takes the paired bootstrap interval of AP(rescored) - AP(raw) over the images
(`vitpose.evaluation.pycocotools_eval.paired_bootstrap`, the int8 gate's). The rescoring is kept
only where the interval's lower end is above -`RESCORE_MAX_AP_DROP`: the data rule out a drop
larger than the bound (so a set too small to resolve the bound keeps nothing). `vitpose evaluate
--rescore calibrated` prints the report; a model file whose calibration records `rescore_kept:
true` (`RESCORE_KEPT`: what the gate said on the held-out set `vitpose calibrate` fitted on) is
the only one `vitpose predict --rescore calibrated` rescores (`rescore_kept`). docs/calibration.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vitpose.codecs import instance_scores
from vitpose.errors import UsageError

__all__ = ["RESCORE_BOOTSTRAP", "RESCORE_FLOOR", "RESCORE_KEPT", "RESCORE_MAX_AP_DROP", "RESCORE_MODES", "RescoreError",
           "RescoreReport", "calibrated_instance_scores", "rescore_gate", "rescore_kept", "rescored_records"]

RESCORE_MODES = ("none", "calibrated")
RESCORE_FLOOR = 0.2  # the keypoints whose p is above this count (MMPose's keypoint_score_thr)
RESCORE_MAX_AP_DROP = 0.005  # the most AP the rescoring may be shown to cost (int8's bound)
RESCORE_BOOTSTRAP = 200  # paired resamples of the images (as the int8 gate)
# the key of a recorded calibration (`ModelSpec.calibration`) that `vitpose calibrate` writes and
# `vitpose predict --rescore calibrated` reads: the gate's verdict on the held-out set
RESCORE_KEPT = "rescore_kept"


class RescoreError(UsageError):
    """`--rescore calibrated` where there is nothing calibrated to rescore with (one line)."""


def calibrated_instance_scores(p, bbox_scores, floor: float = RESCORE_FLOOR) -> np.ndarray:
    """(...,) float64: box score x mean of the calibrated p above `floor` (0 when none is)."""
    return instance_scores(p, bbox_scores, floor)


def rescored_records(records: list[dict], floor: float = RESCORE_FLOOR, flag: str = "--rescore calibrated") -> list[dict]:
    """COCO results records with `score` from their `p` and `bbox_score` (`calibrated_instance_scores`);
    the raw instance score kept as `raw_score`. A record without `p` is refused: nothing is invented."""
    out = []
    for i, record in enumerate(records):
        if record.get("p") is None:
            raise RescoreError(f"{flag}: record {i} has no calibrated 'p': the model has no calibration "
                               "(run `vitpose calibrate`), or leave out the flag")
        p = [math.nan if v is None else float(v) for v in record["p"]]
        box = record.get("bbox_score")
        score = float(calibrated_instance_scores(np.asarray(p), 1.0 if box is None else float(box), floor))
        out.append({**record, "score": score if math.isfinite(score) else None, "raw_score": record.get("score")})
    return out


def rescore_kept(spec) -> bool:
    """Whether a model's recorded calibration says the gate kept its rescoring: the optional key
    `rescore_kept: true` (`RESCORE_KEPT`) of the spec's `calibration` (a ModelSpec attribute or a dict's key)."""
    calibration = spec.get("calibration") if isinstance(spec, dict) else getattr(spec, "calibration", None)
    return isinstance(calibration, dict) and calibration.get(RESCORE_KEPT) is True


@dataclass(frozen=True)
class RescoreReport:
    """What the gate measured: the AP of the raw and the rescored instance scores, the paired
    bootstrap interval of their difference and the verdict."""

    ap_raw: float
    ap_rescored: float
    interval: tuple[float, float]
    images: int
    bound: float = RESCORE_MAX_AP_DROP
    bootstrap: int = RESCORE_BOOTSTRAP

    @property
    def difference(self) -> float:
        return self.ap_rescored - self.ap_raw

    @property
    def kept(self) -> bool:
        return self.interval[0] >= -self.bound

    def lines(self) -> list[str]:
        low, high = self.interval
        verdict = ("kept: the data rule out a drop larger than the bound" if self.kept else
                   "not kept: AP may drop by more than the bound (or the set is too small to tell)")
        return [f"rescore calibrated on {self.images} images: AP {self.ap_rescored:.4f} vs raw {self.ap_raw:.4f}: "
                f"difference {self.difference:+.4f}, 95% interval [{low:+.4f}, {high:+.4f}] ({self.bootstrap} paired "
                f"resamples); gate: lower end >= -{self.bound}: {verdict}"]

    def as_dict(self) -> dict:
        return {"ap_raw": self.ap_raw, "ap_rescored": self.ap_rescored, "interval": list(self.interval),
                "images": self.images, "bound": self.bound, "bootstrap": self.bootstrap, RESCORE_KEPT: self.kept}


def rescore_gate(evaluator, predictions: list[dict], bootstrap: int = RESCORE_BOOTSTRAP, seed: int = 0,
                 floor: float | None = None) -> RescoreReport:
    """The AP of `predictions` (the evaluator's dicts, each with `keypoint_p` (K,)) scored with the
    raw keypoint scores and with the calibrated p, through the same `CocoEvaluator` protocol, and
    the paired bootstrap interval of the difference. `floor`: the p floor (default: the evaluator's
    keypoint score threshold, so the two differ only in their input)."""
    from vitpose.evaluation.coco_evaluator import CocoEvaluator
    from vitpose.evaluation.pycocotools_eval import paired_bootstrap

    if not isinstance(evaluator, CocoEvaluator):
        raise RescoreError(f"--rescore calibrated is gated on COCO AP; this skeleton's metric is "
                           f"{type(evaluator).__name__}")
    missing = next((i for i, p in enumerate(predictions) if p.get("keypoint_p") is None), None)
    if missing is not None:
        raise RescoreError(f"--rescore calibrated: prediction {missing} has no calibrated p (keypoint_p): the "
                           "model has no calibration; run `vitpose calibrate` first")
    reference = evaluator.cocoeval(predictions)
    threshold = evaluator.keypoint_score_thr
    try:
        evaluator.keypoint_score_thr = threshold if floor is None else float(floor)
        # the instance score is bbox_score x mean(keypoint scores > floor): with p as the scores it
        # is the calibrated score, and the NMS and COCOeval are the evaluator's own
        rescored = evaluator.cocoeval([{**p, "keypoint_scores": np.asarray(p["keypoint_p"], np.float64)}
                                       for p in predictions])
    finally:
        evaluator.keypoint_score_thr = threshold
    interval = paired_bootstrap(reference, rescored, bootstrap, seed)
    return RescoreReport(float(reference.stats[0]), float(rescored.stats[0]), interval,
                         len(reference._paramsEval.imgIds), bootstrap=bootstrap)
