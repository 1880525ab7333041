"""Evaluate a ViTPose checkpoint on COCO keypoints (val2017 by default) with ViTPose's protocol.

    python evaluate.py --checkpoint vitpose-s.pth                       # config's boxes, flip test
    python evaluate.py --config configs/vitpose-b_coco_256x192.yaml --checkpoint ckpt.pth --amp
    python evaluate.py --checkpoint ckpt.pth --gt-boxes                  # ground-truth person boxes
    python evaluate.py --checkpoint ckpt.pth --bbox-file dets.json --no-flip-test --vis vis/

The protocol is MMPose's CocoMetric with the ViTPose settings (docs/evaluation.md): person boxes from the
detection file the config names (COCO_val2017_detections_AP_H_56_person.json, all scores kept)
or the GT boxes, UDP crops, flip test, rescoring bbox_score x mean(keypoint scores > 0.2),
OKS-NMS at 0.9, then COCOeval (keypoints). It prints the ten COCO stats and writes the raw
predictions (--out) and the COCO results file that COCOeval scored (next to it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent
DEFAULT_CONFIG = REPO / "configs" / "vitpose-s_coco_256x192.yaml"
EXIT_USAGE = 2


class UsageError(Exception):
    """A problem with the command line or the machine that the user can fix."""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="YAML config (default: %(default)s)")
    p.add_argument("--checkpoint", required=True,
                   help="weights: this project's checkpoints or .safetensors, MMPose 1.x, official ViTPose or HF files")
    boxes = p.add_mutually_exclusive_group()
    boxes.add_argument("--bbox-file", type=Path, default=None,
                       help="COCO detection results JSON for the person boxes (default: the config's data.val_bbox_file)")
    boxes.add_argument("--gt-boxes", action="store_true", help="use the ground-truth boxes of the annotation file")
    p.add_argument("--no-flip-test", action="store_true", help="skip the flip test (on by default)")
    p.add_argument("--batch-size", type=int, default=None, help="crops per batch (default: loader.val_batch_size)")
    p.add_argument("--workers", type=int, default=None, help="data loader workers (default: min(8, CPUs))")
    p.add_argument("--amp", action="store_true", help="autocast (train.amp_dtype on CUDA, bfloat16 on CPU)")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default=None,
                   help="inference precision (default fp32, or --amp): auto = bf16 on a CPU with AVX512-BF16 or "
                        "AMX, fp16 on CUDA, else fp32 (vitpose.device.resolve_precision)")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: train.device, auto = CUDA if present)")
    p.add_argument("--data-root", default=None, help="COCO root (overrides data.root)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config field, e.g. --set eval.nms_mode=none (repeatable)")
    p.add_argument("--out", type=Path, default=None,
                   help="predictions JSON (default: WORK_DIR/eval/predictions.json); the COCO results go "
                        "to the same name ending in .coco_results.json")
    p.add_argument("--vis", type=Path, default=None, help="write pose drawings (PNG) of the first images here")
    p.add_argument("--vis-num", type=int, default=10, help="how many images --vis draws (default: %(default)s)")
    return p.parse_args(argv)


def pick_device(name: str | None):
    from vitpose.device import resolve_device

    try:
        return resolve_device(name)
    except ValueError as e:
        raise UsageError(f"--device: {e}") from None


def pick_amp_dtype(device, amp: bool, amp_dtype: str):
    """The autocast dtype train.py would use (vitpose.engine.precision), or None for fp32."""
    from vitpose.engine.precision import resolve_precision

    precision = resolve_precision(device, amp, amp_dtype)
    if precision.note:
        print(precision.note)
    return precision.dtype


def pick_inference_precision(precision: str, device):
    """--precision: the inference rule of `vitpose predict` and `Predictor` (autocast dtype or None)."""
    from vitpose.device import resolve_precision

    try:
        return resolve_precision(precision, device)
    except ValueError as e:
        raise UsageError(f"--precision: {e}") from None


def resolve_boxes(args, cfg, root: Path) -> Path | None:
    from vitpose.builders import val_bbox_path

    if args.gt_boxes:
        return None
    if args.bbox_file is not None:
        return args.bbox_file
    return val_bbox_path(cfg, root)


def draw_examples(dataset, predictions, out_dir: Path, num_images: int, thr: float = 0.3) -> list[Path]:
    """PNG drawings of every prediction (after NMS) on the first `num_images` images."""
    import numpy as np

    from vitpose.data.image_io import load_image
    from vitpose.files import write_image
    from vitpose.inference.draw import draw_pose

    by_image: dict[int, list[dict]] = {}
    for pred in predictions:
        by_image.setdefault(pred["image_id"], []).append(pred)
    files = {}
    for i in range(len(dataset)):
        info = dataset.instance_info(i)
        files.setdefault(info["image_id"], info["file"])
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for image_id in list(by_image)[:num_images]:
        image, _ = load_image(files[image_id])  # BGR
        kept = by_image[image_id]
        keypoints = np.stack([p["keypoints"] for p in kept])
        scores = np.stack([p["keypoint_scores"] for p in kept])
        skeleton = dataset.dataset_info
        canvas = draw_pose(image, keypoints, scores, thr=thr, channels="bgr", skeleton=skeleton.skeleton,
                           keypoint_colors=skeleton.keypoint_colors, link_colors=skeleton.link_colors)
        path = out_dir / f"{image_id:012d}.png"
        write_image(path, canvas)  # a numpy buffer: any --vis folder name the OS allows
        written.append(path)
    return written


def check_outputs(args, cfg, inputs) -> Path:
    """The predictions file (--out), its .coco_results.json and --vis, checked before any work."""
    from vitpose.files import check_output

    out = check_output(args.out or Path(cfg.train.work_dir) / "eval" / "predictions.json", "--out", inputs=inputs)
    check_output(out.with_name(out.name.removesuffix(".json") + ".coco_results.json"), "--out", inputs=inputs)
    if args.vis is not None:
        check_output(args.vis, "--vis", kind="dir", inputs=inputs)
    return out


def run(args) -> dict:
    from torch.utils.data import DataLoader

    from vitpose.builders import build_dataset_info, build_evaluator, build_val_set, load_model
    from vitpose.config import load_config
    from vitpose.engine.evaluate import format_stats, predict
    from vitpose.evaluation.coco_evaluator import save_predictions

    cfg = load_config(args.config, args.overrides)
    root = Path(args.data_root if args.data_root is not None else cfg.data.root)
    device = pick_device(args.device or cfg.train.device)
    if args.precision is not None and args.amp:
        raise UsageError("--precision and --amp both choose the precision: give one")
    amp_dtype = pick_inference_precision(args.precision, device) if args.precision is not None else \
        pick_amp_dtype(device, args.amp or cfg.train.amp, cfg.train.amp_dtype)
    flip = cfg.eval.flip_test and not args.no_flip_test
    bbox_file = resolve_boxes(args, cfg, root)
    ann_file = root / cfg.data.val_ann
    if bbox_file is not None and not Path(bbox_file).is_file():
        raise UsageError(f"person detection file not found: {bbox_file} "
                                "(give one with --bbox-file, or evaluate on GT boxes with --gt-boxes)")
    out = check_outputs(args, cfg, inputs=(ann_file, bbox_file, args.checkpoint, args.config))  # before the work

    # Build everything that can fail on bad input before the long part starts.
    skeleton = build_dataset_info(cfg, root)  # K, flip pairs and OKS sigmas of the data
    evaluator = build_evaluator(cfg, skeleton, root=root)  # as MMPose scores data.dataset_info
    dataset = build_val_set(cfg, root, bbox_file, info=skeleton)
    loaded = load_model(args.checkpoint, config=cfg, device=device)  # the one way to a model
    model, codec, report = loaded.model, loaded.codec, loaded.report

    rescoring = (f"bbox_score x mean(keypoint scores > {cfg.eval.keypoint_score_thr:g})"
                 if cfg.eval.score_mode == "bbox_keypoint" else "none (bbox score)")
    nms = "none" if cfg.eval.nms_mode == "none" else f"{cfg.eval.nms_mode} at {cfg.eval.nms_thr:g}"
    print(f"model     : {cfg.model.name} ({cfg.model.decoder} decoder) from {args.checkpoint} "
          f"[{getattr(report, 'layout', '?')} layout]")
    print(f"boxes     : {'detections from ' + str(bbox_file) if bbox_file else 'ground truth (' + str(ann_file) + ')'}"
          f" -> {len(dataset)} person crops")
    print(f"protocol  : flip test {'on' if flip else 'off'}; rescoring {rescoring}; NMS {nms}; "
          f"COCOeval keypoints")
    print(f"device    : {device}{' autocast ' + str(amp_dtype).replace('torch.', '') if amp_dtype else ''}")

    workers = args.workers if args.workers is not None else min(8, os.cpu_count() or 1)
    batch_size = args.batch_size or cfg.loader.val_batch_size
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers,
                        pin_memory=device.type == "cuda", persistent_workers=False)
    start = time.perf_counter()
    predictions = predict(model, loader, codec, flip_test=flip, device=device, amp_dtype=amp_dtype,
                          flip_indices=skeleton.flip_indices)
    seconds = time.perf_counter() - start
    print(f"predicted : {len(predictions)} crops in {seconds:.1f} s ({len(predictions) / max(seconds, 1e-9):.1f} crops/s)")

    stats = evaluator.evaluate(predictions)
    if evaluator.last_nonfinite:
        print(f"non-finite: {evaluator.last_nonfinite} of {len(predictions)} predictions have non-finite keypoints "
              f"or scores (a diverged or broken model?); they are scored as misses (OKS 0)")
    save_predictions(predictions, out)
    results_file = evaluator.write_results(predictions, out.with_name(out.name.removesuffix(".json") + ".coco_results.json"))
    print(f"written   : {out} (raw predictions), {results_file} (the COCO results scored)")
    if args.vis is not None:
        kept = [dict(p) for p in _after_protocol(evaluator, predictions)]
        paths = draw_examples(dataset, kept, args.vis, args.vis_num)
        print(f"drawings  : {len(paths)} images in {args.vis}")
    print()
    print(format_stats(stats))
    return stats


def _after_protocol(evaluator, predictions):
    """The predictions COCOeval scored (rescored and NMS-filtered), as keypoints + scores dicts."""
    import numpy as np

    for r in evaluator.results(predictions):
        flat = np.asarray(r["keypoints"]).reshape(-1, 3)
        yield {"image_id": r["image_id"], "keypoints": flat[:, :2], "keypoint_scores": flat[:, 2]}


def main(argv=None) -> dict:
    args = parse_args(argv)
    # Errors about the user's files are printed as one line, without a traceback from deep inside.
    from vitpose.config import ConfigError
    from vitpose.data.errors import DataError
    from vitpose.errors import UserError
    from vitpose.evaluation.coco_evaluator import PredictionError
    from vitpose.models.checkpoint import CheckpointError

    try:
        return run(args)
    except (DataError, ConfigError, CheckpointError, PredictionError, FileNotFoundError, UsageError, UserError) as e:
        print(f"evaluate.py: error: {e}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


if __name__ == "__main__":
    main()
