"""`vitpose evaluate`: score a checkpoint on its validation set (COCO val2017 by default) with its dataset's metric.

    vitpose evaluate --checkpoint work_dirs/demo/best.pth              # the config the checkpoint records
    vitpose evaluate --config vitpose-b_coco_256x192 --checkpoint ckpt.pth --amp
    vitpose evaluate --checkpoint ckpt.pth --gt-boxes                  # ground-truth person boxes
    vitpose evaluate --checkpoint ckpt.pth --bbox-file dets.json --no-flip-test --vis vis/

The config is --config, else the one a training checkpoint records, else vitpose-s_coco_256x192.
The metric is the one the skeleton (data.dataset_info) names (docs/evaluation.md §8). coco-oks:
MMPose's CocoMetric with the ViTPose settings: person boxes from the detection file the config
names (COCO_val2017_detections_AP_H_56_person.json, all scores kept) or the GT boxes, UDP crops,
flip test, rescoring bbox_score x mean(keypoint scores > 0.2), OKS-NMS at 0.9, then COCOeval
(keypoints); it prints the ten COCO stats. pck: MMPose's PCKAccuracy (normalised by the GT box),
AUC and EPE on the GT boxes; it prints PCK@<thr>, AUC and EPE. pckh: MPII's PCKh. It writes the
raw predictions (--out) and the results that were scored (next to it).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader

from vitpose.builders import build_dataset_info, build_evaluator, build_val_set, load_model, val_bbox_path
from vitpose.config import Config, load_config
from vitpose.data.image_io import load_image
from vitpose.device import PRECISIONS, resolve_device, tune_cpu_allocator
from vitpose.device import resolve_precision as resolve_precision_for_inference
from vitpose.engine.checkpoint import load_checkpoint
from vitpose.engine.evaluate import format_stats, predict
from vitpose.engine.precision import resolve_precision
from vitpose.errors import UsageError, UserError
from vitpose.evaluation.coco_evaluator import save_predictions
from vitpose.files import check_output, stream_kind, write_image
from vitpose.inference.draw import draw_pose
from vitpose.models.checkpoint import CheckpointError

DEFAULT_CONFIG = "vitpose-s_coco_256x192"


def add_parser(subparsers) -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = subparsers.add_parser("evaluate", help="score a checkpoint with its dataset's metric (COCO AP, PCK, PCKh)",
                              description=doc[0], epilog="\n\n".join(doc[1:]),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="weights: this project's checkpoints or .safetensors, MMPose 1.x, official ViTPose or HF files")
    p.add_argument("--config", default=None, metavar="FILE|NAME",
                   help="run config: a YAML file or a shipped config's name (default: the one the checkpoint records, "
                        f"else {DEFAULT_CONFIG})")
    boxes = p.add_mutually_exclusive_group()
    boxes.add_argument("--bbox-file", type=Path, default=None,
                       help="COCO detection results JSON for the person boxes (default: the config's data.val_bbox_file)")
    boxes.add_argument("--gt-boxes", action="store_true", help="use the ground-truth boxes of the annotation file")
    p.add_argument("--no-flip-test", action="store_true", help="skip the flip test (on by default)")
    p.add_argument("--batch-size", type=int, default=None, help="crops per batch (default: loader.val_batch_size)")
    p.add_argument("--workers", type=int, default=None, help="data loader workers (default: min(8, CPUs))")
    p.add_argument("--amp", action="store_true", help="autocast (train.amp_dtype on CUDA, bfloat16 on CPU)")
    p.add_argument("--precision", default=None, metavar="auto|fp32|bf16|fp16",
                   help="inference precision (default fp32, or --amp): auto = fp16 on CUDA, bf16 on a CPU "
                        "with AVX512-BF16 or AMX, else fp32 (vitpose.device.resolve_precision)")
    p.add_argument("--data-root", default=None, help="COCO root (overrides data.root)")
    p.add_argument("--out", type=Path, default=None,
                   help="predictions JSON (default: WORK_DIR/eval/predictions.json); the COCO results go "
                        "to the same name ending in .coco_results.json")
    p.add_argument("--rescore", choices=("none", "calibrated"), default="none",
                   help="calibrated: also score people from a calibrated model's keypoint p and report both APs, the "
                        "paired bootstrap interval of the difference and whether the gate keeps the rescoring "
                        "(docs/calibration.md §5.6; default: %(default)s)")
    p.add_argument("--vis", type=Path, default=None, help="write pose drawings (PNG) of the first images here")
    p.add_argument("--vis-num", type=int, default=10, help="how many images --vis draws (default: %(default)s)")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    evaluate_checkpoint(args)
    return 0


def check_flags(args) -> None:
    """The flags that need no config, and the checkpoint, checked before anything is read: each
    refused in one line naming it (exit 2), as `vitpose.open_predictor` refuses them for predict."""
    from vitpose.models.loading import resolve_weights

    if args.precision is not None and args.precision not in PRECISIONS:
        raise UsageError(f"--precision: {args.precision!r} is not one of {', '.join(PRECISIONS)}")
    if args.precision is not None and args.amp:
        raise UsageError("--precision and --amp both choose the precision: give one")
    if args.device is not None:
        pick_device(args.device)
    try:  # the loader's own rule (a path, a published name, an HF repo id), before a config is looked for
        resolve_weights(args.checkpoint)
    except UserError as e:
        raise UsageError(f"--checkpoint: {e}") from None


def load_run_config(args) -> tuple[Config, str]:
    """(config, where it came from): --config, else the config a training checkpoint records, else
    the default. The command's --set overrides apply to each."""
    if args.config is not None:
        return load_config(args.config, args.overrides), str(args.config)
    try:
        recorded = load_checkpoint(args.checkpoint, mmap=True).get("config")
    except CheckpointError:  # not a training checkpoint (weights only, MMPose, HF): no config in it
        recorded = None
    if recorded is None:
        return load_config(DEFAULT_CONFIG, args.overrides), f"{DEFAULT_CONFIG} (the checkpoint records none)"
    where = f"{args.checkpoint} (recorded config)"
    return load_config(None, args.overrides, recorded=recorded, recorded_in=where), where


def evaluate_checkpoint(args) -> dict:
    """The whole evaluation; returns the stats (also printed)."""
    check_flags(args)
    cfg, config_source = load_run_config(args)
    root = Path(args.data_root if args.data_root is not None else cfg.data.root)
    device = pick_device(args.device or cfg.train.device)
    tune_cpu_allocator(device)  # on a CPU: this process runs the model pass after pass (see its docstring)
    amp_dtype = (pick_inference_precision(args.precision, device) if args.precision is not None
                 else pick_amp_dtype(device, args.amp or cfg.train.amp, cfg.train.amp_dtype))
    flip = cfg.eval.flip_test and not args.no_flip_test
    skeleton = build_dataset_info(cfg, root)  # K, flip pairs, OKS sigmas and the metric of the data
    if skeleton.metric == "pck" and args.bbox_file is not None:
        raise UserError(f"--bbox-file: the skeleton {skeleton.name!r} is scored with PCK, which compares each "
                        "annotated instance with its prediction on the ground-truth box; leave out --bbox-file")
    if skeleton.metric != "coco-oks" and args.rescore == "calibrated":
        raise UsageError(f"--rescore calibrated is gated on COCO AP; the skeleton {skeleton.name!r} is scored with "
                         f"{skeleton.metric.upper()}: leave out the flag")
    bbox_file = None if args.gt_boxes else (args.bbox_file or val_bbox_path(cfg, root))
    ann_file = root / cfg.data.val_ann
    if not ann_file.is_file():
        raise UserError(f"annotation file not found: {ann_file} (data.root {root} + data.val_ann; "
                        "give the dataset root with --data-root)")
    if bbox_file is not None and not Path(bbox_file).is_file():
        raise UserError(f"person detection file not found: {bbox_file} "
                        "(give one with --bbox-file, or evaluate on GT boxes with --gt-boxes)")
    out = check_outputs(args, cfg, inputs=(ann_file, bbox_file, args.checkpoint, args.config))  # before the work

    # Build everything that can fail on bad input before the long part starts.
    evaluator = build_evaluator(cfg, skeleton, root=root)  # the skeleton's metric, as MMPose computes it
    dataset = build_val_set(cfg, root, bbox_file, info=skeleton)
    loaded = load_model(args.checkpoint, config=cfg, device=device)  # the one way to a model
    model, codec, report = loaded.model, loaded.codec, loaded.report
    if args.rescore == "calibrated" and getattr(loaded.spec, "calibration", None) is None:
        raise UsageError(f"--rescore calibrated: {args.checkpoint} records no calibration; run `vitpose calibrate` "
                         "first, or leave out the flag")
    print(f"config    : {config_source}")
    print(f"model     : {cfg.model.name} ({cfg.model.decoder} decoder) from {args.checkpoint} "
          f"[{getattr(report, 'layout', '?')} layout]")
    print(f"boxes     : {'detections from ' + str(bbox_file) if bbox_file else 'ground truth (' + str(ann_file) + ')'}"
          f" -> {len(dataset)} person crops")
    print(f"protocol  : flip test {'on' if flip else 'off'}; {describe_metric(cfg, skeleton)}")
    print(f"device    : {device}{' autocast ' + str(amp_dtype).replace('torch.', '') if amp_dtype else ''}")

    workers = args.workers if args.workers is not None else min(8, os.cpu_count() or 1)
    loader = DataLoader(dataset, batch_size=args.batch_size or cfg.loader.val_batch_size, shuffle=False,
                        num_workers=workers, pin_memory=device.type == "cuda", persistent_workers=False)
    start = time.perf_counter()
    predictions = predict(model, loader, codec, flip_test=flip, device=device, amp_dtype=amp_dtype,
                          flip_indices=skeleton.flip_indices, calibration=getattr(loaded.spec, "calibration", None))
    seconds = time.perf_counter() - start
    print(f"predicted : {len(predictions)} crops in {seconds:.1f} s ({len(predictions) / max(seconds, 1e-9):.1f} crops/s)")

    stats = evaluator.evaluate(predictions)
    if evaluator.last_nonfinite:
        scored_as = "wrong keypoints (PCK, AUC) and a NaN EPE" if skeleton.metric == "pck" else "misses (OKS 0)"
        print(f"non-finite: {evaluator.last_nonfinite} of {len(predictions)} predictions have non-finite keypoints "
              f"or scores (a diverged or broken model?); they are scored as {scored_as}")
    write_outputs(args, out, evaluator, dataset, predictions)
    print()
    print(format_stats(stats))
    if args.rescore == "calibrated":
        from vitpose.evaluation.rescoring import rescore_gate

        print("\n".join(rescore_gate(evaluator, predictions).lines()))
    return stats


def describe_metric(cfg: Config, skeleton) -> str:
    """The scoring protocol of the skeleton's metric, in one line."""
    if skeleton.metric == "pck":
        return (f"PCK@{skeleton.pck_threshold:g} (distance / the longer side of the GT box), AUC (PCK of "
                f"distance / 30 px at 20 thresholds 0..0.95), EPE (pixels): MMPose's PCKAccuracy, AUC, EPE")
    if skeleton.metric == "pckh":
        return "PCKh@0.5 and @0.1 (distance / 0.6 x the head box diagonal): MMPose's MpiiPCKAccuracy"
    return (f"rescoring {describe_rescoring(cfg)}; "
            f"NMS {'none' if cfg.eval.nms_mode == 'none' else f'{cfg.eval.nms_mode} at {cfg.eval.nms_thr:g}'}; "
            f"COCOeval keypoints")


def describe_rescoring(cfg: Config) -> str:
    if cfg.eval.score_mode == "bbox_keypoint":
        return f"bbox_score x mean(keypoint scores > {cfg.eval.keypoint_score_thr:g})"
    return "none (bbox score)"


def check_outputs(args, cfg: Config, inputs) -> Path:
    """The predictions file (--out), its .coco_results.json and --vis, checked before any work."""
    # --out may be a device or pipe (/dev/null, a FIFO: written directly, without the COCO results
    # file beside it), not this command's stdout, which carries the report
    out = check_output(args.out or Path(cfg.train.work_dir) / "eval" / "predictions.json", "--out", inputs=inputs,
                       streams=True, stdout=False)
    if stream_kind(out) is None:
        check_output(results_path(out), "--out", inputs=inputs)
    if args.vis is not None:
        check_output(args.vis, "--vis", kind="dir", inputs=inputs)
    return out


def results_path(out: Path) -> Path:
    """The COCO results file beside the raw predictions `--out`."""
    return out.with_name(out.name.removesuffix(".json") + ".coco_results.json")


def write_outputs(args, out: Path, evaluator, dataset, predictions) -> None:
    """The raw predictions, the COCO results COCOeval scored, and (--vis) drawings."""
    save_predictions(predictions, out)
    if stream_kind(out) is None:
        results_file = evaluator.write_results(predictions, results_path(out))
        print(f"written   : {out} (raw predictions), {results_file} (the COCO results scored)")
    else:
        print(f"written   : {out} (raw predictions; the COCO results scored are written beside a file --out)")
    if args.vis is not None:
        kept = [dict(p) for p in after_protocol(evaluator, predictions)]
        paths = draw_examples(dataset, kept, args.vis, args.vis_num)
        print(f"drawings  : {len(paths)} images in {args.vis}")


def pick_device(name: str | None):
    try:
        return resolve_device(name)
    except ValueError as e:
        raise UsageError(f"--device: {e}") from None


def pick_amp_dtype(device, amp: bool, amp_dtype: str):
    """The autocast dtype training would use (vitpose.engine.precision), or None for fp32."""
    precision = resolve_precision(device, amp, amp_dtype)
    if precision.note:
        print(precision.note)
    return precision.dtype


def pick_inference_precision(precision: str, device):
    """--precision: the inference rule of `vitpose predict` and `Predictor` (autocast dtype or None)."""
    try:
        return resolve_precision_for_inference(precision, device)
    except ValueError as e:
        raise UsageError(f"--precision: {e}") from None


def draw_examples(dataset, predictions, out_dir: Path, num_images: int, thr: float = 0.3) -> list[Path]:
    """PNG drawings of every prediction (after NMS) on the first `num_images` images."""
    by_image: dict[int, list[dict]] = {}
    for pred in predictions:
        by_image.setdefault(pred["image_id"], []).append(pred)
    files = {}
    for i in range(len(dataset)):
        info = dataset.instance_info(i)
        files.setdefault(info["image_id"], info["file"])
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    skeleton = dataset.dataset_info
    for image_id in list(by_image)[:num_images]:
        image, _ = load_image(files[image_id])  # BGR
        kept = by_image[image_id]
        keypoints = np.stack([p["keypoints"] for p in kept])
        scores = np.stack([p["keypoint_scores"] for p in kept])
        canvas = draw_pose(image, keypoints, scores, thr=thr, channels="bgr", skeleton=skeleton.skeleton,
                           keypoint_colors=skeleton.keypoint_colors, link_colors=skeleton.link_colors)
        path = out_dir / f"{image_id:012d}.png"
        write_image(path, canvas)  # a numpy buffer: any --vis folder name the OS allows
        written.append(path)
    return written


def after_protocol(evaluator, predictions):
    """The predictions COCOeval scored (rescored and NMS-filtered), as keypoints + scores dicts."""
    for r in evaluator.results(predictions):
        flat = np.asarray(r["keypoints"]).reshape(-1, 3)
        yield {"image_id": r["image_id"], "keypoints": flat[:, :2], "keypoint_scores": flat[:, 2]}
