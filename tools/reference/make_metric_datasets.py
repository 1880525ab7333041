"""Write tests/fixtures/metric_datasets.json: MMPose 1.3.2's metrics on AIC, AP-10K, COCO-WholeBody, MPII.

Run it in the MMPose reference environment (MMPose 1.3.2, xtcocotools, scipy, NumPy 1.x), never
in vitpose's own:

    ~/.cache/mmpose-ref-venv/bin/python tools/reference/make_metric_datasets.py

The ground truth is MMPose v1.3.2's own test data (copied to tests/data/<name>/, see the README
there). For each dataset, seeded synthetic top-down predictions (the GT plus noise, near
duplicates, false positives, misses, detections with no positive keypoint score) are fed to the
metric that MMPose's configs use for it, exactly as MMPose's top-down estimator fills a data
sample, and the fixture keeps the predictions (in the form `vitpose.evaluation` takes) next to
MMPose's numbers:

- aic: `CocoMetric(use_area=False)` with aic.py's sigmas (its files have no `area`);
- ap10k: `CocoMetric` with ap10k.py's sigmas, each prediction with its `category_id`
  (one category per animal family);
- coco_wholebody: `CocoWholeBodyMetric`; besides the whole-body stats it returns, the stats of the
  five per-part COCOeval runs it prints (body, foot, face, left hand, right hand) are recorded;
- mpii: `MpiiDataset(headbox_file=...)` reads the head boxes (scipy.io.loadmat, as MMPose does)
  and `MpiiPCKAccuracy` scores. MMPose's test data has no `mpii_gt_val.mat`, so this script writes
  a small one (tests/data/mpii/test_mpii_headboxes.mat, MPII's `headboxes_src` layout (2, 2, N))
  with boxes around each person's head joints, and a second one in which one box has zero size;
- matfiles: two small MAT-files written by scipy.io.savemat (plain and compressed, numeric arrays of
  several classes next to a string and a struct) and what scipy.io.loadmat reads from them, for the
  project's own MAT-file reader.

The script asserts that each scenario is not trivial (stats strictly between their extremes where
that is expected, parts that differ), so a regenerated file keeps its power to fail.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
# mmcompat.py (the import shim of the reference venv) lives beside this script (tools/reference/README.md).
MMPOSE_REF = Path(os.environ.get("VITPOSE_MMPOSE_REF", Path(__file__).resolve().parent))
DATA = REPO / "tests" / "data"
SEED = 20250611
STAT_NAMES = ("AP", "AP .5", "AP .75", "AP (M)", "AP (L)", "AR", "AR .5", "AR .75", "AR (M)", "AR (L)")
VITPOSE_METRIC = {"score_mode": "bbox_keypoint", "keypoint_score_thr": 0.2, "nms_mode": "oks_nms", "nms_thr": 0.9}
# COCO-WholeBody's parts: (name, GT/results field, first keypoint, end) in the 133-keypoint order.
WHOLEBODY_PARTS = (("body", "keypoints", 0, 17), ("foot", "foot_kpts", 17, 23), ("face", "face_kpts", 23, 91),
                   ("lefthand", "lefthand_kpts", 91, 112), ("righthand", "righthand_kpts", 112, 133))
XTCOCO_PART_TYPES = {"keypoints_body": "body", "keypoints_foot": "foot", "keypoints_face": "face",
                     "keypoints_lefthand": "lefthand", "keypoints_righthand": "righthand",
                     "keypoints_wholebody": "wholebody"}
MPII_STAT_NAMES = {"Head PCK": "Head", "Shoulder PCK": "Shoulder", "Elbow PCK": "Elbow", "Wrist PCK": "Wrist",
                   "Hip PCK": "Hip", "Knee PCK": "Knee", "Ankle PCK": "Ankle", "PCK": "PCKh", "PCK@0.1": "PCKh@0.1"}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "tests/fixtures/metric_datasets.json")
    return p.parse_args()


def mmpose_imports():
    sys.path.insert(0, str(MMPOSE_REF))
    import mmcompat  # noqa: F401  (must precede mmpose)
    from mmpose.datasets.datasets.utils import parse_pose_metainfo
    from mmpose.datasets.transforms.topdown_transforms import TopdownAffine
    from mmpose.structures.bbox import bbox_xyxy2cs

    def meta(name):
        with contextlib.redirect_stderr(io.StringIO()):
            return parse_pose_metainfo({"from_file": f"configs/_base_/datasets/{name}.py"})

    return {"meta": meta, "bbox_xyxy2cs": bbox_xyxy2cs, "fix_aspect_ratio": TopdownAffine._fix_aspect_ratio}


def q(values, step=1 / 64):
    """Round to a short binary fraction, so the JSON stays small and exact."""
    return np.round(np.asarray(values, np.float64) / step) * step


# ------------------------------------------------------------------------------------------------
# Top-down predictions (COCO-style datasets)


class Prediction:
    """One top-down instance: what MMPose's data sample holds and what the fixture stores."""

    def __init__(self, mm, pid, img_id, category_id, keypoints, scores, box_xyxy, bbox_score):
        self.id, self.img_id, self.category_id = int(pid), int(img_id), int(category_id)
        self.keypoints = np.asarray(keypoints, np.float64)
        self.scores = np.asarray(scores, np.float32)
        self.box_xyxy = np.asarray(box_xyxy, np.float32).reshape(1, 4)
        self.bbox_score = np.float32(bbox_score)
        _, scale = mm["bbox_xyxy2cs"](self.box_xyxy, padding=1.25)
        self.bbox_scale = mm["fix_aspect_ratio"](scale, aspect_ratio=0.75)  # (1, 2) float32
        self.area = np.prod(self.bbox_scale, axis=1)[0]  # float32, as CocoMetric.process computes it

    def sample(self):
        return {"id": self.id, "img_id": self.img_id, "category_id": self.category_id,
                "pred_instances": {"keypoints": self.keypoints[None].copy(),
                                   "keypoint_scores": self.scores[None].copy(),
                                   "bboxes": self.box_xyxy.copy()},
                "gt_instances": {"bbox_scores": np.array([self.bbox_score], np.float32),
                                 "bbox_scales": self.bbox_scale.copy()}}

    def record(self):
        """The prediction as `vitpose.evaluation` takes it (bbox as x, y, w, h)."""
        x1, y1, x2, y2 = (float(v) for v in self.box_xyxy[0])
        return {"id": self.id, "image_id": self.img_id, "category_id": self.category_id,
                "keypoints": self.keypoints.tolist(), "keypoint_scores": [float(s) for s in self.scores],
                "bbox_score": float(self.bbox_score), "area": float(self.area),
                "bbox": [x1, y1, float(np.float32(x2) - np.float32(x1)), float(np.float32(y2) - np.float32(y1))]}


class Ground:
    """A COCO-style annotation file; `xyv(ann)` gives the K x 3 keypoints (all parts for whole-body)."""

    def __init__(self, path, fields=("keypoints",)):
        self.path = Path(path)
        self.data = json.loads(self.path.read_text())
        self.fields = fields
        self.anns = self.data["annotations"]
        self.labelled_anns = [a for a in self.anns if (self.xyv(a)[:, 2] > 0).any()]

    def xyv(self, ann):
        return np.concatenate([np.asarray(ann[f], np.float64).reshape(-1, 3) for f in self.fields])


class Maker:
    def __init__(self, mm, ground, rng):
        self.mm, self.ground, self.rng = mm, ground, rng
        self.next_id = 10_000_000
        self.num_keypoints = len(ground.xyv(ground.anns[0]))

    def new_id(self):
        self.next_id += 1
        return self.next_id

    def near(self, ann, rel_sigma, pid=None, scores=None, bbox_score=None, shift=(0.0, 0.0), sigma_scale=None,
             category_id=None):
        """A prediction of `ann`: its labelled keypoints plus Gaussian noise of rel_sigma x the box size."""
        rng, k = self.rng, self.num_keypoints
        xyv = self.ground.xyv(ann)
        x, y, w, h = (float(v) for v in ann["bbox"])
        xy = xyv[:, :2].copy()
        unlabelled = xyv[:, 2] <= 0
        xy[unlabelled] = rng.uniform([x, y], [x + w, y + h], (int(unlabelled.sum()), 2))
        sigma = rel_sigma * np.sqrt(max(w * h, 1.0)) * (np.ones(k) if sigma_scale is None else sigma_scale)
        xy = q(xy + rng.normal(0, 1, xy.shape) * sigma[:, None] + np.asarray(shift))
        if scores is None:
            scores = q(rng.uniform(0.3, 1.0, k), 1 / 1024)
        if bbox_score is None:
            bbox_score = q(rng.uniform(0.5, 1.0), 1 / 1024)
        box = np.float32([x + shift[0], y + shift[1], x + w + shift[0], y + h + shift[1]])
        return Prediction(self.mm, ann["id"] if pid is None else pid, ann["image_id"],
                          ann["category_id"] if category_id is None else category_id, xy, scores, box, bbox_score)

    def far(self, ann, **kw):
        """A false positive: `ann`'s shape moved away from every instance of its image."""
        return self.near(ann, 0.02, pid=kw.pop("pid", None) or self.new_id(), shift=(700.0, 500.0), **kw)


def scenario_mixed(mk, rel_sigma, sigma_scale=None):
    """One prediction per labelled GT (noise rel_sigma), near duplicates, false positives, one miss,
    one detection with no positive keypoint score."""
    rng, k = mk.rng, mk.num_keypoints
    anns = mk.ground.labelled_anns
    preds = [mk.near(a, rel_sigma, sigma_scale=sigma_scale) for a in anns[1:]]  # anns[0] is missed
    for a in anns[1::3]:  # near duplicates: NMS decides
        preds.append(mk.near(a, rel_sigma * 0.2, pid=mk.new_id(), bbox_score=0.6, sigma_scale=sigma_scale))
    for a in anns[::4]:
        preds.append(mk.far(a, bbox_score=q(rng.uniform(0.5, 1.0), 1 / 1024)))
    zero = mk.near(anns[-1], rel_sigma, pid=mk.new_id(), scores=-q(rng.uniform(0, 1, k), 1 / 1024), bbox_score=1.0)
    preds.append(zero)
    return [preds[i] for i in rng.permutation(len(preds))]


def scenario_wholebody_parts(mk):
    """Whole-body predictions whose parts are predicted with different accuracy, and some whose
    hand or face scores are all <= 0 (xtcocotools then leaves them out of that part only)."""
    rng = mk.rng
    scale = np.ones(133)
    scale[17:23], scale[23:91], scale[91:133] = 1.5, 0.25, 0.6
    preds = scenario_mixed(mk, 0.05, sigma_scale=scale)
    for p in preds[::3]:
        part = rng.choice([(91, 112), (112, 133), (23, 91)])
        p.scores[part[0]:part[1]] = np.float32(0.0)
    return preds


def scenario_ap10k_categories(mk):
    """AP-10K: noise, and a correct pose labelled with the wrong animal family (a false positive
    in that family, a miss in its own)."""
    preds = scenario_mixed(mk, 0.04)
    anns = mk.ground.labelled_anns
    own = anns[-1]["category_id"]
    other = next(a["category_id"] for a in anns if a["category_id"] != own)
    preds.append(mk.near(anns[-1], 0.01, pid=mk.new_id(), bbox_score=0.99, category_id=other))
    return preds


# ------------------------------------------------------------------------------------------------
# MMPose runs


class StatsRecorder:
    """Wraps xtcocotools' COCOeval to keep the stats of every run (CocoWholeBodyMetric returns
    only the last, whole-body one, and prints the per-part ones)."""

    def __init__(self):
        from xtcocotools.cocoeval import COCOeval

        self.stats = {}
        recorder = self

        class RecordingCOCOeval(COCOeval):
            def summarize(self):
                super().summarize()
                recorder.stats[self.params.iouType] = [float(v) for v in self.stats]

        self.cls = RecordingCOCOeval


def run_coco_metric(mm, dataset, ann_file, predictions, use_area):
    """CocoMetric (or CocoWholeBodyMetric) on the predictions -> {stat name: value} (per part for
    whole-body)."""
    from mmpose.evaluation.metrics import coco_wholebody_metric
    from mmpose.evaluation.metrics.coco_metric import CocoMetric
    from mmpose.evaluation.metrics.coco_wholebody_metric import CocoWholeBodyMetric

    recorder = StatsRecorder()
    wholebody = dataset == "coco_wholebody"
    metric_cls = CocoWholeBodyMetric if wholebody else CocoMetric
    original = coco_wholebody_metric.COCOeval
    coco_wholebody_metric.COCOeval = recorder.cls
    try:
        with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
            metric = metric_cls(ann_file=str(ann_file), outfile_prefix=str(Path(tmp) / "results"),
                                use_area=use_area, **VITPOSE_METRIC)
            metric.dataset_meta = copy.deepcopy(mm["meta"](dataset))
            for pred in predictions:
                metric.process([], [pred.sample()])
            stats = metric.compute_metrics(metric.results)
    finally:
        coco_wholebody_metric.COCOeval = original
    out = {name: float(stats[name]) for name in STAT_NAMES}
    if wholebody:
        parts = {XTCOCO_PART_TYPES[t]: dict(zip(STAT_NAMES, v)) for t, v in recorder.stats.items()}
        assert parts["wholebody"] == out, "the whole-body run is the one CocoWholeBodyMetric returns"
        for part, values in parts.items():
            if part != "wholebody":
                out.update({f"{part} {name}": value for name, value in values.items()})
    return out


def check_not_trivial(stats, names=("AP", "AR")):
    for name in names:
        assert 0.05 < stats[name] < 0.999, f"{name} = {stats[name]}: the scenario is trivial"


# ------------------------------------------------------------------------------------------------
# MPII


def write_headboxes(ann, path, zero_box_index=None):
    """MPII's `headboxes_src` (2, 2, N): per person the corners (x1, y1), (x2, y2) of a box around
    the head (joints 8 upper neck and 9 head top, 1-based pixels as in MPII), written like
    mpii_gt_val.mat."""
    from scipy.io import savemat

    boxes = np.zeros((2, 2, len(ann)))
    for i, record in enumerate(ann):
        joints = np.asarray(record["joints"], np.float64)
        neck, top = joints[8], joints[9]
        centre, length = (neck + top) / 2, np.linalg.norm(top - neck)
        half = 0.5 * length * np.array([0.8, 1.1])
        boxes[0, :, i] = np.round(centre - half, 1)
        boxes[1, :, i] = np.round(centre + half, 1)
    if zero_box_index is not None:
        boxes[1, :, zero_box_index] = boxes[0, :, zero_box_index]
    savemat(str(path), {"headboxes_src": boxes}, do_compression=True)
    return boxes


def mpii_instances(ann_file, headbox_file):
    from mmpose.datasets.datasets.body.mpii_dataset import MpiiDataset

    with contextlib.redirect_stdout(io.StringIO()):
        ds = MpiiDataset(ann_file=str(ann_file), headbox_file=str(headbox_file), test_mode=True,
                         data_mode="topdown", data_prefix=dict(img=""), pipeline=[])
    return [ds.get_data_info(i) for i in range(len(ds))]


def mpii_predictions(instances, rng, rel_sigma):
    """(N, 16, 2) 0-based image px: the GT (1-based) minus 1 plus noise scaled by the head size;
    some joints far off."""
    preds = []
    for inst in instances:
        gt = inst["keypoints"][0].astype(np.float64) - 1.0
        head = float(inst["head_size"].reshape(-1)[0]) or 50.0
        xy = gt + rng.normal(0, rel_sigma * head, gt.shape)
        far = rng.uniform(size=16) < 0.1
        xy[far] += rng.uniform(-3, 3, (int(far.sum()), 2)) * head
        preds.append(q(xy))
    return np.stack(preds)


def run_mpii(instances, predictions):
    from mmpose.evaluation.metrics import MpiiPCKAccuracy

    metric = MpiiPCKAccuracy(thr=0.5, norm_item="head")
    metric.dataset_meta = {}
    for inst, pred in zip(instances, predictions):
        metric.process([], [{"pred_instances": {"keypoints": pred[None]},
                             "gt_instances": {"keypoints": inst["keypoints"],
                                              "keypoints_visible": inst["keypoints_visible"],
                                              "head_size": inst["head_size"]}}])
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        stats = metric.compute_metrics(metric.results)
    return {MPII_STAT_NAMES[name]: float(value) for name, value in stats.items()}


def make_mpii(rng):
    ann_file = DATA / "mpii" / "test_mpii.json"
    ann = json.loads(ann_file.read_text())
    headbox_files = {"test_mpii_headboxes.mat": None, "test_mpii_headboxes_zero.mat": 2}
    cases = []
    for name, zero in headbox_files.items():
        write_headboxes(ann, DATA / "mpii" / name, zero_box_index=zero)
        instances = mpii_instances(ann_file, DATA / "mpii" / name)
        for rel_sigma in (0.15, 0.4):
            preds = mpii_predictions(instances, rng, rel_sigma)
            stats = run_mpii(instances, preds)
            assert 0 < stats["PCKh"] < 100 and stats["PCKh@0.1"] < stats["PCKh"], stats
            cases.append({"headbox_file": f"tests/data/mpii/{name}", "rel_sigma": rel_sigma,
                          "head_sizes": [float(i["head_size"].reshape(-1)[0]) for i in instances],
                          "predictions": [{"id": int(inst["id"]), "image_id": int(inst["img_id"]),
                                           "keypoints": p.tolist()} for inst, p in zip(instances, preds)],
                          "mmpose": stats})
    return {"ann_file": "tests/data/mpii/test_mpii.json", "metric": "MpiiPCKAccuracy(thr=0.5, norm_item='head')",
            "cases": cases}


def make_matfiles():
    """Two MAT-files as scipy writes them, and the numeric arrays scipy reads back."""
    from scipy.io import loadmat, savemat

    variables = {"double3d": np.arange(24.0).reshape(2, 3, 4) / 7, "uint16": np.uint16([[1, 2, 3], [4, 5, 65535]]),
                 "int32": np.int32(-5), "single": np.float32([1.5, -2.25]), "int8": np.int8([[-128], [127]]),
                 "text": "not numeric", "struct": {"a": 1.0}}
    out = {}
    for name, compress in (("matfile_v5.mat", False), ("matfile_v5_compressed.mat", True)):
        path = REPO / "tests" / "fixtures" / name
        savemat(str(path), variables, do_compression=compress)
        read = {k: v for k, v in loadmat(str(path)).items() if not k.startswith("__")}
        out[name] = {k: {"dtype": str(v.dtype.newbyteorder("=")), "shape": list(v.shape), "values": v.ravel(order="F").tolist()}
                     for k, v in read.items() if v.dtype.kind in "fiu"}
        assert set(out[name]) == {"double3d", "uint16", "int32", "single", "int8"}
    return out


# ------------------------------------------------------------------------------------------------


def make_coco_style(mm, dataset, ann_file, use_area, scenarios, rng, fields=("keypoints",)):
    ground = Ground(ann_file, fields)
    mk = Maker(mm, ground, rng)
    sigmas = mm["meta"](dataset)["sigmas"]
    assert sigmas.dtype == np.float32 and len(sigmas) == mk.num_keypoints
    out = {"ann_file": str(Path(ann_file).relative_to(REPO)), "use_area": use_area,
           "sigmas": [float(s) for s in sigmas], "metric": dict(VITPOSE_METRIC), "scenarios": []}
    for name, about, make in scenarios:
        preds = make(mk)
        stats = run_coco_metric(mm, dataset, ann_file, preds, use_area)
        check_not_trivial(stats)
        out["scenarios"].append({"name": name, "about": about, "predictions": [p.record() for p in preds],
                                 "mmpose": stats})
    return out


def versions():
    from importlib.metadata import version

    packages = ("mmpose", "mmengine", "xtcocotools", "scipy")
    return {"python": sys.version.split()[0], "numpy": np.__version__, **{name: version(name) for name in packages}}


def main():
    args = parse_args()
    mm = mmpose_imports()
    rng = np.random.default_rng(SEED)
    datasets = {}
    datasets["aic"] = make_coco_style(
        mm, "aic", DATA / "aic" / "test_aic.json", False,
        [("noise_0.006", "noise 0.006 x sqrt(box area) (AIC's sigmas are small), duplicates, false positives, "
                         "a miss", lambda mk: scenario_mixed(mk, 0.006)),
         ("noise_0.015", "noise 0.015 x sqrt(box area)", lambda mk: scenario_mixed(mk, 0.015))], rng)
    datasets["ap10k"] = make_coco_style(
        mm, "ap10k", DATA / "ap10k" / "test_ap10k.json", True,
        [("noise_0.02", "noise 0.02 x sqrt(box area), duplicates, false positives, a miss", lambda mk: scenario_mixed(mk, 0.02)),
         ("categories", "noise 0.04 and a pose labelled with another animal family", scenario_ap10k_categories)], rng)
    wb = make_coco_style(
        mm, "coco_wholebody", DATA / "coco_wholebody" / "test_coco_wholebody.json", True,
        [("parts", "per-part noise (feet 1.5x, face 0.25x, hands 0.6x of 0.05 x sqrt(box area)); some "
                   "parts with no positive score", scenario_wholebody_parts),
         ("noise_0.02", "noise 0.02 x sqrt(box area) on every keypoint", lambda mk: scenario_mixed(mk, 0.02))],
        rng, fields=tuple(f for _, f, _, _ in WHOLEBODY_PARTS))
    for scenario in wb["scenarios"]:
        parts = [scenario["mmpose"][f"{p} AP"] for p, *_ in WHOLEBODY_PARTS]
        assert len(set(parts)) == len(parts), f"parts agree: {parts}"
    datasets["coco_wholebody"] = wb
    datasets["mpii"] = make_mpii(rng)
    datasets["mpii"]["matfiles"] = make_matfiles()

    md5 = {str(p.relative_to(REPO)): hashlib.md5(p.read_bytes()).hexdigest()
           for p in sorted(DATA.glob("*/*")) if p.suffix in (".json", ".mat")}
    out = {"info": {"about": "MMPose 1.3.2 metrics on its own test data with seeded synthetic predictions; "
                             "written by tools/reference/make_metric_datasets.py",
                    "seed": SEED, "versions": versions(), "data_md5": md5,
                    "prediction_fields": "id, image_id, category_id, keypoints (K x 2 image px), keypoint_scores, "
                                         "bbox_score, area (float32 product of the aspect-fixed box scale), "
                                         "bbox (x, y, w, h); MPII: id (MMPose's instance index), image_id, "
                                         "keypoints (16 x 2, 0-based image px)"},
           "datasets": datasets}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
