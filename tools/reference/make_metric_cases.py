"""Write tests/fixtures/metric_cases.json: MMPose 1.3.2's CocoMetric on edge-case predictions.

Run it in the MMPose reference environment (MMPose 1.3.2, xtcocotools, NumPy 1.x), never in
vitpose's own:

    ~/.cache/mmpose-ref-venv/bin/python tools/reference/make_metric_cases.py \
        [--ann tests/data/coco-mini/test_coco.json] [--out tests/fixtures/metric_cases.json]

Every scenario is a set of seeded synthetic top-down predictions over the coco-mini ground truth,
fed to `CocoMetric.process` exactly as MMPose's top-down estimator fills a data sample (keypoints
float64, keypoint scores float32, box and box score float32, `bbox_scales` float32), then scored
by `CocoMetric.compute_metrics` (ViTPose's settings unless a run says otherwise). The file keeps,
per run: MMPose's ten stats, the results file it wrote (as prediction indices in file order plus
each result's score), and what plain pycocotools gives on that same results file, which shows
where xtcocotools and pycocotools part. The predictions are stored as written to MMPose, so the
tests need only json and numpy.

Each scenario aims at one behaviour (see `docs/mmpose-edge-cases.md`); the script asserts that it
really separates MMPose's behaviour from the tempting alternative, so a regenerated file keeps
its power to fail.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import io
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
SEED = 20240917
K = 17
STAT_NAMES = ("AP", "AP .5", "AP .75", "AP (M)", "AP (L)", "AR", "AR .5", "AR .75", "AR (M)", "AR (L)")
VITPOSE_METRIC = {"score_mode": "bbox_keypoint", "keypoint_score_thr": 0.2, "nms_mode": "oks_nms", "nms_thr": 0.9}
F32_02 = np.float32(0.2)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ann", type=Path, default=REPO / "tests/data/coco-mini/test_coco.json",
                   help="coco-mini's test_coco.json")
    p.add_argument("--out", type=Path, default=REPO / "tests/fixtures/metric_cases.json")
    return p.parse_args()


# ------------------------------------------------------------------------------------------------
# MMPose pieces


def mmpose_imports():
    from mmpose.datasets.datasets.utils import parse_pose_metainfo
    from mmpose.datasets.transforms.topdown_transforms import TopdownAffine
    from mmpose.evaluation.functional.nms import oks_iou
    from mmpose.evaluation.metrics.coco_metric import CocoMetric
    from mmpose.structures.bbox import bbox_xyxy2cs, bbox_xyxy2xywh

    with contextlib.redirect_stderr(io.StringIO()):
        meta = parse_pose_metainfo({"from_file": "configs/_base_/datasets/coco.py"})
    return {"CocoMetric": CocoMetric, "meta": meta, "oks_iou": oks_iou, "bbox_xyxy2cs": bbox_xyxy2cs,
            "bbox_xyxy2xywh": bbox_xyxy2xywh, "fix_aspect_ratio": TopdownAffine._fix_aspect_ratio}


class Prediction:
    """One top-down instance: what MMPose's data sample holds and what the fixture stores."""

    def __init__(self, mm, pid, img_id, keypoints, scores, box_xyxy, bbox_score):
        self.id = int(pid)
        self.img_id = int(img_id)
        self.keypoints = np.asarray(keypoints, np.float64).reshape(K, 2)
        self.scores = np.asarray(scores, np.float32).reshape(K)
        self.box_xyxy = np.asarray(box_xyxy, np.float32).reshape(1, 4)
        self.bbox_score = np.float32(bbox_score)
        _, scale = mm["bbox_xyxy2cs"](self.box_xyxy, padding=1.25)
        self.bbox_scale = mm["fix_aspect_ratio"](scale, aspect_ratio=0.75)  # (1, 2) float32
        self.bbox_xywh = mm["bbox_xyxy2xywh"](self.box_xyxy)[0]
        self.area = np.prod(self.bbox_scale, axis=1)[0]  # float32, as CocoMetric.process computes it

    def sample(self, bbox_scale_dtype=np.float32):
        return {"id": self.id, "img_id": self.img_id,
                "pred_instances": {"keypoints": self.keypoints[None].copy(),
                                   "keypoint_scores": self.scores[None].copy(),
                                   "bboxes": self.box_xyxy.copy()},
                "gt_instances": {"bbox_scores": np.array([self.bbox_score], np.float32),
                                 "bbox_scales": self.bbox_scale.astype(bbox_scale_dtype)}}

    def record(self):
        return {"id": self.id, "img_id": self.img_id, "keypoints": self.keypoints.tolist(),
                "keypoint_scores": [float(s) for s in self.scores], "bbox_score": float(self.bbox_score),
                "bbox_xywh": [float(v) for v in self.bbox_xywh], "area": float(self.area)}

    def result_key(self):
        flat = np.concatenate([self.keypoints, self.scores[:, None]], axis=-1).reshape(-1)
        return (self.img_id, tuple(flat.tolist()))


def run_mmpose(mm, ann_file, predictions, metric=None, bbox_scale_dtype=np.float32):
    """CocoMetric on the predictions -> (stats dict, results list as MMPose wrote it)."""
    settings = dict(VITPOSE_METRIC, **(metric or {}))
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        prefix = str(Path(tmp) / "results")
        cocometric = mm["CocoMetric"](ann_file=str(ann_file), outfile_prefix=prefix, **settings)
        cocometric.dataset_meta = copy.deepcopy(mm["meta"])
        for pred in predictions:
            cocometric.process([], [pred.sample(bbox_scale_dtype)])
        stats = cocometric.compute_metrics(cocometric.results)
        results = json.loads(Path(prefix + ".keypoints.json").read_text())
    return {name: float(stats[name]) for name in STAT_NAMES}, results


def kept_indices(predictions, results):
    """MMPose's results file -> indices of the predictions it holds, in file order."""
    index = {}
    for i, pred in enumerate(predictions):
        key = pred.result_key()
        assert key not in index, f"predictions {index.get(key)} and {i} are identical; make them distinct"
        index[key] = i
    return [index[(r["image_id"], tuple(r["keypoints"]))] for r in results]


def plain_pycocotools(ann_file, results):
    """pycocotools' COCOeval with its defaults (float64 sigmas, no filtering) on a results list."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            gt = COCO(str(ann_file))
            ev = COCOeval(gt, gt.loadRes(copy.deepcopy(results)), iouType="keypoints")
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
    except Exception as e:  # noqa: BLE001 - the failure itself is the recorded fact
        return {"error": f"{type(e).__name__}: {e}"}
    return {name: float(v) for name, v in zip(STAT_NAMES, ev.stats)}


# ------------------------------------------------------------------------------------------------
# Ground truth and prediction makers


class Ground:
    def __init__(self, ann_file):
        self.data = json.loads(Path(ann_file).read_text())
        self.images = {img["id"]: img for img in self.data["images"]}
        self.anns = self.data["annotations"]
        self.visible = [a for a in self.anns if a["num_keypoints"] > 0]

    @staticmethod
    def xy(ann):
        return np.asarray(ann["keypoints"], np.float64).reshape(K, 3)[:, :2]

    @staticmethod
    def labelled(ann):
        return np.asarray(ann["keypoints"]).reshape(K, 3)[:, 2] > 0

    @staticmethod
    def box_xyxy(ann, shift=(0.0, 0.0)):
        x, y, w, h = ann["bbox"]
        return np.float32([x + shift[0], y + shift[1], x + w + shift[0], y + h + shift[1]])


def q(values, step=1 / 256):
    """Round to a short binary fraction, so the JSON stays small and exact."""
    return np.round(np.asarray(values, np.float64) / step) * step


class Maker:
    def __init__(self, mm, ground, rng):
        self.mm, self.ground, self.rng = mm, ground, rng
        self.next_id = 10_000_000

    def new_id(self):
        self.next_id += 1
        return self.next_id

    def near(self, ann, sigma_px, pid=None, scores=None, bbox_score=None, shift=(0.0, 0.0)):
        """A prediction of `ann` with Gaussian noise on its labelled keypoints."""
        rng = self.rng
        xy = self.ground.xy(ann).copy()
        x, y, w, h = ann["bbox"]
        unlabelled = ~self.ground.labelled(ann)
        xy[unlabelled] = rng.uniform([x, y], [x + w, y + h], (int(unlabelled.sum()), 2))
        xy = q(xy + rng.normal(0, sigma_px, xy.shape) + np.asarray(shift))
        if scores is None:
            scores = q(rng.uniform(0.3, 1.0, K), 1 / 1024)
        if bbox_score is None:
            bbox_score = q(rng.uniform(0.5, 1.0), 1 / 1024)
        return Prediction(self.mm, ann["id"] if pid is None else pid, ann["image_id"], xy, scores,
                          self.ground.box_xyxy(ann, shift), bbox_score)

    def far(self, ann, **kw):
        """A false positive: `ann`'s shape moved well away from every person in the image."""
        return self.near(ann, 2.0, pid=kw.pop("pid", None) or self.new_id(), shift=(900.0, 700.0), **kw)

    def base(self, sigma_px=3.0):
        """One true positive per GT with visible keypoints (id = the GT annotation id)."""
        return [self.near(ann, sigma_px) for ann in self.ground.visible]


# ------------------------------------------------------------------------------------------------
# Scenarios


def scenario_nonpositive(mk):
    """Detections whose keypoint scores are all <= 0: xtcocotools' COCOeval leaves them out."""
    rng = mk.rng
    preds = mk.base()
    # Three GTs get no scored prediction at all: their only prediction has scores <= 0.
    for i in (1, 4, 9):
        p = preds[i]
        preds[i] = Prediction(mk.mm, p.id, p.img_id, p.keypoints, rng.choice([0.0, -0.25, -1.0], K),
                              p.box_xyxy[0], 0.95)
    preds[4].scores[:] = 0.0  # all exactly zero
    # A near duplicate with all-zero scores and a top box score: rescoring gives it 0, so it comes
    # last; with score_mode='bbox' it leads, wins NMS and is still ignored by COCOeval.
    dup_of = mk.ground.visible[6]
    preds.append(mk.near(dup_of, 0.5, pid=mk.new_id(), scores=np.zeros(K), bbox_score=1.0))
    # One positive score is enough to be evaluated, even if rescoring gives 0 (below 0.2).
    tiny = np.full(K, -0.5)
    tiny[5] = 1 / 1024
    preds.append(mk.near(mk.ground.visible[2], 20.0, pid=mk.new_id(), scores=tiny, bbox_score=0.9))
    # False positives with nothing positive.
    for ann in mk.ground.visible[:4]:
        preds.append(mk.far(ann, scores=-rng.uniform(0, 1, K), bbox_score=0.99))
    return preds


def scenario_all_nonpositive(mk):
    rng = mk.rng
    preds = mk.base()
    for p in preds:
        p.scores[:] = np.where(rng.uniform(size=K) < 0.5, np.float32(0), -q(rng.uniform(0, 1, K), 1 / 1024))
    return preds


def scenario_threshold(mk):
    """Keypoint scores exactly float32(0.2) and its float32 neighbours decide the ranking."""
    rng = mk.rng
    below, above = np.nextafter(F32_02, np.float32(0)), np.nextafter(F32_02, np.float32(1))
    preds = []
    for n, ann in enumerate(mk.ground.visible):
        scores = np.full(K, 0.9, np.float32)
        scores[rng.permutation(K)[:10]] = F32_02  # counted by MMPose: mean (10 * 0.2 + 7 * 0.9) / 17
        if n % 3 == 1:
            scores[0] = below  # never counted
        if n % 3 == 2:
            scores[0] = above  # always counted
        preds.append(Prediction(mk.mm, ann["id"], ann["image_id"], mk.near(ann, 3.0).keypoints, scores,
                                mk.ground.box_xyxy(ann), 0.8))
        # A false positive between the two readings: 0.5 < 0.9, but > (2 + 6.3) / 17 = 0.488.
        preds.append(mk.far(ann, scores=np.full(K, 0.5), bbox_score=0.8))
    return preds


def _oks_float64_areas(g, d, a_g, a_d, sigmas):
    """MMPose's oks_iou term by term, but with the two areas added in float64."""
    variances = (sigmas * 2) ** 2
    dx = d[:, 0::3] - g[0::3]
    dy = d[:, 1::3] - g[1::3]
    e = (dx ** 2 + dy ** 2) / variances / ((np.float64(a_g) + np.asarray(a_d, np.float64)) / 2 + np.spacing(1)) / 2
    return (np.sum(np.exp(-e), axis=1) / K).astype(np.float32)


def _bisect(f, lo, hi, steps=200):
    """The t in [lo, hi] where the boolean f flips (f(lo) != f(hi))."""
    flo = f(lo)
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if f(mid) == flo:
            lo = mid
        else:
            hi = mid
    return lo, hi


def nms_boundary_pair(mk, ann, sigmas):
    """Two predictions of `ann` whose OKS sits between float32(0.9) under MMPose's float32 area sum
    and the other side of it under a float64 sum: MMPose's NMS keeps or drops the second one
    according to its own arithmetic only."""
    rng = mk.rng
    oks_iou, thr = mk.mm["oks_iou"], 0.9
    for _ in range(1000):
        first = mk.near(ann, 2.0, bbox_score=0.97)
        second = mk.near(ann, 2.0, pid=mk.new_id(), bbox_score=0.93)
        second.box_xyxy = second.box_xyxy + np.float32(q(rng.uniform(-3, 3, 4), 1 / 8))
        second = Prediction(mk.mm, second.id, second.img_id, second.keypoints, second.scores,
                            second.box_xyxy[0], second.bbox_score)
        if np.float64(np.float32(first.area + second.area)) != np.float64(first.area) + np.float64(second.area):
            break
    direction = rng.normal(0, 1, (K, 2))
    base = first.keypoints.copy()

    def flat(xy, scores):
        return np.concatenate([xy, scores[:, None]], axis=-1).reshape(-1)

    def oks(t, float64_areas):
        g = flat(base, first.scores)
        d = flat(base + t * direction, second.scores)[None]
        if float64_areas:
            return _oks_float64_areas(g, d, first.area, [second.area], sigmas)[0]
        return oks_iou(g, d, first.area, np.array([second.area]), sigmas)[0]

    def kept(t, float64_areas=False):
        return bool(oks(t, float64_areas) <= thr)

    lo32, hi32 = _bisect(kept, 0.0, 50.0)
    lo64, hi64 = _bisect(lambda t: kept(t, True), 0.0, 50.0)
    t = 0.5 * (hi32 + hi64) if hi32 < lo64 else 0.5 * (hi64 + hi32) if hi64 < lo32 else None
    assert t is not None and kept(t) != kept(t, True), "float32 and float64 area sums agree here"
    second = Prediction(mk.mm, second.id, second.img_id, base + t * direction, second.scores,
                        second.box_xyxy[0], second.bbox_score)
    return first, second, {"oks_mmpose": float(oks(t, False)), "oks_float64_areas": float(oks(t, True)),
                           "kept_by_mmpose": kept(t)}


def scenario_nms(mk, sigmas):
    """Crowds of near duplicates: OKS around 0.9, exact score ties, and one pair on the float32
    rounding boundary of the OKS-NMS threshold."""
    rng = mk.rng
    preds = mk.base(2.0)
    boundary, pairs = [], []
    for ann in mk.ground.visible[:3]:
        first, second, info = nms_boundary_pair(mk, ann, sigmas)
        preds = [p for p in preds if p.id != ann["id"]] + [first, second]
        boundary.append(info)
        pairs.append((first, second))
    # Exact score ties; at most 16 instances per image, where NumPy's quicksort is an insertion
    # sort on every version and CPU (beyond that, MMPose's own tie order depends on both).
    for ann in mk.ground.visible[3:9]:
        tie_scores = q(rng.uniform(0.4, 1.0, K), 1 / 1024)
        for sigma in (0.3, 2.5):
            preds.append(mk.near(ann, sigma, pid=mk.new_id(), scores=tie_scores, bbox_score=0.75))
    order = rng.permutation(len(preds))
    return [preds[i] for i in order], boundary, pairs


def scenario_ids(mk):
    """Ids decide the order before NMS (sorted by id) and which of two equal ids survives."""
    rng = mk.rng
    preds = []
    # Ids as a dataset numbers its boxes before a score filter: gaps, not in input order.
    numbered = rng.permutation(200)[:60]
    n = 0
    for ann in mk.ground.visible:
        tie_scores = q(rng.uniform(0.5, 1.0, K), 1 / 1024)
        for sigma in (0.3, 0.6):  # equal scores, OKS > 0.9: which one NMS keeps depends on id order
            preds.append(mk.near(ann, sigma, pid=int(numbered[n]), scores=tie_scores, bbox_score=0.8))
            n += 1
    # The same id twice in one image (as multi-GPU collection can produce): MMPose keeps the
    # first after a stable sort by id, i.e. the first one given.
    ann = mk.ground.visible[5]
    pid = int(numbered[n])
    preds.append(mk.far(ann, pid=pid, scores=np.full(K, 0.99), bbox_score=1.0))
    preds.append(mk.near(ann, 1.0, pid=pid, bbox_score=0.5))
    # The same id in two images: both stay (MMPose de-duplicates per image).
    shared = int(numbered[n + 1])
    preds.append(mk.near(mk.ground.visible[0], 4.0, pid=shared))
    preds.append(mk.near(mk.ground.visible[-1], 4.0, pid=shared))
    return [preds[i] for i in rng.permutation(len(preds))]


def sigma_boundary(mk, ann, thr, sigmas32):
    """A prediction of `ann` whose OKS with it lies between `thr` with float32 sigmas (what MMPose
    hands xtcocotools) and the other side with float64 sigmas (pycocotools' own)."""
    rng = mk.rng
    g = np.asarray(ann["keypoints"], np.float64)
    xg, yg, vg = g[0::3], g[1::3], g[2::3]
    direction = rng.normal(0, 1, (K, 2))
    start = mk.near(ann, 0.0)

    def oks(t, sigmas):
        xy = start.keypoints + t * direction
        variances = (sigmas * 2) ** 2
        e = ((xy[:, 0] - xg) ** 2 + (xy[:, 1] - yg) ** 2) / variances / (ann["area"] + np.spacing(1)) / 2
        e = e[vg > 0]
        return np.sum(np.exp(-e)) / e.shape[0]

    from pycocotools.cocoeval import Params

    sigmas64 = Params(iouType="keypoints").kpt_oks_sigmas  # pycocotools' own (float64)

    def matched(t, sigmas):
        return bool(oks(t, sigmas) >= thr)

    lo32, hi32 = _bisect(lambda t: matched(t, sigmas32), 0.0, 200.0)
    lo64, hi64 = _bisect(lambda t: matched(t, sigmas64), 0.0, 200.0)
    t = 0.5 * (hi32 + hi64) if hi32 < lo64 else 0.5 * (hi64 + hi32) if hi64 < lo32 else None
    assert t is not None and matched(t, sigmas32) != matched(t, sigmas64), "sigma precision does not matter here"
    pred = Prediction(mk.mm, ann["id"], ann["image_id"], start.keypoints + t * direction, start.scores,
                      start.box_xyxy[0], start.bbox_score)
    return pred, {"threshold": thr, "oks_float32_sigmas": float(oks(t, sigmas32)),
                  "oks_float64_sigmas": float(oks(t, sigmas64))}


def scenario_sigmas(mk, sigmas32):
    preds = mk.base(3.0)
    info = []
    iou_thrs = np.linspace(0.5, 0.95, 10)
    for index, thr in ((0, iou_thrs[5]), (3, iou_thrs[0]), (7, iou_thrs[8])):
        ann = mk.ground.visible[index]
        pred, facts = sigma_boundary(mk, ann, float(thr), sigmas32)
        preds = [pred if p.id == ann["id"] else p for p in preds]
        info.append(facts)
    return preds, info


def scenario_gt_variants(mk):
    preds = mk.base(3.0)
    hidden = next(a for a in mk.ground.anns if a["num_keypoints"] == 0)
    preds.append(mk.near(hidden, 1.0, bbox_score=0.9))  # matches only a GT with no visible keypoint
    return preds


def annotation_patches(ground):
    """Changes to coco-mini's annotations (by position): COCOeval variants part here."""
    index = {a["id"]: i for i, a in enumerate(ground.anns)}
    visible = [index[a["id"]] for a in ground.visible]
    hidden = [i for i, a in enumerate(ground.anns) if a["num_keypoints"] == 0]
    return {
        # pycocotools ignores a GT by its num_keypoints field, xtcocotools by counting visible keypoints.
        "num_keypoints_disagree": {"set": [[visible[0], "num_keypoints", 0], [hidden[0], "num_keypoints", 3]]},
        # pycocotools treats a match to annotation id 0 as no match; xtcocotools does not.
        "annotation_id_zero": {"set": [[visible[2], "id", 0]]},
        # xtcocotools' COCO fills a missing iscrowd with False; pycocotools needs the field.
        "iscrowd_missing": {"delete": [[i, "iscrowd"] for i in range(len(ground.anns))]},
    }


def apply_patch(data, patch):
    data = copy.deepcopy(data)
    for i, field, value in patch.get("set", []):
        data["annotations"][i][field] = value
    for i, field in patch.get("delete", []):
        del data["annotations"][i][field]
    return data


# ------------------------------------------------------------------------------------------------


def oks_cases(mk, sigmas, pairs):
    """MMPose's oks_iou on random instances (float64 keypoints, float32 areas) and the boundary pairs."""
    rng = mk.rng
    cases = []
    for n in (1, 6, 40):
        kpts = q(rng.uniform(0, 400, (n + 1, K, 2)) if n < 40 else
                 rng.normal(200, 30, (1, K, 2)) + rng.normal(0, 2, (n + 1, K, 2)), 1 / 64)
        areas = np.float32(q(rng.uniform(2e3, 6e4, n + 1), 1 / 16))
        cases.append((kpts, areas))
    for first, second in pairs:
        cases.append((np.stack([first.keypoints, second.keypoints]), np.float32([first.area, second.area])))
    out = []
    for kpts, areas in cases:
        flat = np.concatenate([kpts, np.ones(kpts.shape[:2] + (1,))], axis=-1).reshape(len(kpts), -1)
        ious = mk.mm["oks_iou"](flat[0], flat[1:], areas[0], areas[1:], sigmas)
        out.append({"keypoints": kpts.tolist(), "areas": [float(a) for a in areas],
                    "ious_first_vs_rest": [float(v) for v in ious]})
    return out


def empty_annotation_facts(mm, ground, preds, tmp):
    """What MMPose does with an annotation file without annotations (recorded, not compared)."""
    facts = {}
    for name, change in (("missing_key", lambda d: d.pop("annotations")),
                         ("empty_list", lambda d: d.__setitem__("annotations", []))):
        data = copy.deepcopy(ground.data)
        change(data)
        path = Path(tmp) / f"{name}.json"
        path.write_text(json.dumps(data))
        try:
            stats, _ = run_mmpose(mm, path, preds)
            facts[name] = {"stats": stats}
        except AssertionError as e:
            facts[name] = {"error": f"AssertionError: {e}"}
    return facts


def versions():
    from importlib.metadata import version

    packages = ("mmpose", "mmengine", "xtcocotools", "pycocotools")
    return {"python": sys.version.split()[0], "numpy": np.__version__, **{name: version(name) for name in packages}}


def main():
    args = parse_args()
    mm = mmpose_imports()
    ground = Ground(args.ann)
    sigmas = mm["meta"]["sigmas"]
    assert sigmas.dtype == np.float32
    mk = Maker(mm, ground, np.random.default_rng(SEED))
    patches = annotation_patches(ground)

    scenarios = []

    def add(name, about, preds, runs, facts=None):
        entry = {"name": name, "about": about, "predictions": [p.record() for p in preds], "runs": []}
        for run in runs:
            ann_file = args.ann
            with tempfile.TemporaryDirectory() as tmp:
                if run.get("annotation_patch"):
                    ann_file = Path(tmp) / "patched.json"
                    ann_file.write_text(json.dumps(apply_patch(ground.data, patches[run["annotation_patch"]])))
                stats, results = run_mmpose(mm, ann_file, preds, run.get("metric"))
                plain = plain_pycocotools(ann_file, results)
            entry["runs"].append({
                "metric": dict(VITPOSE_METRIC, **run.get("metric", {})),
                "annotation_patch": run.get("annotation_patch"),
                "mmpose": {"stats": stats, "kept": kept_indices(preds, results),
                           "scores": [r["score"] for r in results]},
                "plain_pycocotools_on_mmpose_results": plain,
            })
        if facts:
            entry["facts"] = facts
        scenarios.append(entry)
        return entry

    # 1. Nothing positive among the keypoint scores.
    preds = scenario_nonpositive(mk)
    e = add("nonpositive_scores", "all keypoint scores <= 0 on some detections: in the results file, not evaluated",
            preds, [{}, {"metric": {"score_mode": "bbox"}}, {"metric": {"nms_mode": "none"}}])
    for run in e["runs"]:
        assert run["plain_pycocotools_on_mmpose_results"] != run["mmpose"]["stats"], run["metric"]
    preds = scenario_all_nonpositive(mk)
    e = add("all_nonpositive_scores", "every detection has keypoint scores <= 0: COCOeval sees none", preds, [{}])
    assert e["runs"][0]["plain_pycocotools_on_mmpose_results"] != e["runs"][0]["mmpose"]["stats"]

    # 2. The 0.2 threshold against float32 scores.
    preds = scenario_threshold(mk)
    e = add("threshold_float32_0.2", "scores exactly float32(0.2) count as above 0.2 (float64 comparison)",
            preds, [{}])
    contrast, _ = run_mmpose(mm, args.ann, preds, {"keypoint_score_thr": F32_02})
    assert contrast != e["runs"][0]["mmpose"]["stats"], "a float32 comparison would give the same stats"
    e["facts"] = {"stats_if_compared_in_float32": contrast}

    # 4. NMS: boundary pairs, ties, crowds.
    preds, boundary, pairs = scenario_nms(mk, sigmas)
    e = add("nms_crowds", "near duplicates, exact score ties, OKS on the float32 threshold boundary", preds,
            [{}, {"metric": {"nms_mode": "soft_oks_nms"}}, {"metric": {"nms_mode": "none"}},
             {"metric": {"score_mode": "bbox"}}])
    _, contrast_results = run_mmpose(mm, args.ann, preds, bbox_scale_dtype=np.float64)
    assert kept_indices(preds, contrast_results) != e["runs"][0]["mmpose"]["kept"], "float64 areas keep the same"
    e["facts"] = {"boundary_pairs": boundary}

    # 5. Ids.
    preds = scenario_ids(mk)
    e = add("ids", "ids with gaps in random order, ties, a repeated id in one image and across images", preds, [{}])
    renumbered = [Prediction(mm, i, p.img_id, p.keypoints, p.scores, p.box_xyxy[0], p.bbox_score)
                  for i, p in enumerate(preds)]
    _, contrast_results = run_mmpose(mm, args.ann, renumbered)
    assert kept_indices(renumbered, contrast_results) != e["runs"][0]["mmpose"]["kept"], "ids do not matter here"

    # 6. Sigma precision in COCOeval.
    preds, facts = scenario_sigmas(mk, sigmas)
    e = add("sigmas_float32", "OKS with a GT on an IoU threshold: float32 sigmas (MMPose) vs float64", preds,
            [{}], {"boundaries": facts})
    assert e["runs"][0]["plain_pycocotools_on_mmpose_results"] != e["runs"][0]["mmpose"]["stats"]

    # 7. Ground-truth files that pycocotools and xtcocotools read differently.
    preds = scenario_gt_variants(mk)
    e = add("annotation_variants", "GT num_keypoints disagreeing with the keypoints, annotation id 0, no iscrowd",
            preds, [{"annotation_patch": name} for name in patches])
    for run in e["runs"]:
        assert run["plain_pycocotools_on_mmpose_results"] != run["mmpose"]["stats"], run["annotation_patch"]

    with tempfile.TemporaryDirectory() as tmp:
        empty = empty_annotation_facts(mm, ground, mk.base(), tmp)

    out = {
        "info": {
            "about": "MMPose 1.3.2 CocoMetric (xtcocotools COCOeval) on edge-case predictions over coco-mini; "
                     "written by tools/reference/make_metric_cases.py",
            "seed": SEED, "versions": versions(),
            "annotation_file": args.ann.name,
            "annotation_md5": hashlib.md5(args.ann.read_bytes()).hexdigest(),
            "prediction_fields": "id, img_id, keypoints (17x2 image px, float64), keypoint_scores (float32 "
                                 "values), bbox_score (float32 value), bbox_xywh (float32 values, the box MMPose "
                                 "writes as 'bbox'), area (float32 product of the aspect-fixed box scale)",
            "run_fields": "mmpose.kept: prediction indices in the order of MMPose's results file; "
                          "mmpose.scores: their scores as written",
        },
        "annotation_patches": patches,
        "scenarios": scenarios,
        "oks_iou": oks_cases(mk, sigmas, pairs),
        "empty_annotations": empty,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes, {len(scenarios)} scenarios)")


if __name__ == "__main__":
    main()
