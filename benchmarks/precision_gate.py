"""The accuracy gate of reduced precision: a trained model's AP and keypoints at fp32 and at bf16 / fp16.

    python benchmarks/precision_gate.py --config configs/demo.yaml --checkpoint work_dirs/demo/best.pth
    python benchmarks/precision_gate.py ... --precisions bf16 fp16 --repeats 3

Both runs see the same crops (the config's validation set: its detection file, or GT boxes), with
the flip test, through `vitpose.engine.evaluate.predict` and the config's COCO evaluator (rescoring,
OKS-NMS, COCOeval): the path of `evaluate.py`. The only difference is the autocast dtype.

Gate: |AP(reduced) - AP(fp32)| <= 0.002, the most a precision may change the published AP by. `--bootstrap N` adds the difference's paired
bootstrap 95% interval over images (the same N resamples of the validation images for both runs,
`vitpose.evaluation.coco_evaluator.resampled_ap`): it says whether the set has the images to decide
a 0.002 gate at all. A set whose interval is wider than twice the gate (half-width > 0.002) cannot
tell a precision that passes from one that fails; a precision's place in `AUTO_PRECISIONS` is
decided on sets that can. (The half-width, not the distance from the estimate to either end: AP is
not linear in the images, so the resamples' differences need not centre on the whole set's.)

Also reported: the distance in image pixels between the two runs' keypoints, over the keypoints that fp32 scores above 0.3 (the usual display
threshold: the ones anyone looks at), as median / 99th percentile / max. A precision that fails
the gate is not one that `precision="auto"` may pick (`vitpose.device.AUTO_PRECISIONS`); the
tests in tests/test_precision.py run this gate.

`--repeats N` also times the prediction loop (crops/s), alternating fp32 and the reduced
precisions in rounds after a warm-up, and prints the median and the spread of each.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rounds import alternate, load_note, spread, warm_up  # noqa: E402

from vitpose.device import PRECISIONS, precision_name, resolve_precision  # noqa: E402
from vitpose.engine.evaluate import predict  # noqa: E402
from vitpose.evaluation.coco_evaluator import paired_bootstrap, resampled_ap  # noqa: E402,F401

MAX_AP_DIFFERENCE = 0.002  # the most AP a reduced precision may cost (or gain)
CONFIDENT_SCORE = 0.3  # keypoints scored above this (by fp32) are compared in pixels


@dataclass
class GateResult:
    precision: str
    ap_fp32: float
    ap: float
    confident_keypoints: int
    median_px: float
    p99_px: float
    max_px: float
    interval: tuple[float, float] | None = None  # paired bootstrap 95% interval of ap_difference

    @property
    def resolves_gate(self) -> bool | None:
        """Whether the set is large enough to decide the gate: the interval's half-width at most the
        gate (None without a bootstrap)."""
        if self.interval is None:
            return None
        low, high = self.interval
        return (high - low) / 2 <= MAX_AP_DIFFERENCE

    @property
    def ap_difference(self) -> float:
        return self.ap - self.ap_fp32

    @property
    def passed(self) -> bool:
        return abs(self.ap_difference) <= MAX_AP_DIFFERENCE

    def line(self) -> str:
        interval = "" if self.interval is None else (
            f", 95% interval [{self.interval[0]:+.4f}, {self.interval[1]:+.4f}]: this set "
            f"{'resolves' if self.resolves_gate else 'cannot resolve'} the gate")
        return (f"{self.precision}: AP {self.ap:.4f} vs fp32 {self.ap_fp32:.4f} (difference {self.ap_difference:+.4f}, "
                f"gate |d| <= {MAX_AP_DIFFERENCE}: {'pass' if self.passed else 'FAIL'}{interval}); keypoints scored > "
                f"{CONFIDENT_SCORE} by fp32 ({self.confident_keypoints}): median {self.median_px:.3f} px, "
                f"99th percentile {self.p99_px:.3f} px, max {self.max_px:.3f} px")


def keypoint_distances(reference: list[dict], other: list[dict], min_score: float = CONFIDENT_SCORE) -> np.ndarray:
    """Pixel distances between two runs' keypoints, instance by instance, where `reference` scores > min_score."""
    if [p["id"] for p in reference] != [p["id"] for p in other]:
        raise ValueError("the two prediction lists are not of the same instances in the same order")
    ref = np.stack([p["keypoints"] for p in reference]).astype(np.float64)
    oth = np.stack([p["keypoints"] for p in other]).astype(np.float64)
    confident = np.stack([p["keypoint_scores"] for p in reference]) > min_score
    return np.linalg.norm(ref - oth, axis=-1)[confident]


def compare_precisions(model, make_batches, codec, evaluator, precisions, device="cpu", flip_test=True,
                       flip_indices=None, bootstrap: int = 0) -> list[GateResult]:
    """fp32 predictions against each of `precisions` ("bf16" / "fp16") on the same batches.

    make_batches: a function returning a fresh iterable of validation batches (`predict`'s input).
    bootstrap: resamples of the images for the AP difference's interval (0: none; a COCO evaluator).
    """
    device = torch.device(device)
    model = model.to(device).eval()

    def run(dtype):
        return predict(model, make_batches(), codec, flip_test=flip_test, device=device, amp_dtype=dtype,
                       flip_indices=flip_indices)

    def score(predictions):  # (AP, the COCOeval behind it when the bootstrap needs it): COCOeval once
        if not bootstrap:
            return evaluator.evaluate(predictions)["AP"], None
        evaluation = evaluator.cocoeval(predictions)
        return float(evaluation.stats[0]), evaluation

    reference = run(None)
    ap_fp32, reference_eval = score(reference)
    results = []
    for name in precisions:
        predictions = run(resolve_precision(name, device))
        d = keypoint_distances(reference, predictions)
        pct = (lambda q: float(np.percentile(d, q))) if d.size else (lambda q: float("nan"))
        ap, evaluation = score(predictions)
        interval = paired_bootstrap(reference_eval, evaluation, bootstrap) if bootstrap else None
        results.append(GateResult(name, ap_fp32, ap, int(d.size), pct(50), pct(99), pct(100), interval))
    return results


def time_precisions(model, make_batches, codec, precisions, rounds: int, device="cpu", flip_indices=None,
                    crops: int = 0):
    """Crops/s of the prediction loop per precision: alternating rounds after a warm-up until steady.

    Returns {name: [crops/s of each round]}; fp32 is always measured (the baseline)."""
    names = ["fp32"] + [p for p in precisions if p != "fp32"]
    dtypes = {name: resolve_precision(name, device) for name in names}

    def once(name):
        start = time.perf_counter()
        predict(model, make_batches(), codec, flip_test=True, device=device, amp_dtype=dtypes[name],
                flip_indices=flip_indices)
        return time.perf_counter() - start

    for name in names:
        warm_up(lambda name=name: once(name), max_steps=8)
    seconds = alternate({name: (lambda name=name: once(name)) for name in names}, rounds)
    return {name: [crops / s for s in values] for name, values in seconds.items()}


def build_from_config(config, checkpoint, device, batch_size=None, data_root=None):
    """(model, make_batches, codec, evaluator, flip_indices) of a config's validation set, as evaluate.py builds them."""
    from torch.utils.data import DataLoader

    from vitpose.builders import (
        build_codec,
        build_dataset_info,
        build_evaluator,
        build_model_from_config,
        build_val_set,
    )
    from vitpose.config import load_config
    from vitpose.models import load_weights

    cfg = load_config(config)
    root = Path(data_root if data_root is not None else cfg.data.root)
    skeleton = build_dataset_info(cfg, root)
    evaluator = build_evaluator(cfg, skeleton, root=root)
    dataset = build_val_set(cfg, root, info=skeleton)
    model = build_model_from_config(cfg.model)
    load_weights(model, checkpoint)
    size = batch_size or cfg.loader.val_batch_size

    def make_batches():
        return DataLoader(dataset, batch_size=size, shuffle=False, num_workers=0)

    return model.to(device).eval(), make_batches, build_codec(cfg.model), evaluator, skeleton.flip_indices, len(dataset)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data-root", default=None)
    p.add_argument("--precisions", nargs="+", default=["bf16"], choices=[x for x in PRECISIONS if x not in ("auto", "fp32")])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--repeats", type=int, default=0, help="also time N alternating rounds (crops/s)")
    p.add_argument("--bootstrap", type=int, default=0, metavar="N",
                   help="N paired resamples of the images: the AP difference's 95%% interval (e.g. 1000)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model, make_batches, codec, evaluator, flip_indices, crops = build_from_config(
        args.config, args.checkpoint, device, args.batch_size, args.data_root)
    print(f"{crops} crops, flip test, device {device}, {torch.get_num_threads()} threads, "
          f"auto -> {precision_name(resolve_precision('auto', device))}")
    results = compare_precisions(model, make_batches, codec, evaluator, args.precisions, device, True, flip_indices,
                                 args.bootstrap)
    for r in results:
        print(r.line())
    if args.repeats:
        rates = time_precisions(model, make_batches, codec, args.precisions, args.repeats, device, flip_indices, crops)
        print(load_note())
        for name, values in rates.items():
            speedup = [v / b for v, b in zip(values, rates["fp32"])]  # within each round: same load
            print(f"{name}: {spread(values)} crops/s over rounds (median [min-max]); speed-up over fp32 per round "
                  f"{spread(speedup)}")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
