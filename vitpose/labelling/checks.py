"""The checks of one labelled person against the model's prediction, and how they combine.

The model predicts each labelled person in the label's own box (the one top-down pipeline, flip
test on) and each label is compared with that prediction. A model is not an oracle: its errors
differ per keypoint (a wrist is found far less precisely than an eye) and it is sometimes unsure.
So the comparison is calibrated on the file itself (`Calibration`, medians over every labelled
keypoint: robust to the few wrong labels being looked for): a keypoint's error r (its distance
from the prediction over the box's size sqrt(w h)) is measured in units of the median error of
its keypoint type, and each keypoint carries a trust: its score over its type's median score (at
most 1), times exp(-(a / m)^2 / 8) where a is how far apart the flip test's plain and mirrored
views put it (the model doubting itself) and m the type's median error.

Checks, each a score in [0, 1] with its reason:

- **swap**: left and right exchanged. The label with its left/right names exchanged by the
  skeleton's flip pairs against the label as it is: trust-weighted mean similarity
  exp(-(r / 2m)^2 / 2) with the prediction, over the labelled pairs. A gain of the exchanged
  label over 0.1 is the tell-tale of a mirrored labelling, or of a model that mirrored the person:
  so the check is scaled by min(1, 2 q), q the file's own P that the label is the mirrored one
  (`facing_probabilities`): unchanged where the file cannot tell (q >= 0.5), down to 0 where the
  label's left/right order is the usual one for a person labelled like this.
- **facing**: left and right exchanged, by the label alone: q above `FACING_ALONE` (0.95; 1 at q = 1).
  q comes from a small classifier, fitted out of fold on the file's other people, of which side of
  the image a person's left is labelled on (`facing_side`) given which keypoints are labelled
  visible (`facing_features`: a face labelled visible means the person faces the camera, their
  left on the image's right); q compares the label as it is with the label exchanged.
- **far**: a keypoint far from a trusted prediction: trust x (1 - exp(-max(r / m - 1, 0)^2 / 8))
  (0 within the type's median error, ~0.4 at 3x, ~0.9 at 5x); the instance takes the mean of its
  three worst keypoints (one keypoint far off is as often the model's own slip as the label's).
  Where the swap check fired, against the prediction with left and right exchanged (the swap check
  has said that much; far then says whether the keypoints are right otherwise).
- **bones**: the label's own shape, whatever the model says: each skeleton link's length over the
  box's size sqrt(w h) against the same link over the file's people (log length, median and
  1.4826 x MAD: `bone_statistics`), z in spreads; the mean z of the `BONES_WORST` (2) worst links,
  0 up to z = `BONES_Z` (3), 1 from z + `BONES_Z_SPAN` (6). A keypoint put in the wrong place
  stretches or shrinks the links it ends; a model that misses a person does not change them.
- **visibility**: the flags are unlikely given what the model sees, learnt from the file itself
  (confident learning): a small logistic classifier of hidden (v=1) against visible (v=2) on
  each labelled keypoint's `visibility_features` (its score against its type and its person, how
  far the label and the flip views are from the prediction) and its type, fitted on the other people of the file (`VISIBILITY_FOLDS` folds: a person's own
  flags never judge them). A person's flags then have a surprise sum(-log P(flag)); its excess over
  what the classifier expects, in units of its spread (`flag_surprise`: z), is the check, 0 up to
  z = `VISIBILITY_Z`, 1 from z + `VISIBILITY_Z_SPAN`. A file with fewer than `VISIBILITY_MIN_LABELS`
  keypoints of either flag cannot teach it: then the fixed rule, v=1 where the score is at or above
  its type's 90th percentile of visible points, v=2 below the 5th.
- **box**: the box does not cover the labelled keypoints: the largest distance of a labelled
  keypoint outside the box, over the box's size (x4, at most 1).

An instance's suspicion is 1 - prod(1 - check): one strong check or several weak ones rank it
high. A high score is a reason to look, not proof: where the model is wrong, the label may be right.

What each check compares with is learnt from the file first (`vitpose.labelling.calibration`);
`audit_instance` runs the checks of one person (`swap_check`, `facing_check`, `far_check`,
`visibility_check`, `bones_check`, `box_check`, each a `Finding`) and gathers their scores and reasons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vitpose.labelling.calibration import Calibration, bone_lengths, flag_surprise, relative_errors

__all__ = ["Evidence", "Finding", "audit_instance", "bones_check", "box_check", "facing_check", "far_check",
           "suspicion", "swap_check", "visibility_check"]

SWAP_MARGIN = 0.1  # the similarity gain of the exchanged label that starts to count as a swap
FAR_WORST = 3  # the far check is the mean of this many worst keypoints (one is often the model's own slip)
FACING_ALONE = 0.95  # the facing check: the file's P that a label is mirrored above which it counts by itself
VISIBILITY_Z, VISIBILITY_Z_SPAN = 2.0, 4.0  # the visibility check: 0 up to z = 2, 1 from z = 6 (`flag_surprise`)
BONES_Z, BONES_Z_SPAN = 3.0, 6.0  # the bones check: 0 up to z = 3, 1 from z = 9
BONES_WORST = 2  # the bones check is the mean z of this many worst links (a misplaced point bends two)


def suspicion(checks: dict) -> float:
    """1 - prod(1 - check)."""
    return float(1.0 - np.prod([1.0 - min(max(v, 0.0), 1.0) for v in checks.values()]))


@dataclass(frozen=True)
class Finding:
    """One check's score in [0, 1], its reasons (sentences) and the keypoints it names
    ((name, check, figure) each)."""

    score: float
    reasons: tuple = ()
    flagged: tuple = ()


@dataclass(frozen=True)
class Evidence:
    """One label (K, 3) (x, y, v) with its box [x, y, w, h] against the prediction (K, 2): what every
    check reads. `errors`: each keypoint's distance from the prediction over the box's size;
    `trust`: its score over its type's median (at most 1) x exp(-(views apart / median error)^2 / 8),
    0 where not labelled."""

    label: np.ndarray
    bbox: tuple
    predicted: np.ndarray
    scores: np.ndarray
    errors: np.ndarray
    trust: np.ndarray
    calibration: Calibration
    names: tuple
    flip: np.ndarray

    @property
    def v(self) -> np.ndarray:
        return np.asarray(self.label[:, 2])

    @property
    def labelled(self) -> np.ndarray:
        return self.v > 0


def evidence(label: np.ndarray, bbox, predicted, scores, views_apart, skeleton, calibration: Calibration) -> Evidence:
    """The `Evidence` of one label against the model's prediction, its scores and views_apart (K,)."""
    scores, apart = np.asarray(scores, np.float64), np.asarray(views_apart, np.float64)
    labelled = np.asarray(label[:, 2]) > 0
    trust = np.minimum(1.0, scores / calibration.score) * np.exp(-(apart / calibration.error) ** 2 / 8) * labelled
    return Evidence(label, tuple(float(b) for b in bbox), np.asarray(predicted, np.float64), scores,
                    relative_errors(label, bbox, predicted), trust, calibration, tuple(skeleton.keypoint_names),
                    np.asarray(skeleton.flip_indices))


def mirrored_probability(facing) -> float:
    """The label-only P that the label is mirrored (`facing_probabilities`: (P as it is, P exchanged));
    0.5, no opinion, without one."""
    if facing is None:
        return 0.5
    as_is, exchanged = facing
    return exchanged / max(as_is + exchanged, 1e-9)


def swap_check(e: Evidence, plausible: float) -> tuple[Finding, bool]:
    """swap: the label with its left and right names exchanged against the label as it is, scaled by
    min(1, 2 `plausible`); and whether it fired (then the far check judges the keypoints against the
    prediction with left and right exchanged, not the left/right order this check judges)."""
    flip, typical, r = e.flip, e.calibration.error, e.errors
    pairs = e.labelled & e.labelled[flip] & (flip != np.arange(len(flip)))
    weight = np.minimum(e.trust, e.trust[flip]) * pairs
    if not weight.sum() > 0:
        return Finding(0.0), False
    exchanged = np.concatenate([e.label[flip, :2], e.label[:, 2:]], 1)
    r_exchanged = relative_errors(exchanged, e.bbox, e.predicted)
    as_is = float((np.exp(-(r / (2 * typical)) ** 2 / 2) * weight).sum() / weight.sum())
    swapped = float((np.exp(-(r_exchanged / (2 * typical)) ** 2 / 2) * weight).sum() / weight.sum())
    gain = swapped - as_is
    if not gain > SWAP_MARGIN:
        return Finding(0.0), False
    model_says = float(np.clip((gain - SWAP_MARGIN) / 0.3 + 0.5, 0, 1))
    reasons = [f"left/right swapped? the label fits the prediction {as_is:.2f}, {swapped:.2f} with "
               f"left and right exchanged"]
    if plausible < 0.5:
        reasons.append(f"but the label's left/right order is the usual one for a person labelled like this "
                       f"(P {1 - plausible:.2f} against {plausible:.2f} exchanged, learnt from the file): the "
                       f"model may have mirrored the person")
    return Finding(model_says * min(1.0, 2 * plausible), tuple(reasons)), True


def facing_check(plausible: float) -> Finding | None:
    """facing: the label alone says left and right are the other way round (P above `FACING_ALONE`);
    None below it."""
    if not plausible > FACING_ALONE:
        return None
    return Finding(float(np.clip((plausible - FACING_ALONE) / (1 - FACING_ALONE), 0, 1)),
                   (f"left/right swapped? for a person labelled like this the file puts left and right the "
                    f"other way round (P {plausible:.2f}; learnt from the file's other people)",))


def far_check(e: Evidence, exchanged: bool) -> Finding:
    """far: a keypoint far from a trusted prediction, in units of its type's median error; the mean of
    the `FAR_WORST` worst. `exchanged`: against the prediction with left and right exchanged."""
    names, typical, scores = e.names, e.calibration.error, e.scores
    r = relative_errors(e.label, e.bbox, e.predicted[e.flip]) if exchanged else e.errors
    mirrored = " with left and right exchanged" if exchanged else ""
    far = e.trust * (1.0 - np.exp(-np.maximum(r / typical - 1.0, 0.0) ** 2 / 8))
    reasons, flagged = [], []
    for k in np.argsort(-far)[:3]:
        if far[k] >= 0.3:
            flagged.append((names[k], "far", round(float(far[k]), 3)))
            reasons.append(f"{names[k]} is {r[k]:.0%} of the box from the prediction{mirrored}, {r[k] / typical[k]:.1f}x the "
                           f"usual error of a {names[k]} (score {scores[k]:.2f})")
    return Finding(float(np.sort(far)[::-1][:FAR_WORST].mean()) if far.size else 0.0, tuple(reasons), tuple(flagged))


def visibility_check(e: Evidence, p_hidden, states=None) -> Finding:
    """visibility: the flags against what the model sees: a calibrated model's own states (`states`,
    (K,) COCO's 0 absent, 1 occluded, 2 visible), else P(hidden) learnt from the file
    (`flag_surprise`), or without it (None) the fixed score rule."""
    if states is not None:
        return _visibility_by_states(e, np.asarray(states))
    if p_hidden is None:
        return _visibility_by_scores(e)
    v, names, scores = e.v, e.names, e.scores
    p_hidden = np.asarray(p_hidden, np.float64)
    z, surprise = flag_surprise(v, p_hidden)
    score = float(np.clip((z - VISIBILITY_Z) / VISIBILITY_Z_SPAN, 0, 1))
    reasons, flagged = [], []
    if score > 0:
        for k in np.argsort(-surprise)[:4]:
            if surprise[k] < -math.log(0.2):  # a flag with P >= 0.2 is no reason
                break
            what = "labelled not visible, looks visible" if v[k] == 1 else "labelled visible, looks hidden"
            flagged.append((names[k], "visibility", round(float(surprise[k]), 3)))
            reasons.append(f"{names[k]}: {what} (P(hidden) {p_hidden[k]:.2f}, score {scores[k]:.2f})")
    return Finding(score, tuple(reasons), tuple(flagged))


def _visibility_by_scores(e: Evidence) -> Finding:
    """The fixed rule: v=1 where the score is at or above its type's clear score, v=2 below its faint one."""
    v, names, scores = e.v, e.names, e.scores
    hidden_but_clear = (v == 1) & (scores >= e.calibration.clear)
    visible_but_faint = (v == 2) & (scores < e.calibration.faint)
    odd = hidden_but_clear | visible_but_faint
    reasons, flagged = [], []
    for k in np.flatnonzero(odd):
        what = "labelled not visible, the model sees it clearly" if hidden_but_clear[k] else \
            "labelled visible, the model barely finds it"
        flagged.append((names[k], "visibility", round(float(scores[k]), 3)))
        reasons.append(f"{names[k]}: {what} (score {scores[k]:.2f})")
    return Finding(float(min(1.0, odd.sum() / max(e.labelled.sum(), 1))), tuple(reasons), tuple(flagged))


def _visibility_by_states(e: Evidence, states: np.ndarray) -> Finding:
    """The calibrated rule: a flag the model's visibility contradicts, labelled hidden (v=1) where the
    model sees the point (2), or visible (v=2) where it calls the point occluded or absent."""
    v, names, scores = e.v, e.names, e.scores
    hidden_but_seen = (v == 1) & (states == 2)
    visible_but_hidden = (v == 2) & (states < 2)
    odd = hidden_but_seen | visible_but_hidden
    reasons, flagged = [], []
    for k in np.flatnonzero(odd):
        what = "labelled not visible, the model sees it" if hidden_but_seen[k] else \
            f"labelled visible, the model calls it {'occluded' if states[k] == 1 else 'absent'}"
        flagged.append((names[k], "visibility", round(float(scores[k]), 3)))
        reasons.append(f"{names[k]}: {what} (p {scores[k]:.2f})")
    return Finding(float(min(1.0, odd.sum() / max(e.labelled.sum(), 1))), tuple(reasons), tuple(flagged))


def bones_check(e: Evidence, links, bones) -> Finding:
    """bones: links of the label much longer or shorter than the file's same links, for the box
    (`bone_statistics`: median and spread of each link's log length)."""
    names = e.names
    links = np.asarray(links, int).reshape(-1, 2)
    median, spread = bones
    lengths = bone_lengths(e.label, e.bbox, links)
    z = np.nan_to_num(np.abs(lengths - median) / spread, nan=0.0)
    worst = np.argsort(-z)[:BONES_WORST]
    score = float(np.clip((z[worst].mean() - BONES_Z) / BONES_Z_SPAN, 0, 1)) if len(z) else 0.0
    reasons, flagged = [], []
    if score > 0:
        for j in worst:
            if z[j] < BONES_Z:
                break
            a, b = links[j]
            ratio = math.exp(float(lengths[j] - median[j]))
            flagged.append((names[b] if len(worst) > 1 and b in links[worst[worst != j]] else names[a], "bones",
                            round(float(z[j]), 3)))
            reasons.append(f"{names[a]}-{names[b]} is {ratio:.1f}x its usual length for the box in this file "
                           f"({z[j]:.1f} spreads off)")
    return Finding(score, tuple(reasons), tuple(flagged))


def box_check(e: Evidence) -> Finding:
    """box: labelled keypoints outside the box, by the largest distance over the box's size (x4, at most 1)."""
    if not e.labelled.any():
        return Finding(0.0)
    x, y, w, h = e.bbox
    xy = np.asarray(e.label[e.labelled, :2], np.float64)
    outside_x = np.maximum(np.maximum(x - xy[:, 0], xy[:, 0] - (x + w)), 0) / max(w, 1.0)
    outside_y = np.maximum(np.maximum(y - xy[:, 1], xy[:, 1] - (y + h)), 0) / max(h, 1.0)
    worst = float(np.maximum(outside_x, outside_y).max())
    reasons = (f"the box misses labelled keypoints by up to {worst:.0%} of its size",) if worst > 0 else ()
    return Finding(float(min(1.0, 4 * worst)), reasons)


def audit_instance(label: np.ndarray, bbox, predicted, scores, views_apart, skeleton,
                   calibration: Calibration, p_hidden=None, facing=None, bones=None,
                   visibility=None) -> tuple[dict, list, list]:
    """The checks of one label (K, 3) (x, y, v) with box [x, y, w, h] against the prediction (K, 2),
    its scores (K,) and views_apart (K,), and each keypoint's P(hidden) (K,) learnt from the file
    (`hidden_probabilities`; None: the fixed score rule), the label's facing (P as it is, P exchanged:
    `facing_probabilities`; None: no opinion) and the file's `bone_statistics` (None: no bones
    check): (checks, reasons, keypoints that raised one). `visibility`: a calibrated model's (K,)
    states, which the visibility check then reads instead of `p_hidden` (`scores` are then its p)."""
    e = evidence(label, bbox, predicted, scores, views_apart, skeleton, calibration)
    plausible = mirrored_probability(facing)
    swap, exchanged = swap_check(e, plausible)
    findings = {"swap": swap, "facing": facing_check(plausible), "far": far_check(e, exchanged),
                "visibility": visibility_check(e, p_hidden, visibility),
                "bones": None if bones is None else bones_check(e, skeleton.skeleton, bones), "box": box_check(e)}
    findings = {name: finding for name, finding in findings.items() if finding is not None}
    reasons = [reason for finding in findings.values() for reason in finding.reasons]
    flagged = [named for finding in findings.values() for named in finding.flagged]
    return {name: round(finding.score, 4) for name, finding in findings.items()}, reasons, flagged
