"""`vitpose audit --model M --annotations COCO.json --images DIR --out report.html`: find label errors.

    vitpose audit --model work_dirs/mine/best.pth --annotations data/train.json --images data/train \\
        --out audit.html --out audit.json --tasks review.json

Ranks the labelled people of a COCO keypoint file by how likely their label is wrong, against the
model's prediction in the label's own box: left/right swaps (the skeleton's flip pairs), keypoints
far from a confident prediction (against the box size and the keypoint's sigma), visibility flags
unlikely under what the model sees (a classifier learnt from the file itself), boxes that miss
their keypoints; each with its reason
(vitpose/labelling/audit.py, docs/labelling.md). --out FILE.json writes the whole ranking,
--out FILE.html a page with the label and the prediction drawn on each flagged person's crop
(both may be given); --tasks writes the flagged people as Label Studio (.json) or CVAT (.xml)
tasks for review, the suspect keypoints marked.

Every audited image is a line of the --progress file (JSON Lines) as it is done: an interrupted
run keeps them and `--resume` continues.

Exit status: 0; 2 when an input, a flag or an output cannot be used (one line says which); 130
when interrupted (run again with --resume).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vitpose.cli.options import add_model_arguments, model_options, open_model
from vitpose.errors import EXIT_INTERRUPTED, EXIT_OK, UsageError


def add_parser(subparsers) -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = subparsers.add_parser("audit", help="rank labelled people by how likely their label is wrong",
                              shared=("--config", "--device", "--debug"), description=doc[0],
                              epilog="\n\n".join(doc[1:]), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p, default_model=None, detector=False, flip=False)  # the labels' boxes, both views
    p.add_argument("--annotations", required=True, type=Path, help="the COCO keypoint file to audit")
    p.add_argument("--images", required=True, type=Path, help="the folder of its images")
    p.add_argument("--out", required=True, type=Path, action="append",
                   help="report.json (every instance, ranked) and/or report.html (flagged, drawn); repeatable")
    p.add_argument("--tasks", type=Path, default=None,
                   help="the flagged people as review tasks: FILE.json (Label Studio) or FILE.xml (CVAT)")
    p.add_argument("--flag", type=float, default=0.3,
                   help="suspicion from which a person is flagged (HTML and tasks; default 0.3)")
    p.add_argument("--top", type=int, default=None, help="flag at most this many people (the most suspicious)")
    p.add_argument("--progress", type=Path, default=None,
                   help="JSON Lines file of each image's audit (default: the first --out + .progress.jsonl)")
    p.add_argument("--resume", action="store_true", help="continue --progress: skip the images it holds")
    p.add_argument("--image-prefix", default="/data/local-files/?d=",
                   help="Label Studio tasks: the image URL before the file name")
    p.set_defaults(run=run)
    return p


def check_flags(args) -> Path:
    """Inputs and outputs before any model loads; returns the progress file."""
    from vitpose.files import check_output

    if not args.annotations.expanduser().is_file():
        raise UsageError(f"--annotations {args.annotations}: file not found")
    if not args.images.expanduser().is_dir():
        raise UsageError(f"--images {args.images}: not a folder")
    if args.top is not None and args.top < 1:
        raise UsageError(f"--top must be at least 1, got {args.top}")
    inputs = [args.annotations, args.images, Path(args.model) if Path(args.model).exists() else None]
    outs = []
    for out in args.out:
        if out.suffix.lower() not in (".json", ".html"):
            raise UsageError(f"--out {out}: give a .json (ranking) or .html (report) file")
        outs.append(check_output(out, "--out", inputs=inputs + outs))
    if len({o.suffix.lower() for o in outs}) != len(outs):
        raise UsageError("--out: give at most one .json and one .html")
    if args.tasks is not None:
        if args.tasks.suffix.lower() not in (".json", ".xml"):
            raise UsageError(f"--tasks {args.tasks}: give FILE.json (Label Studio) or FILE.xml (CVAT)")
        outs.append(check_output(args.tasks, "--tasks", inputs=inputs + outs))
    progress = args.progress or outs[0].with_name(outs[0].name + ".progress.jsonl")
    progress = check_output(progress, "--progress", inputs=inputs + outs)
    if args.resume and not progress.is_file():
        raise UsageError(f"--resume: no progress file {progress} to continue")
    return progress


def run(args) -> int:
    from vitpose.labelling.audit import audit_annotations, read_labels
    from vitpose.run.stop import StopOnSignal

    progress = check_flags(args)
    predictor = open_model(model_options(args), views=True)  # the flip test's two views are evidence
    labels = read_labels(args.annotations.expanduser(), predictor.skeleton.num_keypoints)
    if not labels:
        raise UsageError(f"--annotations {args.annotations}: no labelled person to audit")
    with StopOnSignal() as stop:
        lines, completed = audit_annotations(predictor, labels, args.images.expanduser(), progress,
                                             resume=args.resume,
                                             stop=lambda: stop.requested)
    if not completed:
        print(f"interrupted: {len(lines)} of {len(labels)} images audited, kept in {progress}; run again with "
              f"--resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    write_reports(args, predictor, labels, lines)
    return EXIT_OK


def write_reports(args, predictor, labels, lines) -> None:
    from vitpose.data import annotation_formats
    from vitpose.files import write_atomic
    from vitpose.labelling.audit import html_report, ranked, review_records

    rows = ranked(labels, lines, predictor.skeleton)
    flagged = [row for row in rows if row["suspicion"] >= args.flag][: args.top]
    skeleton = predictor.skeleton
    for out in args.out:
        if out.suffix.lower() == ".json":
            counts = {name: sum(row["checks"].get(name, 0) > 0 for row in flagged)
                      for name in ("swap", "far", "visibility", "box")}
            write_atomic(out.expanduser(), json.dumps({
                "annotations": str(args.annotations), "model": str(args.model), "flag": args.flag,
                "instances": len(rows), "flagged": len(flagged), "flagged_by_check": counts, "ranking": rows},
                indent=1))
        else:
            write_atomic(out.expanduser(), html_report(flagged, labels, lines, args.images.expanduser(), skeleton,
                                                       f"vitpose audit of {args.annotations.name}"))
    if args.tasks is not None:
        records = review_records(flagged, labels, lines, skeleton.keypoint_names)
        if args.tasks.suffix.lower() == ".json":
            tasks = annotation_formats.to_labelstudio_tasks(records, skeleton.keypoint_names, mark_below=0.5,
                                                            mark_by="score", image_prefix=args.image_prefix,
                                                            model_version="vitpose audit")
            reasons = {}
            for row in flagged:
                reasons.setdefault(row["image"], []).extend(f"id {row['annotation_id']}: {r}" for r in row["reasons"])
            for task in tasks:
                name = annotation_formats.labelstudio_file_name(task["data"]["image"])
                task["data"]["vitpose_audit"] = reasons.get(name, [])
            text = json.dumps(tasks, indent=1)
        else:
            text = annotation_formats.to_cvat_xml(records, skeleton.keypoint_names, skeleton.skeleton, mark_below=0.5,
                                                  mark_by="score")
        write_atomic(args.tasks.expanduser(), text)
    print(f"{len(rows)} labelled people audited, {len(flagged)} flagged (suspicion >= {args.flag:g})"
          + "".join(f"; written: {o}" for o in args.out) + (f"; tasks: {args.tasks}" if args.tasks else ""))
    print(f"{'#':>4} {'suspicion':>9}  {'image':<24} {'id':>8}  reasons")
    for rank, row in enumerate(flagged[:20], 1):
        print(f"{rank:>4} {row['suspicion']:>9.2f}  {row['image']:<24} {row['annotation_id']:>8}  "
              + "; ".join(row["reasons"][:2]))
