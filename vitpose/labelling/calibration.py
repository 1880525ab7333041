"""What the audit learns from the whole file before it judges one person.

A model is not an oracle: its errors differ per keypoint (a wrist is found far less precisely than
an eye) and it is sometimes unsure, and what a hidden keypoint, a mirrored label or a usual bone
length looks like depends on the data. So each of these is learnt from the labelled file itself,
robust to the few wrong labels being looked for, and out of fold where a classifier is fitted (a
person's own labels never judge them):

- `calibrate` -> `Calibration`: per keypoint type, the median error (distance from the prediction
  over the box's size sqrt(w h)), the median score and the scores of clearly seen / barely found points;
- `hidden_probabilities`: P(hidden) of every labelled keypoint (`visibility_features`, `fit_logistic`),
  and `flag_surprise`, how unlikely a person's flags are under it;
- `bone_statistics`: each skeleton link's usual log length for the box (median, 1.4826 x MAD);
- `facing_probabilities`: P that a label's left and right are the other way round, from its flags.

`vitpose.labelling.checks` turns these into the checks of one person.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vitpose.codecs.confidence import fit_logistic, logistic  # noqa: F401 - the one fitter, importable here too
from vitpose.labelling.labels import LabelledImage

__all__ = ["Calibration", "bone_lengths", "bone_statistics", "calibrate", "facing_probabilities", "fit_logistic",
           "flag_surprise", "hidden_probabilities", "logistic", "relative_errors", "visibility_features"]


@dataclass(frozen=True)
class Calibration:
    """Per keypoint type (K,): the median error over the box's size, the median score, and the
    scores above which a point is clearly seen / below which it is barely found (visible points)."""

    error: np.ndarray
    score: np.ndarray
    clear: np.ndarray
    faint: np.ndarray


def relative_errors(label: np.ndarray, bbox, predicted) -> np.ndarray:
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
            errors.append(np.where(label[:, 2] > 0, relative_errors(label, image.boxes[m], line["predicted"][m]), np.nan))
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
    r = relative_errors(label, bbox, predicted)
    return np.stack([np.log(scores / (1 - scores)), np.log(scores / calibration.score),
                     np.log(scores / np.median(scores)), np.log(r / calibration.error + 0.1),
                     np.log(np.asarray(views_apart, np.float64) / calibration.error + 0.1),
                     np.abs(plain - mirrored)], 1)


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

