"""How well `vitpose calibrate`'s fit does, measured out of fold: the expected calibration error
(ECE) of the raw score and of `p`, the visibility classifier's three-state accuracy against the
majority class with a bootstrap interval over images, and the reliability diagram (PNG).

Numpy, plus matplotlib (a dependency) for the diagram, imported only to draw it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["ECE_BINS", "VisibilityFigures", "expected_calibration_error", "reliability_bins", "reliability_diagram",
           "visibility_figures"]

ECE_BINS = 15  # equal-width bins of the predicted probability
BOOTSTRAP_DRAWS = 1000


def reliability_bins(probability, outcome, bins: int = ECE_BINS):
    """(mean predicted, observed rate, count) per equal-width bin of `probability` in [0, 1]."""
    probability = np.clip(np.asarray(probability, np.float64).ravel(), 0.0, 1.0)
    outcome = np.asarray(outcome, np.float64).ravel()
    which = np.minimum((probability * bins).astype(int), bins - 1)
    count = np.bincount(which, minlength=bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = np.bincount(which, probability, bins) / count
        observed = np.bincount(which, outcome, bins) / count
    return expected, observed, count


def expected_calibration_error(probability, outcome, bins: int = ECE_BINS) -> float:
    """sum over bins of (share of the points) x |mean predicted - observed rate|."""
    expected, observed, count = reliability_bins(probability, outcome, bins)
    used = count > 0
    return float((count[used] / count.sum() * np.abs(expected[used] - observed[used])).sum())


@dataclass(frozen=True)
class VisibilityFigures:
    """Three-state accuracy of the classifier, of the majority class, and the 95% bootstrap interval
    (over images) of their difference."""

    accuracy: float
    baseline: float
    majority: int
    interval: tuple[float, float]
    count: int

    @property
    def margin(self) -> float:
        return self.accuracy - self.baseline


def visibility_figures(predicted, labelled, image_of, majority: int, draws: int = BOOTSTRAP_DRAWS,
                       seed: int = 0) -> VisibilityFigures:
    """`predicted` and `labelled` states (n,), each keypoint's image (n,): accuracy against always
    answering `majority`, the difference's interval from resampling whole images."""
    right = (np.asarray(predicted) == np.asarray(labelled)).astype(np.float64)
    base = (np.asarray(labelled) == majority).astype(np.float64)
    images, index = np.unique(np.asarray(image_of), return_inverse=True)
    per_right = np.bincount(index, right, len(images))
    per_base = np.bincount(index, base, len(images))
    per_count = np.bincount(index, minlength=len(images)).astype(np.float64)
    rng = np.random.default_rng(seed)
    differences = []
    for _ in range(draws):
        pick = rng.integers(0, len(images), len(images))
        n = per_count[pick].sum()
        differences.append((per_right[pick].sum() - per_base[pick].sum()) / max(n, 1.0))
    low, high = np.percentile(differences, [2.5, 97.5])
    return VisibilityFigures(float(right.mean()), float(base.mean()), int(majority), (float(low), float(high)),
                             len(right))


def reliability_diagram(path, raw, p, outcome, title: str, bins: int = ECE_BINS) -> Path:
    """The reliability diagram (observed rate against predicted probability, before: the raw score,
    after: p) as a PNG at `path`, written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vitpose.files import atomic_path

    figure, axis = plt.subplots(figsize=(5, 5), dpi=100)
    axis.plot([0, 1], [0, 1], color="0.6", linestyle="--", label="perfectly calibrated")
    for values, name, colour in ((raw, "raw score", "tab:red"), (p, "p (calibrated)", "tab:blue")):
        expected, observed, count = reliability_bins(values, outcome, bins)
        used = count > 0
        ece = expected_calibration_error(values, outcome, bins)
        axis.plot(expected[used], observed[used], marker="o", color=colour, label=f"{name}: ECE {ece:.3f}")
    axis.set(xlim=(0, 1), ylim=(0, 1), xlabel="predicted probability", ylabel="observed rate within tolerance",
             title=title)
    axis.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    with atomic_path(path) as staged:
        figure.savefig(staged, format="png")
    plt.close(figure)
    return Path(path)
