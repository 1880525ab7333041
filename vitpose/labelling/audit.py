"""Which labels look wrong: rank the labelled people of a COCO file by how likely a label error is.

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
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitpose.errors import UserError

__all__ = ["Calibration", "LabelledImage", "audit_instance", "audit_annotations", "calibrate", "ranked",
           "read_labels", "suspicion"]

SWAP_MARGIN = 0.1  # the similarity gain of the exchanged label that starts to count as a swap
FAR_WORST = 3  # the far check is the mean of this many worst keypoints (one is often the model's own slip)
FACING_ALONE = 0.95  # the facing check: the file's P that a label is mirrored above which it counts by itself
VISIBILITY_Z, VISIBILITY_Z_SPAN = 2.0, 4.0  # the visibility check: 0 up to z = 2, 1 from z = 6 (`flag_surprise`)


@dataclass(frozen=True)
class Calibration:
    """Per keypoint type (K,): the median error over the box's size, the median score, and the
    scores above which a point is clearly seen / below which it is barely found (visible points)."""

    error: np.ndarray
    score: np.ndarray
    clear: np.ndarray
    faint: np.ndarray


def suspicion(checks: dict) -> float:
    """1 - prod(1 - check)."""
    return float(1.0 - np.prod([1.0 - min(max(v, 0.0), 1.0) for v in checks.values()]))


def _errors(label: np.ndarray, bbox, predicted) -> np.ndarray:
    """Each keypoint's distance from the prediction over the box's size sqrt(w h)."""
    return np.hypot(*(np.asarray(label[:, :2], np.float64) - np.asarray(predicted, np.float64)).T) / \
        math.sqrt(max(float(bbox[2]) * float(bbox[3]), 1.0))


def calibrate(labels: list[LabelledImage], lines: dict) -> Calibration:
    """The medians of `Calibration` over every labelled keypoint of the file (a type never
    labelled: the mean of the others)."""
    errors, scores, visible = [], [], []
    for image in labels:
        line = lines[image.file_name]
        for m in range(len(image.annotation_ids)):
            label = image.keypoints[m]
            errors.append(np.where(label[:, 2] > 0, _errors(label, image.boxes[m], line["predicted"][m]), np.nan))
            scores.append(np.where(label[:, 2] > 0, line["scores"][m], np.nan))
            visible.append(np.where(label[:, 2] == 2, line["scores"][m], np.nan))
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column: a type never labelled
            stats = [np.nanmedian(errors, 0), np.nanmedian(scores, 0), np.nanpercentile(visible, 90, 0),
                     np.nanpercentile(visible, 5, 0)]
    filled = []
    for values, floor in zip(stats, (1e-3, 1e-3, 0.0, 0.0)):
        values = np.where(np.isfinite(values), values, np.nanmean(values) if np.isfinite(values).any() else 1.0)
        filled.append(np.maximum(values, floor))
    return Calibration(*filled)


# ---------------------------------------------------------------------------------------------
# Visibility, learnt from the file: which flags the model's view of each keypoint makes unlikely

VISIBILITY_FEATURES = ("score", "score over its type's median", "score over the person's median",
                       "label-prediction distance", "flip views apart", "flip views' score gap")
VISIBILITY_FOLDS = 5  # out-of-fold: a person's flags never teach the classifier that judges them
VISIBILITY_MIN_LABELS = 20  # of each flag (v=1 and v=2) before the file can teach anything


def visibility_features(label: np.ndarray, bbox, predicted, scores, views_apart, plain_scores, mirrored_scores,
                        calibration: Calibration) -> np.ndarray:
    """(K, F) numbers that tell a hidden keypoint from a visible one (`VISIBILITY_FEATURES`), from
    the one prediction pass: the heatmap score (as is, over its type's median and over the person's
    own median: a small or blurred person scores low everywhere), how far the label is from the
    prediction and the flip test's two views from each other in units of the type's median error
    (a model guesses where it cannot see), and the gap between the two views' scores. Nothing of
    the label's other flags: a prior such as "hidden points come in groups" would find randomly
    flipped flags by how they were planted (BENCHMARKS.md measures it: no better)."""
    scores = np.clip(np.asarray(scores, np.float64), 1e-3, 1 - 1e-3)
    plain = np.asarray(scores if plain_scores is None else plain_scores, np.float64)
    mirrored = np.asarray(scores if mirrored_scores is None else mirrored_scores, np.float64)
    r = _errors(label, bbox, predicted)
    return np.stack([np.log(scores / (1 - scores)), np.log(scores / calibration.score),
                     np.log(scores / np.median(scores)), np.log(r / calibration.error + 0.1),
                     np.log(np.asarray(views_apart, np.float64) / calibration.error + 0.1),
                     np.abs(plain - mirrored)], 1)


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1.0, steps: int = 50) -> np.ndarray:
    """L2-regularised logistic regression by Newton's method on standardised features: returns
    (F + 1,) weights on the raw features and the bias (the standardisation folded in; `logistic`)."""
    mean, scale = x.mean(0), x.std(0) + 1e-9
    z = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    w = np.zeros(z.shape[1])
    ridge = np.full(z.shape[1], l2)
    ridge[-1] = 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-z @ w))
        gradient = z.T @ (p - y) + ridge * w
        hessian = (z * (p * (1 - p))[:, None]).T @ z + np.diag(ridge + 1e-9)
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.abs(step).max() < 1e-7:
            break
    return np.concatenate([w[:-1] / scale, [w[-1] - (w[:-1] * mean / scale).sum()]])


def logistic(weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-(x @ weights[:-1] + weights[-1])))


def hidden_probabilities(labels: list[LabelledImage], lines: dict, calibration: Calibration) -> dict | None:
    """{(file_name, person index): P(hidden) (K,)} for every labelled keypoint of the file, out of
    fold: a small classifier of v=1 against v=2 (`fit_logistic` on `visibility_features` and the
    keypoint's type) fitted on the other folds' people; the file teaches what hidden looks like to
    this model (confident learning). None when the file labels fewer than `VISIBILITY_MIN_LABELS`
    keypoints of either flag."""
    keys, features, flags = [], [], []
    for image in labels:
        line = lines[image.file_name]
        for m in range(len(image.annotation_ids)):
            label = image.keypoints[m]
            f = visibility_features(label, image.boxes[m], line["predicted"][m], line["scores"][m],
                                    line["views_apart"][m], (line.get("plain_scores") or [None] * (m + 1))[m],
                                    (line.get("mirrored_scores") or [None] * (m + 1))[m], calibration)
            keys.append((image.file_name, m))
            features.append(f)
            flags.append(np.asarray(label[:, 2]))
    if not keys:
        return None
    k = len(flags[0])
    x = np.concatenate([np.hstack([f, np.eye(k)]) for f in features])
    v = np.concatenate(flags)
    person = np.repeat(np.arange(len(keys)), k)
    labelled = v > 0
    if min((v == 1).sum(), (v == 2).sum()) < VISIBILITY_MIN_LABELS:
        return None
    fold = person % VISIBILITY_FOLDS
    p = np.full(len(v), np.nan)
    for f in range(VISIBILITY_FOLDS):
        train, test = labelled & (fold != f), labelled & (fold == f)
        if test.any():
            p[test] = logistic(fit_logistic(x[train], (v[train] == 1).astype(np.float64)), x[test])
    p = np.clip(p, 1e-4, 1 - 1e-4).reshape(len(keys), k)
    return {key: p[i] for i, key in enumerate(keys)}


def flag_surprise(v: np.ndarray, p_hidden: np.ndarray) -> tuple[float, np.ndarray]:
    """How unlikely the labelled flags are under P(hidden): (z, each keypoint's surprise -log P(flag)).
    z = sum(surprise - its expectation) / sqrt(sum of its variances) over the labelled keypoints:
    near 0 for a person labelled as the classifier expects whatever their number of hidden points,
    large when several flags are each unlikely."""
    labelled = v > 0
    q = np.clip(np.where(labelled, p_hidden, 0.5), 1e-6, 1 - 1e-6)
    surprise = np.where(labelled, -np.log(np.where(v == 1, q, 1 - q)), 0.0)
    entropy = -(q * np.log(q) + (1 - q) * np.log(1 - q))
    variance = q * (1 - q) * np.log(q / (1 - q)) ** 2
    excess = float(((surprise - entropy) * labelled).sum())
    return excess / math.sqrt(max(float((variance * labelled).sum()), 1e-6)), surprise


# ---------------------------------------------------------------------------------------------
# Bones, learnt from the file: how long each link of the skeleton usually is for its box

BONES_Z, BONES_Z_SPAN = 3.0, 6.0  # the bones check: 0 up to z = 3, 1 from z = 9
BONES_WORST = 2  # the bones check is the mean z of this many worst links (a misplaced point bends two)


def bone_lengths(label: np.ndarray, bbox, links) -> np.ndarray:
    """(L,) log of each skeleton link's length over the box's size sqrt(w h); NaN where an end
    is not labelled."""
    label = np.asarray(label, np.float64)
    a, b = np.asarray(links, int).reshape(-1, 2).T
    length = np.hypot(*(label[a, :2] - label[b, :2]).T) / math.sqrt(max(float(bbox[2] * bbox[3]), 1.0))
    return np.where((label[a, 2] > 0) & (label[b, 2] > 0), np.log(length + 1e-3), np.nan)


def bone_statistics(labels: list[LabelledImage], skeleton) -> tuple[np.ndarray, np.ndarray] | None:
    """Each link's median log length (over the box's size) and its robust spread (1.4826 x the
    median absolute deviation) over the file's people: robust to the few wrong labels being
    looked for. None without links or with fewer than 20 people."""
    links = np.asarray(skeleton.skeleton, int).reshape(-1, 2)
    lengths = [bone_lengths(image.keypoints[m], image.boxes[m], links)
               for image in labels for m in range(len(image.annotation_ids))]
    if not len(links) or len(lengths) < 20:
        return None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a link never labelled: NaN, no opinion
        median = np.nanmedian(lengths, 0)
        spread = 1.4826 * np.nanmedian(np.abs(np.asarray(lengths) - median), 0)
    return median, np.where(np.isfinite(spread), np.maximum(spread, 0.02), np.nan)


# ---------------------------------------------------------------------------------------------
# Facing, learnt from the file: which way round left and right lie for a person labelled like this

FACING_FOLDS = 5
FACING_MIN_PEOPLE = 10  # on each side (left on the image's left / right) before the file can teach anything


def facing_side(label: np.ndarray, bbox, flip) -> float:
    """Which side of the image the label puts the person's left on: the mean over the labelled
    flip pairs of (x of the left-named point - x of its partner) over the box's size sqrt(w h)
    (the sign depends on which name of a pair is called left; the classifier learns either)."""
    flip = np.asarray(flip)
    first = np.flatnonzero((np.arange(len(flip)) < flip) & (label[:, 2] > 0) & (label[flip, 2] > 0))
    if not len(first):
        return 0.0
    return float((label[first, 0] - label[flip[first], 0]).mean() / math.sqrt(max(float(bbox[2] * bbox[3]), 1.0)))


def facing_features(v: np.ndarray) -> np.ndarray:
    """(2K,) the label's flags: each keypoint labelled visible (v=2), labelled not visible (v=1)."""
    return np.concatenate([(v == 2), (v == 1)]).astype(np.float64)


def facing_probabilities(labels: list[LabelledImage], skeleton) -> dict | None:
    """{(file_name, person index): (P(the label as it is), P(the label with left and right
    exchanged))} from the label alone, out of fold: a small classifier (`fit_logistic`) of the
    side the label puts the person's left on (`facing_side`) given its flags (`facing_features`:
    which keypoints are labelled visible tells which way the person faces, e.g. a face labelled
    visible), fitted on the other folds' people. Where the two are close the file cannot tell;
    where the exchanged label is far likelier, the label is mirrored for a person labelled like
    this. None when the file has fewer than `FACING_MIN_PEOPLE` people on either side, or a
    skeleton without flip pairs."""
    flip = np.asarray(skeleton.flip_indices)
    if not (flip != np.arange(len(flip))).any():
        return None
    keys, sides, features, exchanged = [], [], [], []
    for image in labels:
        for m in range(len(image.annotation_ids)):
            label = np.asarray(image.keypoints[m], np.float64)
            keys.append((image.file_name, m))
            sides.append(facing_side(label, image.boxes[m], flip))
            features.append(facing_features(label[:, 2]))
            exchanged.append(facing_features(label[flip, 2]))
    sides, x, x_exchanged = np.asarray(sides), np.asarray(features), np.asarray(exchanged)
    typical = float(np.median(np.abs(sides[sides != 0]))) if (sides != 0).any() else 0.0
    decided = np.abs(sides) > 0.25 * typical  # a person seen side on teaches nothing
    if min((decided & (sides > 0)).sum(), (decided & (sides < 0)).sum()) < FACING_MIN_PEOPLE:
        return None
    fold = np.arange(len(keys)) % FACING_FOLDS
    out = {}
    for f in range(FACING_FOLDS):
        train, test = decided & (fold != f), np.flatnonzero(fold == f)
        if not len(test):
            continue
        weights = fit_logistic(x[train], (sides[train] > 0).astype(np.float64))
        right_as_is, right_exchanged = logistic(weights, x[test]), logistic(weights, x_exchanged[test])
        for i, p, q in zip(test, right_as_is, right_exchanged):
            if not decided[i]:
                out[keys[i]] = (0.5, 0.5)
            elif sides[i] > 0:  # the exchanged label puts the left on the other side
                out[keys[i]] = (float(p), float(1 - q))
            else:
                out[keys[i]] = (float(1 - p), float(q))
    return out


def audit_instance(label: np.ndarray, bbox, predicted, scores, views_apart, skeleton,
                   calibration: Calibration, p_hidden=None, facing=None, bones=None) -> tuple[dict, list, list]:
    """The checks of one label (K, 3) (x, y, v) with box [x, y, w, h] against the prediction (K, 2),
    its scores (K,) and views_apart (K,), and each keypoint's P(hidden) (K,) learnt from the file
    (`hidden_probabilities`; None: the fixed score rule), the label's facing (P as it is, P exchanged:
    `facing_probabilities`; None: no opinion) and the file's `bone_statistics` (None: no bones
    check): (checks, reasons, keypoints that raised one)."""
    names = skeleton.keypoint_names
    flip = np.asarray(skeleton.flip_indices)
    v = np.asarray(label[:, 2])
    scores, apart = np.asarray(scores, np.float64), np.asarray(views_apart, np.float64)
    x, y, w, h = (float(b) for b in bbox)
    labelled = v > 0
    typical = calibration.error
    r = _errors(label, bbox, predicted)
    trust = np.minimum(1.0, scores / calibration.score) * np.exp(-(apart / typical) ** 2 / 8) * labelled
    checks, reasons, flagged = {}, [], []

    # swap: the label with its left and right names exchanged against the label as it is
    pairs = labelled & labelled[flip] & (flip != np.arange(len(flip)))
    weight = np.minimum(trust, trust[flip]) * pairs
    checks["swap"] = 0.0
    mirrored = ""  # the far check judges the keypoints, not the left/right order the swap check judges
    plausible = 0.5  # the label-only P that the label is mirrored (`facing_probabilities`; 0.5: no opinion)
    if facing is not None:
        as_is, exchanged_p = facing
        plausible = exchanged_p / max(as_is + exchanged_p, 1e-9)
    if weight.sum() > 0:
        exchanged = np.concatenate([label[flip, :2], label[:, 2:]], 1)
        r_exchanged = _errors(exchanged, bbox, predicted)
        as_is = float((np.exp(-(r / (2 * typical)) ** 2 / 2) * weight).sum() / weight.sum())
        swapped = float((np.exp(-(r_exchanged / (2 * typical)) ** 2 / 2) * weight).sum() / weight.sum())
        gain = swapped - as_is
        if gain > SWAP_MARGIN:
            model_says = float(np.clip((gain - SWAP_MARGIN) / 0.3 + 0.5, 0, 1))
            checks["swap"] = model_says * min(1.0, 2 * plausible)
            reasons.append(f"left/right swapped? the label fits the prediction {as_is:.2f}, {swapped:.2f} with "
                           f"left and right exchanged")
            if plausible < 0.5:
                reasons.append(f"but the label's left/right order is the usual one for a person labelled like this "
                               f"(P {1 - plausible:.2f} against {plausible:.2f} exchanged, learnt from the file): the "
                               f"model may have mirrored the person")
            r = _errors(label, bbox, np.asarray(predicted, np.float64)[flip])
            mirrored = " with left and right exchanged"
    if facing is not None and plausible > FACING_ALONE:
        checks["facing"] = float(np.clip((plausible - FACING_ALONE) / (1 - FACING_ALONE), 0, 1))
        reasons.append(f"left/right swapped? for a person labelled like this the file puts left and right the "
                       f"other way round (P {plausible:.2f}; learnt from the file's other people)")

    # far: a keypoint far from a trusted prediction, in units of its type's median error
    far = trust * (1.0 - np.exp(-np.maximum(r / typical - 1.0, 0.0) ** 2 / 8))
    checks["far"] = float(np.sort(far)[::-1][:FAR_WORST].mean()) if far.size else 0.0
    for k in np.argsort(-far)[:3]:
        if far[k] >= 0.3:
            flagged.append((names[k], "far", round(float(far[k]), 3)))
            reasons.append(f"{names[k]} is {r[k]:.0%} of the box from the prediction{mirrored}, {r[k] / typical[k]:.1f}x the "
                           f"usual error of a {names[k]} (score {scores[k]:.2f})")

    # visibility: the flags against what the model sees
    if p_hidden is not None:
        p_hidden = np.asarray(p_hidden, np.float64)
        z, surprise = flag_surprise(v, p_hidden)
        checks["visibility"] = float(np.clip((z - VISIBILITY_Z) / VISIBILITY_Z_SPAN, 0, 1))
        if checks["visibility"] > 0:
            for k in np.argsort(-surprise)[:4]:
                if surprise[k] < -math.log(0.2):  # a flag with P >= 0.2 is no reason
                    break
                what = "labelled not visible, looks visible" if v[k] == 1 else "labelled visible, looks hidden"
                flagged.append((names[k], "visibility", round(float(surprise[k]), 3)))
                reasons.append(f"{names[k]}: {what} (P(hidden) {p_hidden[k]:.2f}, score {scores[k]:.2f})")
    else:
        hidden_but_clear = (v == 1) & (scores >= calibration.clear)
        visible_but_faint = (v == 2) & (scores < calibration.faint)
        odd = hidden_but_clear | visible_but_faint
        checks["visibility"] = float(min(1.0, odd.sum() / max(labelled.sum(), 1)))
        for k in np.flatnonzero(odd):
            what = "labelled not visible, the model sees it clearly" if hidden_but_clear[k] else \
                "labelled visible, the model barely finds it"
            flagged.append((names[k], "visibility", round(float(scores[k]), 3)))
            reasons.append(f"{names[k]}: {what} (score {scores[k]:.2f})")

    # bones: links of the label much longer or shorter than the file's same links, for the box
    if bones is not None:
        links = np.asarray(skeleton.skeleton, int).reshape(-1, 2)
        median, spread = bones
        lengths = bone_lengths(label, bbox, links)
        z = np.nan_to_num(np.abs(lengths - median) / spread, nan=0.0)
        worst = np.argsort(-z)[:BONES_WORST]
        checks["bones"] = float(np.clip((z[worst].mean() - BONES_Z) / BONES_Z_SPAN, 0, 1)) if len(z) else 0.0
        if checks["bones"] > 0:
            for j in worst:
                if z[j] < BONES_Z:
                    break
                a, b = links[j]
                ratio = math.exp(float(lengths[j] - median[j]))
                flagged.append((names[b] if len(worst) > 1 and b in links[worst[worst != j]] else names[a], "bones",
                                round(float(z[j]), 3)))
                reasons.append(f"{names[a]}-{names[b]} is {ratio:.1f}x its usual length for the box in this file "
                               f"({z[j]:.1f} spreads off)")

    # box: labelled keypoints outside the box
    checks["box"] = 0.0
    if labelled.any():
        xy = np.asarray(label[labelled, :2], np.float64)
        outside_x = np.maximum(np.maximum(x - xy[:, 0], xy[:, 0] - (x + w)), 0) / max(w, 1.0)
        outside_y = np.maximum(np.maximum(y - xy[:, 1], xy[:, 1] - (y + h)), 0) / max(h, 1.0)
        worst = float(np.maximum(outside_x, outside_y).max())
        checks["box"] = float(min(1.0, 4 * worst))
        if worst > 0:
            reasons.append(f"the box misses labelled keypoints by up to {worst:.0%} of its size")
    return {name: round(value, 4) for name, value in checks.items()}, reasons, flagged


# ---------------------------------------------------------------------------------------------
# The COCO file


@dataclass
class LabelledImage:
    """One image of the COCO file with its labelled people (keypoints (M, K, 3), boxes (M, 4) xywh)."""

    image_id: int
    file_name: str
    width: int
    height: int
    annotation_ids: list
    keypoints: np.ndarray
    boxes: np.ndarray


def read_labels(path: Path, num_keypoints: int) -> list[LabelledImage]:
    """The labelled people of a COCO keypoint file, per image (file order); crowd annotations and
    people without a labelled keypoint are left out. Errors name the file, the record and the field."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"--annotations {path}: not a readable JSON file ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list) \
            or not isinstance(doc.get("annotations"), list):
        raise UserError(f"--annotations {path}: not a COCO keypoint file (fields 'images' and 'annotations')")
    images, order = {}, []
    for i, image in enumerate(doc["images"]):
        where = f"--annotations {path}: images[{i}]"
        if not isinstance(image, dict):
            raise UserError(f"{where}: expected an object")
        for key, kind in (("id", int), ("file_name", str), ("width", int), ("height", int)):
            if not isinstance(image.get(key), kind) or isinstance(image.get(key), bool):
                raise UserError(f"{where}: field {key!r} must be {'a file name' if kind is str else 'an integer'}")
        images[image["id"]] = LabelledImage(image["id"], image["file_name"], image["width"], image["height"],
                                            [], [], [])
        order.append(image["id"])
    for i, ann in enumerate(doc["annotations"]):
        where = f"--annotations {path}: annotations[{i}]"
        if not isinstance(ann, dict):
            raise UserError(f"{where}: expected an object")
        if ann.get("iscrowd"):
            continue
        image = images.get(ann.get("image_id"))
        if image is None:
            raise UserError(f"{where}: field 'image_id' {ann.get('image_id')!r} names no image of the file")
        keypoints, bbox = ann.get("keypoints"), ann.get("bbox")
        if not _numbers(keypoints, 3 * num_keypoints):
            raise UserError(f"{where}: field 'keypoints' must hold {3 * num_keypoints} numbers (the model's "
                            f"{num_keypoints} keypoints as x, y, v)")
        if not _numbers(bbox, 4) or bbox[2] <= 0 or bbox[3] <= 0:
            raise UserError(f"{where}: field 'bbox' must be [x, y, w, h] with w, h > 0")
        keypoints = np.asarray(keypoints, np.float64).reshape(num_keypoints, 3)
        if not (keypoints[:, 2] > 0).any():
            continue
        image.annotation_ids.append(ann.get("id", i))
        image.keypoints.append(keypoints)
        image.boxes.append(np.asarray(bbox, np.float64))
    out = []
    for image_id in order:
        image = images[image_id]
        if image.annotation_ids:
            image.keypoints, image.boxes = np.stack(image.keypoints), np.stack(image.boxes)
            out.append(image)
    return out


def _numbers(value, count: int) -> bool:
    return (isinstance(value, list) and len(value) == count
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value))


def predict_image(predictor, image_rgb: np.ndarray, labelled: LabelledImage) -> dict:
    """The model on the image's labelled people in their label boxes (flip test on): the
    flip-averaged keypoints (M, K, 2) and scores (M, K), and how far apart the plain and the
    mirrored views put each keypoint, over the box's size (M, K): where the two views part, the
    model itself is unsure and its prediction is no evidence against the label."""
    views = predictor.flip_views(image_rgb, boxes=labelled.boxes, box_format="xywh")
    size = np.sqrt(np.maximum(labelled.boxes[:, 2] * labelled.boxes[:, 3], 1.0))[:, None]
    apart = np.hypot(*np.moveaxis(views.plain - views.mirrored, -1, 0)) / size
    return {"predicted": np.round(views.poses.keypoints, 2).tolist(),
            "scores": np.round(views.poses.keypoint_scores, 4).tolist(), "views_apart": np.round(apart, 4).tolist(),
            "plain_scores": np.round(views.plain_scores, 4).tolist(),
            "mirrored_scores": np.round(views.mirrored_scores, 4).tolist()}


def audit_annotations(predictor, labels: list[LabelledImage], images_dir: Path, progress: Path, *,
                      resume: bool = False, stop=None):
    """Predict every labelled image (`predict_image`), each image's line streamed to `progress` (JSON Lines,
    `ResultsFile`: an interrupted run keeps what it finished, `resume=True` continues it).
    Returns ({image file_name: its progress line}, completed)."""
    from vitpose.files import read_image
    from vitpose.inference.pipeline import ResultsFile, read_records

    results = ResultsFile(progress, "image", resume=resume)
    lines = {line["image"]: line for line in read_records(progress)} if results.done else {}
    completed = False
    try:
        for labelled in labels:
            if labelled.file_name in results.done:
                continue
            if stop is not None and stop():
                break
            image = read_image(Path(images_dir) / labelled.file_name)
            line = {"image": labelled.file_name, "annotation_ids": labelled.annotation_ids,
                    **predict_image(predictor, np.ascontiguousarray(image[:, :, ::-1]), labelled)}
            results.write([line])
            lines[labelled.file_name] = line
        else:
            completed = True
    finally:
        results.close(completed)
    return lines, completed


def ranked(labels: list[LabelledImage], lines: dict, skeleton) -> list[dict]:
    """Every audited person (`audit_instance`, calibrated on the whole file), most suspicious
    first (ties: the larger sum of checks, then file order): rows of annotation_id, image, suspicion, checks, reasons, keypoints."""
    calibration = calibrate(labels, lines)
    hidden = hidden_probabilities(labels, lines, calibration)
    facing = facing_probabilities(labels, skeleton)
    bones = bone_statistics(labels, skeleton)
    rows = []
    for image in labels:
        line = lines[image.file_name]
        for m, annotation_id in enumerate(image.annotation_ids):
            checks, reasons, flagged = audit_instance(image.keypoints[m], image.boxes[m], line["predicted"][m],
                                                      line["scores"][m], line["views_apart"][m], skeleton,
                                                      calibration, None if hidden is None else hidden[image.file_name, m],
                                                      None if facing is None else facing[image.file_name, m], bones)
            rows.append({"annotation_id": annotation_id, "image": image.file_name,
                         "suspicion": round(suspicion(checks), 4), "checks": checks, "reasons": reasons,
                         "keypoints": flagged})
    return sorted(rows, key=lambda row: (-row["suspicion"], -sum(row["checks"].values())))


def review_records(flagged: list[dict], labels: list[LabelledImage], lines: dict, names) -> list[dict]:
    """Pre-annotation records (as `vitpose predict --json` writes them) of the flagged people for
    `to_labelstudio_tasks` / `to_cvat_xml`: the label's keypoints with score 1, the keypoints a
    check named and the unlabelled ones (the prediction's place) with score 0, so the tool marks
    them for review."""
    by_image = {image.file_name: image for image in labels}
    records = []
    for row in flagged:
        image = by_image[row["image"]]
        m = image.annotation_ids.index(row["annotation_id"])
        label = image.keypoints[m]
        predicted = np.asarray(lines[row["image"]]["predicted"][m])
        named = {name for name, _, _ in row["keypoints"]}
        flat = []
        for k, name in enumerate(names):
            x, y, v = label[k]
            if v > 0:
                flat += [float(x), float(y), 0.0 if name in named else 1.0]
            else:
                flat += [float(predicted[k][0]), float(predicted[k][1]), 0.0]
        records.append({"file_name": image.file_name, "width": image.width, "height": image.height,
                        "bbox": [float(b) for b in image.boxes[m]], "keypoints": flat, "score": row["suspicion"],
                        "bbox_score": 1.0})
    return records


def html_report(rows: list[dict], labels: list[LabelledImage], lines: dict, images_dir: Path, skeleton,
                title: str) -> str:
    """A page a person reads: one table row per instance (rank, image, suspicion, checks, reasons)
    with the label and the model's prediction drawn on the person's crop."""
    import base64
    import html

    import cv2

    from vitpose.files import read_image
    from vitpose.inference.draw import draw_pose

    by_image = {image.file_name: image for image in labels}
    cache: dict = {}
    out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>", f"<title>{html.escape(title)}</title>",
           "<style>body{font-family:sans-serif}td{vertical-align:top;padding:4px;border-bottom:1px solid #ccc}"
           "img{height:200px}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
           "<p>Most suspicious first. Left: the label; right: the model's prediction (flip test, the label's "
           "box). A high score is a reason to look, not proof.</p>",
           "<table><tr><th>#</th><th>image / annotation</th><th>suspicion</th><th>checks</th><th>reasons</th>"
           "<th>label | model</th></tr>"]
    for rank, row in enumerate(rows, 1):
        image = by_image[row["image"]]
        m = image.annotation_ids.index(row["annotation_id"])
        if row["image"] not in cache:
            cache.clear()
            cache[row["image"]] = read_image(Path(images_dir) / row["image"])
        pixels = cache[row["image"]]
        label = image.keypoints[m]
        predicted = np.asarray(lines[row["image"]]["predicted"][m])
        scores = np.asarray(lines[row["image"]]["scores"][m])
        x, y, w, h = image.boxes[m]
        pad = 0.15 * max(w, h)
        x1, y1 = int(max(0, x - pad)), int(max(0, y - pad))
        x2, y2 = int(min(pixels.shape[1], x + w + pad)), int(min(pixels.shape[0], y + h + pad))
        crops = []
        for keypoints, shown in ((label[:, :2], (label[:, 2] > 0).astype(np.float32)), (predicted, scores)):
            drawn = draw_pose(pixels, keypoints, shown, skeleton=skeleton.skeleton, channels="bgr",
                              keypoint_colors=skeleton.keypoint_colors, link_colors=skeleton.link_colors)
            crop = drawn[y1:max(y2, y1 + 1), x1:max(x2, x1 + 1)]
            ok, encoded = cv2.imencode(".jpg", crop)
            crops.append(f"<img src='data:image/jpeg;base64,{base64.b64encode(encoded.tobytes()).decode()}'>"
                         if ok else "")
        checks = ", ".join(f"{name} {value:.2f}" for name, value in row["checks"].items() if value > 0) or "-"
        reasons = "<br>".join(html.escape(r) for r in row["reasons"]) or "-"
        out.append(f"<tr><td>{rank}</td><td>{html.escape(row['image'])}<br>id {row['annotation_id']}</td>"
                   f"<td>{row['suspicion']:.2f}</td><td>{html.escape(checks)}</td><td>{reasons}</td>"
                   f"<td>{''.join(crops)}</td></tr>")
    out += ["</table></body></html>"]
    return "\n".join(out) + "\n"
