"""`vitpose predict SOURCE`: poses of every person in images, a directory, a video or a webcam.

    vitpose predict photo.jpg --out drawn/                     # downloads vitpose-b-simple once
    vitpose predict images/ --json poses.json --model vitpose-l
    vitpose predict val2017/ --boxes dets.json --detector none --json results.json
    vitpose predict clip.mp4 --out drawn/ --track --smooth     # video files and webcams (0, 1, ...)

Images: each file is decoded with OpenCV, the detector finds the people (or `--boxes` gives
them), the crops of `--batch-images` images go through the model together, and `--out` gets the
drawn image under the same name, `--json` the COCO results of all images. Video files and webcam
indices go to `vitpose.inference.video.run_video`.

`--json` is a COCO keypoint results list (what `COCO.loadRes` reads), one entry per person:
`image_id` (the file name's number when every file is COCO-named, e.g. 000000197388.jpg, else a
running index in sorted-name order), `file_name`, `category_id` 1, `bbox` [x, y, w, h], `keypoints`
[x1, y1, s1, ...], `bbox_score` and `score` = bbox_score x the mean of the keypoint scores above
0.2 (MMPose's instance score, as evaluate.py scores). An image with nobody in it has no entry.

Exit status: 0; 1 when some images could not be read (they are skipped, counted and named at
the end); 2 for a usage error (unknown model, missing source, bad boxes file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

DEFAULT_MODEL = "vitpose-b-simple"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".jp2", ".pgm", ".ppm")
VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv", ".flv", ".ts")
STAGES = ("decode", "detect", "crop", "pose", "decode heatmaps", "draw", "write")
RESCORE_THR = 0.2  # keypoint scores above this enter the instance score (MMPose's CocoMetric)
EXIT_OK, EXIT_SKIPPED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A problem with the command line or the user's files, reported in one line (exit status 2)."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = subparsers.add_parser("predict", help="poses in images, directories, videos or a webcam",
                              description=doc[0], epilog="\n\n".join(doc[1:]),
                              formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("source", nargs="+",
                   help="images and directories of images, or one video file or webcam index (0, 1, ...)")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="a published name (vitpose.models.hub.list_models()) or a weights file (default: %(default)s)")
    p.add_argument("--config", default=None, help="training config of the weights (custom models); "
                   "without it the size and decoder are read from the file")
    p.add_argument("--detector", default=None,
                   help="default | none | full-frame | a name of vitpose.inference.detect.DETECTORS "
                        "(default: 'default', or 'none' with --boxes)")
    p.add_argument("--detector-threshold", type=float, default=None, help="minimum person score (default 0.3)")
    p.add_argument("--boxes", type=Path, default=None,
                   help="person boxes from a COCO detection results JSON (image_id, bbox xywh, score)")
    p.add_argument("--out", type=Path, default=None, help="directory for the drawn images (or video)")
    p.add_argument("--json", type=Path, default=None, help="write the COCO keypoint results here")
    p.add_argument("--track", action="store_true", help="video: stable person ids (track_id)")
    p.add_argument("--smooth", action="store_true", help="video: One-Euro filter on the keypoints")
    p.add_argument("--no-flip", action="store_true", help="skip the flip test (about 2x faster)")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: CUDA when available)")
    p.add_argument("--det-classes", nargs="+", default=None, metavar="CLASS",
                   help="COCO classes the detector keeps, names or ids (default: the model's skeleton's: "
                        "bird..giraffe for AP-10K / APT-36K, person otherwise)")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                   help="auto (default): bf16 on a CPU with AVX512-BF16 or AMX, bf16 or fp16 on CUDA, else fp32 "
                        "(AP within 0.002 of fp32: BENCHMARKS.md)")
    p.add_argument("--batch-images", type=int, default=8, help="images per model call (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=32, help="person crops per forward pass (default: %(default)s)")
    p.add_argument("--keypoint-threshold", type=float, default=0.3,
                   help="drawing: keypoints with a lower score are not drawn (default: %(default)s)")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    p.set_defaults(run=run)
    return p


# ----------------------------------------------------------------------------------------------
# Sources


def is_webcam(source: str) -> bool:
    return source.isdigit() and not Path(source).exists()


def is_video_file(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in VIDEO_SUFFIXES


def list_images(sources: list[str]) -> list[Path]:
    """Image files of the sources: directories (by suffix, sorted by name) and files as given.

    A file that does not exist stays in the list: it is counted and skipped like an unreadable
    one (and so is a broken link in a directory)."""
    paths = []
    for source in map(Path, sources):
        if source.is_dir():
            found = sorted(p for p in source.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and not p.is_dir())
            if not found:
                raise UsageError(f"no images in {source} (looked for {', '.join(IMAGE_SUFFIXES)})")
            paths += found
        else:
            paths.append(source)
    return paths


def output_names(paths: list[Path]) -> list[str]:
    """File names for the drawn images: the source's name, made unique across directories."""
    used, names = set(), []
    for path in paths:
        name, k = path.name, 1
        while name in used:
            name, k = f"{path.stem}_{k}{path.suffix}", k + 1
        used.add(name)
        names.append(name)
    return names


def image_ids(paths: list[Path]) -> list[int]:
    """COCO ids from COCO-style names (000000197388.jpg -> 197388) when every name is a number,
    else a running index (0, 1, ...) in the order of `paths`."""
    if all(p.stem.isdigit() for p in paths):
        return [int(p.stem) for p in paths]
    return list(range(len(paths)))


def read_detection_file(path: Path) -> dict[int, np.ndarray]:
    """A COCO detection results JSON -> {image_id: (M, 5) float32 [x, y, w, h, score]} of people.

    Entries with a `category_id` other than 1 (person) are left out; every box is kept
    whatever its score, as CocoKeypoints (and MMPose) read detection files.
    """
    try:
        records = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"--boxes: file not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"--boxes: {path}: not readable JSON ({e})") from None
    if not isinstance(records, list):
        raise UsageError(f"--boxes: {path}: expected a JSON list of {{image_id, bbox, score}}, "
                         f"got {type(records).__name__}")
    boxes: dict[int, list] = {}
    for i, rec in enumerate(records):
        where = f"--boxes: {path}: record [{i}]"
        if not isinstance(rec, dict):
            raise UsageError(f"{where}: expected an object, got {type(rec).__name__}")
        for field in ("image_id", "bbox", "score"):
            if field not in rec:
                raise UsageError(f"{where}: missing field {field!r}")
        if rec.get("category_id", 1) != 1:
            continue
        if not isinstance(rec["image_id"], int) or isinstance(rec["image_id"], bool):
            raise UsageError(f"{where}: field 'image_id' must be an integer, got {rec['image_id']!r}")
        bbox, score = rec["bbox"], rec["score"]
        try:
            row = np.array([*bbox[:4], score], np.float32) if len(bbox) >= 4 else None
        except (TypeError, ValueError):
            row = None
        if row is None or not np.all(np.isfinite(row)) or row[2] <= 0 or row[3] <= 0:
            raise UsageError(f"{where}: field 'bbox' must be [x, y, w, h] with w, h > 0 and a numeric "
                             f"'score', got bbox={bbox!r} score={score!r}")
        boxes.setdefault(rec["image_id"], []).append(row)
    return {k: np.stack(v) for k, v in boxes.items()}


# ----------------------------------------------------------------------------------------------
# Results


def coco_results(poses, image_id: int, file_name: str) -> list[dict]:
    """COCO keypoint results of one image's `Poses` (see the module docstring)."""
    out = []
    for box, box_score, keypoints, scores in zip(poses.boxes, poses.box_scores, poses.keypoints,
                                                  poses.keypoint_scores):
        confident = scores[scores > RESCORE_THR]
        score = float(box_score) * (float(confident.mean()) if len(confident) else 0.0)
        flat = np.concatenate([keypoints, scores[:, None].astype(np.float64)], axis=1).ravel()
        x1, y1, x2, y2 = (float(v) for v in box)
        out.append({"image_id": image_id, "file_name": file_name, "category_id": 1,
                    "bbox": [x1, y1, x2 - x1, y2 - y1], "keypoints": flat.tolist(),
                    "bbox_score": float(box_score), "score": score})
    return out


def write_json(records: list[dict], path: Path) -> None:
    """Write atomically: a crash never leaves a half-written results file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(records))
    os.replace(tmp, path)


def draw(image_bgr: np.ndarray, poses, keypoint_threshold: float) -> np.ndarray:
    """The poses and their boxes drawn on a copy of a BGR image."""
    import cv2

    from vitpose.inference.draw import draw_pose

    canvas = draw_pose(image_bgr, poses.keypoints, poses.keypoint_scores, thr=keypoint_threshold, channels="bgr")
    thickness = max(1, max(image_bgr.shape[:2]) // 400)
    for x1, y1, x2, y2 in np.round(poses.boxes).astype(int):
        cv2.rectangle(canvas, (int(x1), int(y1)), (int(x2), int(y2)), (255, 255, 255), thickness)
    return canvas


# ----------------------------------------------------------------------------------------------
# The command


def build_predictor(args):
    """The Predictor of the command line (the model downloads here when it is not cached)."""
    from vitpose.device import resolve_device
    from vitpose.inference.predictor import Predictor

    detector = args.detector or ("none" if args.boxes is not None else "default")
    if args.boxes is not None and detector != "none":
        raise UsageError("--boxes gives the person boxes: leave out --detector (or say --detector none)")
    if args.boxes is None and detector == "none":
        raise UsageError("--detector none needs the boxes from --boxes FILE.json (or use --detector full-frame)")
    try:
        device = resolve_device(args.device)
    except ValueError as e:
        raise UsageError(f"--device: {e}") from None
    if args.det_classes is not None:  # a misspelt class stops before any model loads
        from vitpose.inference.detect import parse_det_classes

        try:
            parse_det_classes(args.det_classes)
        except ValueError as e:
            raise UsageError(str(e)) from None
    return Predictor.from_pretrained(args.model, detector=None if detector == "none" else detector, device=device,
                                     config=args.config, flip_test=not args.no_flip, batch_size=args.batch_size,
                                     detector_threshold=args.detector_threshold, precision=args.precision,
                                     det_classes=args.det_classes)


def run(args) -> int:
    """`vitpose predict`; returns the exit status (errors about the user's input: one line, 2)."""
    from vitpose.config import ConfigError
    from vitpose.models.hub import DownloadError, UnknownModelError
    from vitpose.models.checkpoint import CheckpointError

    expected = (UsageError, UnknownModelError, DownloadError, CheckpointError, ConfigError, FileNotFoundError,
                NotImplementedError)
    try:
        return _run(args)
    except expected as e:
        if args.debug:
            raise
        print(f"vitpose predict: error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _run(args) -> int:
    if args.batch_images < 1 or args.batch_size < 1:
        raise UsageError("--batch-images and --batch-size must be >= 1")
    videos = [s for s in args.source if is_webcam(s) or is_video_file(Path(s).expanduser())]
    if videos and len(args.source) > 1:
        raise UsageError(f"a video or webcam ({videos[0]}) must be the only SOURCE")
    paths = [] if videos else list_images([str(Path(s).expanduser()) for s in args.source])
    if args.out is not None and any(p.parent.resolve() == args.out.resolve() for p in paths):
        raise UsageError(f"--out {args.out} is a source directory: the drawings would overwrite the images")
    boxes = read_detection_file(args.boxes) if args.boxes is not None else None
    try:  # before any model loads: the source and the boxes file are checked first
        predictor = build_predictor(args)
    except (ValueError, RuntimeError) as e:  # an unrecognised weights file, detector weights, ViTPose+
        if args.debug:
            raise
        raise UsageError(str(e)) from None
    if videos:
        from vitpose.inference.video import run_video  # the video pipeline (decode, detect and pose overlapped)

        source = videos[0]
        summary = run_video(predictor, int(source) if is_webcam(source) else Path(source).expanduser(), args)
        return summary.exit_status  # 1 when frames were skipped or the video ended early
    if args.track or args.smooth:
        print("vitpose predict: note: --track and --smooth apply to videos; ignored for images", file=sys.stderr)
    return predict_images(predictor, paths, args, boxes)


def predict_images(predictor, paths: list[Path], args, boxes: dict[int, np.ndarray] | None) -> int:
    """Poses of image files, `args.batch_images` at a time; results, drawings and the summary."""
    import cv2
    from tqdm import tqdm

    from vitpose.data.errors import DataError
    from vitpose.data.image_io import load_image

    timer = predictor.timer
    timer.reset()
    ids = image_ids(paths)
    names = output_names(paths)
    if boxes is not None:
        unused = sorted(set(boxes) - set(ids))
        if unused:
            print(f"vitpose predict: note: {args.boxes} has boxes for {len(unused)} image ids that are not in "
                  f"the source (e.g. {unused[:3]})", file=sys.stderr)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    results, unreadable, people, nobody, done = [], [], 0, 0, 0
    empty = np.zeros((0, 5), np.float32)
    with tqdm(total=len(paths), unit="img", desc="predict", dynamic_ncols=True, file=sys.stderr) as bar:
        for start in range(0, len(paths), args.batch_images):
            stop = start + args.batch_images
            chunk = list(zip(paths[start:stop], ids[start:stop], names[start:stop]))
            images, kept = [], []
            with timer.stage("decode"):
                for path, image_id, name in chunk:
                    try:
                        images.append(load_image(path)[0])  # BGR; missing, empty and truncated files raise
                        kept.append((path, image_id, name))
                    except DataError as e:
                        unreadable.append(str(e))
            if images:
                if boxes is None:
                    all_poses = predictor(images, channels="bgr")
                else:
                    given = [boxes.get(image_id, empty) for _, image_id, _ in kept]
                    all_poses = predictor(images, boxes=given, box_format="xywh", channels="bgr")
                for (path, image_id, name), image, poses in zip(kept, images, all_poses):
                    results += coco_results(poses, image_id, path.name)
                    people += len(poses)
                    nobody += len(poses) == 0
                    if args.out is not None:
                        with timer.stage("draw"):
                            canvas = draw(image, poses, args.keypoint_threshold)
                        with timer.stage("write"):
                            if not cv2.imwrite(str(args.out / name), canvas):
                                unreadable.append(f"{path}: could not write {args.out / name}")
                done += len(images)
            bar.update(len(chunk))
    if args.json is not None:
        with timer.stage("write"):
            write_json(results, args.json)
    print_summary(timer, done, people, nobody, unreadable, args)
    return EXIT_SKIPPED if unreadable else EXIT_OK


def print_summary(timer, done: int, people: int, nobody: int, unreadable: list, args) -> None:
    ordered = {name: timer.seconds[name] for name in STAGES if name in timer.seconds}
    ordered.update({k: v for k, v in timer.seconds.items() if k not in ordered})
    timer.seconds = ordered
    print(f"{done} images, {people} people" + (f", {nobody} images with nobody found" if nobody else ""))
    print(timer.summary(done, "image"))
    written = [str(p) for p in (args.out, args.json) if p is not None]
    if written:
        print("written: " + ", ".join(written))
    if unreadable:
        print(f"vitpose predict: {len(unreadable)} images skipped (missing or unreadable) or not written:",
              file=sys.stderr)
        for why in unreadable[:20]:
            print(f"  {why}", file=sys.stderr)
        if len(unreadable) > 20:
            print(f"  ... and {len(unreadable) - 20} more", file=sys.stderr)
