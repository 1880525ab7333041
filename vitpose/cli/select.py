"""`vitpose select SRC --model M --count N --out tasks.json`: which frames to label next.

    vitpose select clips/walk.mp4 --model work_dirs/mine/best.pth --count 50 --out next.json
    vitpose select images/ --model vitpose-b --count 100 --format cvat --out next.xml --exclude train.json

Ranks the images of a folder (or one image), or the frames of a video (every --every-th), by how
much a label would teach the model: low keypoint confidence, disagreement between the plain and
the mirrored forward of the flip test, pose jumps between video frames; then picks --count of
them greedily for uncertainty and diversity, so that near-identical frames are not all chosen
(vitpose/labelling/select.py, docs/labelling.md). The chosen frames are written as pre-annotated
tasks (--format labelstudio | cvat | coco: the records of `vitpose predict --json`); a video's
chosen frames are saved as images in --frames-dir for the tool. Frames named in --exclude (a COCO
file, e.g. what `vitpose import-annotations` wrote from earlier tasks) are skipped.

Every scored frame is a line of the --progress file (JSON Lines) as it is done: an interrupted
run (Ctrl-C, SIGTERM) keeps them and `--resume` continues; the ranking of every frame stays there.

Exit status: 0; 2 when an input, a flag or an output cannot be used (one line says which); 130
when interrupted (run again with --resume).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vitpose.cli.options import add_mark_by_argument, add_model_arguments, check_numbers, model_options, open_model
from vitpose.errors import EXIT_INTERRUPTED, EXIT_OK, UsageError

FORMATS = ("labelstudio", "cvat", "coco")
SUFFIXES = {"labelstudio": ".json", "cvat": ".xml", "coco": ".json"}


def add_parser(subparsers) -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = subparsers.add_parser("select", help="rank frames by what a label would teach; write the top N as tasks",
                              shared=("--config", "--device", "--debug"), description=doc[0], epilog="\n\n".join(doc[1:]),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", type=Path, metavar="SRC", help="a folder of images, an image, or a video file")
    add_model_arguments(p, default_model=None, detector_default=None, flip=False)
    p.add_argument("--count", required=True, type=int, help="how many frames to choose")
    p.add_argument("--out", required=True, type=Path, help="the task file to write")
    p.add_argument("--format", choices=FORMATS, default="labelstudio", help="task file format (default labelstudio)")
    p.add_argument("--exclude", type=Path, default=None, help="COCO file of frames already labelled: skipped")
    p.add_argument("--boxes", type=Path, default=None,
                   help="person boxes (COCO detection results: 'file_name' for images, 'frame' for videos) "
                        "instead of the detector")
    p.add_argument("--every", type=int, default=1, help="videos: score every N-th frame (default 1)")
    p.add_argument("--diversity", type=float, default=0.5,
                   help="0..1: weight of novelty against near-copies of chosen frames (default 0.5; 0 = "
                        "uncertainty alone)")
    p.add_argument("--progress", type=Path, default=None,
                   help="JSON Lines file of every frame's scores (default: OUT + .progress.jsonl)")
    p.add_argument("--resume", action="store_true", help="continue --progress: skip the frames it holds")
    p.add_argument("--frames-dir", type=Path, default=None,
                   help="videos: where the chosen frames are saved as images (default: OUT's name + _frames/)")
    p.add_argument("--image-prefix", default="/data/local-files/?d=",
                   help="labelstudio: the image URL before the file name (default Label Studio's local files)")
    p.add_argument("--mark-below", type=float, default=0.3,
                   help="keypoints scored below this are marked for checking in the tasks (default 0.3)")
    add_mark_by_argument(p)
    p.set_defaults(run=run)
    return p


def check_flags(args):
    """Flags, inputs and outputs, before any model loads. Returns (kind, progress, frames_dir)."""
    from vitpose.files import check_output
    from vitpose.inference.pipeline import classify_source

    check_numbers(("--count", args.count, 1, None), ("--every", args.every, 1, None),
                  ("--diversity", args.diversity, 0.0, 1.0))
    source = args.source.expanduser()
    if not source.exists():
        raise UsageError(f"SRC {source}: not found")
    kind = classify_source(source)
    if kind == "webcam":
        raise UsageError(f"SRC {source}: a webcam has no frames to come back to; record a video first")
    for flag, path in (("--exclude", args.exclude), ("--boxes", args.boxes)):
        if path is not None and not path.expanduser().is_file():
            raise UsageError(f"{flag} {path}: file not found")
    if args.out.suffix.lower() != SUFFIXES[args.format]:
        raise UsageError(f"--out {args.out}: --format {args.format} writes a {SUFFIXES[args.format]} file")
    inputs = [source, args.exclude, args.boxes, Path(args.model) if Path(args.model).exists() else None]
    out = check_output(args.out, "--out", inputs=inputs)
    progress = args.progress or out.with_name(out.name + ".progress.jsonl")
    progress = check_output(progress, "--progress", inputs=inputs + [out])
    if args.resume and not progress.is_file():
        raise UsageError(f"--resume: no progress file {progress} to continue (give --progress, or leave out "
                         f"--resume)")
    frames_dir = None
    if kind == "video":
        frames_dir = check_output(args.frames_dir or out.with_name(out.stem + "_frames"), "--frames-dir", kind="dir",
                                  inputs=inputs)
    return kind, progress, frames_dir


def build_predictor(args):
    """The predictor of the command line through the one door; its flip test's two views are what
    the ranking reads (an exported graph with the flip test inside is refused: it cannot give them)."""
    return open_model(model_options(args), views=True, mark_by=args.mark_below_by)


def run(args) -> int:
    from vitpose.inference.pipeline import read_boxes_file
    from vitpose.labelling.select import labelled_names, select_frames
    from vitpose.run.stop import StopOnSignal

    kind, progress, frames_dir = check_flags(args)
    skip = frozenset(labelled_names(args.exclude.expanduser())) if args.exclude is not None else frozenset()
    boxes = read_boxes_file(args.boxes.expanduser()) if args.boxes is not None else None
    predictor = build_predictor(args)
    with StopOnSignal() as stop:
        scores, completed = select_frames(predictor, args.source.expanduser(), kind, progress, boxes=boxes,
                                          every=args.every, skip=skip, resume=args.resume,
                                          stop=lambda: stop.requested)
    if not completed:
        print(f"interrupted: {len(scores)} frames scored, kept in {progress}; run again with --resume",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    if skip:
        print(f"{len(skip)} labelled frames in {args.exclude} skipped")
    if not scores:
        raise UsageError(f"SRC {args.source}: no frame left to choose from")
    write_choice(args, predictor, scores, kind, frames_dir)
    return EXIT_OK


def write_choice(args, predictor, scores, kind: str, frames_dir) -> None:
    """Choose, write the task file (and a video's frames), print the chosen frames and why."""
    from vitpose.data import annotation_formats
    from vitpose.files import write_atomic
    from vitpose.labelling.select import choose_frames, settle_jumps

    uncertainty = settle_jumps(scores)
    chosen = [scores[i] for i in choose_frames(uncertainty, [s.feature for s in scores], args.count, args.diversity)]
    if kind == "video":
        save_frames(args.source.expanduser(), [s.frame for s in chosen], frames_dir)
    records = [record for s in chosen for record in s.records]
    skeleton = predictor.skeleton
    if args.format == "labelstudio":
        tasks = annotation_formats.to_labelstudio_tasks(records, skeleton.keypoint_names, mark_below=args.mark_below,
                                                        mark_by=args.mark_below_by, image_prefix=args.image_prefix)
        why = {s.item: s for s in chosen}
        for task in tasks:  # the reason travels with the task (a data field Label Studio shows, imports ignore)
            name = annotation_formats.labelstudio_file_name(task["data"]["image"])
            if name in why:
                task["data"]["vitpose_select"] = {k: v for k, v in why[name].signals.items() if k != "after"}
        text = json.dumps(tasks, indent=1)
    elif args.format == "cvat":
        text = annotation_formats.to_cvat_xml(records, skeleton.keypoint_names, skeleton.skeleton,
                                              mark_below=args.mark_below, mark_by=args.mark_below_by)
    else:
        text = json.dumps(records)
    write_atomic(args.out.expanduser(), text)
    empty = sum(not s.records for s in chosen)
    print(f"{len(chosen)} of {len(scores)} frames chosen -> {args.out}"
          + (f" (frames saved in {frames_dir})" if kind == "video" else "")
          + (f"; {empty} of them with nobody found (no task)" if empty else ""))
    print(f"{'frame':<28} {'uncertainty':>11}  signals")
    for s in chosen:
        print(f"{s.item:<28} {uncertainty[scores.index(s)]:>11.3f}  "
              + ", ".join(f"{k} {v:.2f}" for k, v in s.signals.items() if k != "after"))


def save_frames(video: Path, frames: list[int], frames_dir: Path) -> None:
    """The chosen frames of a video as JPEG images, named as in the tasks (`frame_name`)."""
    import cv2

    from vitpose.files import write_image
    from vitpose.labelling.select import iter_frames

    wanted = set(frames)
    frames_dir.mkdir(parents=True, exist_ok=True)
    for name, frame, image in iter_frames(video, "video"):
        if frame in wanted:
            write_image(frames_dir / name, image[:, :, ::-1], params=(cv2.IMWRITE_JPEG_QUALITY, 95))
            wanted.discard(frame)
            if not wanted:
                break
    if wanted:
        raise UsageError(f"SRC {video}: frames {sorted(wanted)[:5]} could not be read again to save them")
