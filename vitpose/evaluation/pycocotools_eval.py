"""pycocotools' COCOeval run as xtcocotools runs it for MMPose, and the bootstrap of its AP.

`run_cocoeval` / `score_with_cocoeval`: the ten keypoint stats of a results list (docs/mmpose-edge-cases.md
§2 to §5: results none of whose keypoint scores is above 0 are left out before matching, a non-finite
OKS is 0, the sigmas are float32). `resampled_ap` re-pools COCOeval's per-image matches for a
bootstrap resample of the images and `paired_bootstrap` gives the interval of an AP difference: the
precision gates' figures.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
from collections.abc import Sequence

import numpy as np

log = logging.getLogger(__name__)


@contextlib.contextmanager
def quiet_pycocotools(what: str):
    """pycocotools prints progress to stdout; send it to the debug log instead."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        yield
    text = buffer.getvalue().strip()
    if text:
        log.debug("%s:\n%s", what, text)


def _finite_oks_cocoeval():
    """pycocotools' COCOeval whose OKS is 0 wherever it is not finite.

    pycocotools matches a detection to a ground truth unless `oks < threshold`; a NaN OKS (from a
    NaN keypoint) is never below anything, so without this a broken model whose keypoints are all
    NaN matches every person and scores a high AP (0.39 on the synthetic set instead of 0).
    """
    from pycocotools.cocoeval import COCOeval

    class FiniteOksCOCOeval(COCOeval):
        def computeOks(self, imgId, catId):
            ious = super().computeOks(imgId, catId)
            if isinstance(ious, np.ndarray):
                ious = np.where(np.isfinite(ious), ious, 0.0)
            return ious

    return FiniteOksCOCOeval


def coco_index_of(dataset: dict):
    """A pycocotools COCO over an already loaded annotation dict."""
    from pycocotools.coco import COCO

    coco = COCO()
    coco.dataset = dataset
    coco.createIndex()
    return coco


def evaluated_by_cocoeval(result: dict) -> bool:
    """Whether xtcocotools' COCOeval scores a result at all: it leaves out, before matching, every
    detection none of whose keypoint scores is above 0 (it stays in the results file;
    docs/mmpose-edge-cases.md §3)."""
    return any(score > 0 for score in result["keypoints"][2::3])


def score_with_cocoeval(coco, results: list[dict], sigmas: np.ndarray) -> list[float]:
    """pycocotools' COCOeval (keypoints) as xtcocotools runs it for MMPose -> the ten stats.

    Args:
        coco: the pycocotools index of the ground truth (as `read_ground_truth` reads it).
        results: COCO keypoint results (`keypoints` of len(sigmas) x 3 values); not modified.
        sigmas: the OKS sigmas, float32 as MMPose hands them to xtcocotools ((2 sigma)^2 is then
            float32 too).
    """
    return [float(value) for value in run_cocoeval(coco, results, sigmas).stats]


def run_cocoeval(coco, results: list[dict], sigmas: np.ndarray):
    """`score_with_cocoeval`'s COCOeval itself, evaluated, accumulated and summarized (its `stats`,
    and its per-image `evalImgs` for `resampled_ap`)."""
    # xtcocotools leaves these out before it matches anything; so they take no maxDets slot.
    evaluated = [r for r in results if evaluated_by_cocoeval(r)]
    with quiet_pycocotools("COCOeval"):
        # loadRes fills in area/bbox/id in place; keep the caller's list untouched.
        detections = coco.loadRes(copy.deepcopy(evaluated)) if evaluated else _no_detections(coco)
        coco_eval = _finite_oks_cocoeval()(coco, detections, iouType="keypoints")
        coco_eval.params.kpt_oks_sigmas = np.asarray(sigmas, np.float32).copy()
        coco_eval.params.useSegm = None
        coco_eval.evaluate()
        coco_eval.accumulate()
        coco_eval.summarize()
    return coco_eval


def resampled_ap(coco_eval, draws: Sequence[int]) -> float:
    """COCO keypoint AP (stats[0]) of a multiset of the evaluated images: a bootstrap resample.

    `coco_eval` is `run_cocoeval`'s result; `draws` are positions in its `params.imgIds`, repeats
    allowed. COCOeval matches detections to ground truth image by image (`evalImgs`) and only
    `accumulate` pools the images, so a resample re-pools the per-image matches it already has:
    the same AP as COCOeval on a dataset holding those images in that order (each repeat a new
    image), which tests/test_coco_evaluator_bootstrap.py checks against pycocotools. The caller's
    object is left as it is.
    """
    image_count = len(coco_eval._paramsEval.imgIds)
    draws = [int(d) for d in draws]
    if not draws or min(draws) < 0 or max(draws) >= image_count:
        raise ValueError(f"draws must be positions among the {image_count} evaluated images, got {len(draws)} "
                         f"from {min(draws, default=None)} to {max(draws, default=None)}")
    resample = copy.copy(coco_eval)
    resample.params = copy.deepcopy(coco_eval.params)
    resample._paramsEval = copy.deepcopy(coco_eval._paramsEval)
    # evalImgs is laid out category by area range by image (pycocotools' evaluate): keep the first
    # two and put the drawn images in the third, renumbered so that repeats are distinct images.
    blocks = len(coco_eval.evalImgs) // image_count
    resample.evalImgs = [coco_eval.evalImgs[block * image_count + d] for block in range(blocks) for d in draws]
    resample.params.imgIds = resample._paramsEval.imgIds = list(range(len(draws)))
    with quiet_pycocotools("COCOeval"):
        resample.accumulate()
        resample.summarize()
    return float(resample.stats[0])


def paired_bootstrap(reference_eval, other_eval, resamples: int, seed: int = 0) -> tuple[float, float]:
    """95% interval of AP(other) - AP(reference) over `resamples` draws of the images with
    replacement, the same draws for both (`run_cocoeval` / `CocoEvaluator.cocoeval` results of the
    same ground truth): the interval of the precision gates (benchmarks/precision_gate.py, the
    int8 gate of `vitpose export --precision int8`)."""
    images = len(reference_eval._paramsEval.imgIds)
    if len(other_eval._paramsEval.imgIds) != images:
        raise ValueError("the two evaluations are not of the same images")
    rng = np.random.default_rng(seed)
    differences = []
    for _ in range(resamples):
        draws = rng.integers(0, images, images)
        differences.append(resampled_ap(other_eval, draws) - resampled_ap(reference_eval, draws))
    low, high = np.percentile(differences, [2.5, 97.5])
    return float(low), float(high)


def _no_detections(coco):
    # What xtcocotools evaluates when no result has a positive keypoint score: the images and
    # categories of the ground truth and no detection (pycocotools' loadRes needs at least one).
    from pycocotools.coco import COCO

    empty = COCO()
    empty.dataset = {"images": list(coco.dataset["images"]), "annotations": [],
                     "categories": copy.deepcopy(coco.dataset["categories"])}
    empty.createIndex()
    return empty
