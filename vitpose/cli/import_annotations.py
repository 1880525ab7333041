"""`vitpose import-annotations SRC --format labelstudio|cvat --out train.json`: an annotation tool's
export -> a COCO keypoint file that training, `vitpose check-data` and evaluation read.

    vitpose import-annotations project-1.json --format labelstudio --skeleton my_skeleton.yaml --out data/annotations/train.json
    vitpose import-annotations annotations.xml --format cvat --out data/annotations/train.json

Label Studio: the project's "JSON" export; keypoints are grouped into people by their rectangle
(the keypoint's parentID, else the smallest rectangle that contains it); of several annotations of a
task the newest (created_at) is imported. Its export does not carry the
keypoint order: give it with --skeleton (a skeleton YAML, a built-in name such as coco, or a COCO
file), else the names are taken in the order they first appear.
CVAT: the task's "CVAT for images 1.1" (or "CVAT for video 1.1") export of skeletons; the keypoint
names and limbs come from the skeleton label. CVAT's "COCO Keypoints 1.0" export needs no import:
it already is a COCO keypoint file.

The output's categories[0] carries the keypoint names and limbs: set data.dataset_info to it.
Occluded points get visibility 1, outside or unlabelled ones 0, the others 2. The formats and the
mapping are described in docs/annotations.md.

Exit status: 0; 2 when the export, the skeleton or --out cannot be used (one line says which).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vitpose.errors import EXIT_OK


def add_parser(subparsers) -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = subparsers.add_parser("import-annotations", help="Label Studio / CVAT export -> COCO keypoint file",
                              shared=("--debug",), description=doc[0], epilog="\n\n".join(doc[1:]),
                              formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("source", type=Path, metavar="SRC", help="the tool's export file (.json / .xml)")
    p.add_argument("--format", required=True, choices=("labelstudio", "cvat"), help="the tool that wrote SRC")
    p.add_argument("--out", required=True, type=Path, help="the COCO keypoint file to write")
    p.add_argument("--skeleton", default=None,
                   help="keypoint order and limbs: a skeleton YAML, a built-in name (coco, ...) or a COCO file "
                        "(default: the export's own names)")
    p.add_argument("--label", default=None, help="CVAT: the skeleton label to import (default: the only one)")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    """`vitpose import-annotations`; returns the exit status. A bad export, skeleton or --out is a
    UserError, which vitpose.cli's one handler prints as one line."""
    return _run(args)


def _check_out(args) -> None:
    """--out before the work (`vitpose.files.check_output`: not an input, not a folder, not under a
    file, a folder in which a file can be created); a device or pipe (`--out /dev/stdout`) is fine."""
    from vitpose.data.annotation_formats import AnnotationFormatError
    from vitpose.files import check_output, stream_kind

    out = args.out.expanduser()
    inputs = [args.source] + ([Path(args.skeleton)] if args.skeleton and Path(args.skeleton).exists() else [])
    if any(out.exists() and p.exists() and out.resolve() == p.resolve() for p in inputs):
        raise AnnotationFormatError(f"--out {out} is an input file; write the COCO file elsewhere", field="--out")
    if out.is_dir():
        raise AnnotationFormatError(f"--out {out} is a directory; give a file name such as {out / 'train.json'}",
                                    field="--out")
    if stream_kind(out) is None and out.suffix.lower() != ".json":
        raise AnnotationFormatError(f"--out {out} should end in .json (a COCO keypoint file)", field="--out")
    check_output(out, "--out", "file", inputs, streams=True)


def _run(args) -> int:
    from vitpose.data.annotation_formats import read_export, to_coco
    from vitpose.files import STDOUT, stream_kind, write_atomic

    _check_out(args)  # before the work: a bad --out never costs a long import
    draft = read_export(args.source.expanduser(), args.format, skeleton=args.skeleton, label=args.label)
    coco = to_coco(draft)
    out = args.out.expanduser()
    # atomic (a new, exclusively created temp file renamed into place: a crash never leaves half a
    # file, a link planted beside --out is never written through); a device or pipe directly
    report = sys.stderr if stream_kind(out) == STDOUT else sys.stdout
    write_atomic(out, json.dumps(coco, indent=1))
    print_summary(draft, coco, args, out, report)
    return EXIT_OK


def print_summary(draft, coco: dict, args, out: Path, report=None) -> None:
    report = report or sys.stdout
    names = coco["categories"][0]["keypoints"]
    counts = [0] * len(names)
    for ann in coco["annotations"]:
        for k in range(len(names)):
            counts[k] += ann["keypoints"][3 * k + 2] > 0
    print(f"{len(coco['images'])} images, {len(coco['annotations'])} people from {draft.tool} export {args.source}",
          file=report)
    print("keypoints (labelled people): " + ", ".join(f"{n} ({c})" for n, c in zip(names, counts)), file=report)
    if args.skeleton is None and args.format == "labelstudio":
        print("note: the keypoint order is the order the names first appear in the export; give --skeleton "
              "FILE.yaml to fix it", file=sys.stderr)
    for reason, count in draft.skipped.items():
        print(f"note: {count} {reason}", file=sys.stderr)
    print(f"written: {out}  (set data.dataset_info: {out} so training reads the skeleton from it)", file=report)
