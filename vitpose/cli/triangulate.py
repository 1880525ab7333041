"""`vitpose triangulate CAM1.jsonl CAM2.jsonl ... --calibration CAMS.toml --out P.trc`: 3D keypoints
from the 2D poses of several calibrated cameras, as OpenSim's marker file.

    vitpose predict cam1.mp4 --track --json cam1.jsonl      # one run per camera (docs/3d.md)
    vitpose triangulate cam1.jsonl cam2.jsonl cam3.jsonl --calibration Calib.toml --out trial.trc

The calibration is the TOML aniposelib's CameraGroup.dump or Pose2Sim's calibration writes; the
files are its cameras in the file's order (or named with --cameras). People are matched across
cameras by epipolar distance (or by track id with --match ids); each keypoint is triangulated by a
DLT weighted by its confidence (the record's `p` where given, else its score), views whose
reprojection error is an outlier are dropped, and --refine smooths each track (zero lag, gaps
filled) and holds its limb lengths. Written: OUT (OUT_2, ... for more people) and the
reprojection error of every point (--errors, default OUT with .errors.csv).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vitpose.cli.options import check_numbers
from vitpose.errors import EXIT_OK, UsageError
from vitpose.multiview.run import TriangulateOptions, triangulate_files


def add_parser(subparsers) -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = subparsers.add_parser("triangulate", help="3D keypoints (.trc) from several calibrated cameras' JSON Lines",
                              shared=("--debug",), description=doc[0], epilog="\n\n".join(doc[1:]),
                              formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("views", type=Path, nargs="+", metavar="CAM.jsonl",
                   help="each camera's vitpose predict --json file, in the calibration's camera order")
    p.add_argument("--calibration", type=Path, required=True, metavar="CAMS.toml",
                   help="the cameras: aniposelib's or Pose2Sim's calibration TOML")
    p.add_argument("--out", type=Path, required=True, metavar="P.trc", help="the marker file (OpenSim / Pose2Sim .trc)")
    p.add_argument("--errors", type=Path, default=None, metavar="FILE.csv",
                   help="reprojection error per point (default: OUT with the suffix .errors.csv)")
    p.add_argument("--cameras", default=None, metavar="NAME,...",
                   help="the calibration's camera of each file, by name (default: the files in its order)")
    p.add_argument("--fps", type=float, default=30.0, help="frames per second of the videos (default: %(default)s)")
    p.add_argument("--units", default="m", help="the calibration's unit, written in the .trc (default: %(default)s)")
    p.add_argument("--up", choices=("z", "y"), default="z",
                   help="the calibration world's up axis; z is written Y-up as OpenSim wants, as Pose2Sim does "
                        "(default: %(default)s)")
    p.add_argument("--min-score", type=float, default=0.3,
                   help="keypoints below this confidence are not used (default: %(default)s)")
    p.add_argument("--max-error", type=float, default=15.0,
                   help="reprojection error in pixels above which views are dropped; 0 keeps every view "
                        "(default: %(default)s)")
    p.add_argument("--max-epipolar", type=float, default=40.0,
                   help="pixels: detections further apart than this are not the same person (default: %(default)s)")
    p.add_argument("--match", choices=("auto", "ids"), default="auto",
                   help="auto: people matched across cameras by epipolar distance; ids: the same track id is the "
                        "same person in every camera (default: %(default)s)")
    p.add_argument("--refine", action="store_true",
                   help="smooth each track (zero lag, gaps filled) and hold its limb lengths")
    p.add_argument("--cutoff", type=float, default=6.0, help="--refine's cut-off frequency, Hz (default: %(default)s)")
    p.add_argument("--max-gap", type=int, default=10, help="--refine fills gaps of up to this many frames "
                                                            "(default: %(default)s)")
    p.add_argument("--keypoint-names", default=None, metavar="NAME,...",
                   help="the markers' names (default: COCO-17's for 17 keypoints, else keypoint1, ...)")
    p.set_defaults(run=run)
    return p


def names(text: str | None) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",")) if text else ()


def triangulate_options(args) -> TriangulateOptions:
    """The parsed flags, checked, as the library's options."""
    check_numbers(("--fps", args.fps, 1, None), ("--min-score", args.min_score, 0.0, 1.0),
                  ("--max-error", args.max_error, 0, None), ("--max-epipolar", args.max_epipolar, 1, None),
                  ("--max-gap", args.max_gap, 0, None),
                  ("--cutoff", args.cutoff, 0.1, args.fps / 2, f" (half of --fps {args.fps:g})"))
    for flag, text in (("--units", args.units), *(("--keypoint-names", n) for n in names(args.keypoint_names))):
        if not text or any(c in text for c in "\t\r\n"):  # the .trc is tab-separated, one row a line
            raise UsageError(f"{flag} {text!r}: give a name without tabs or line breaks (the .trc separates by them)")
    return TriangulateOptions(
        views=tuple(args.views), calibration=args.calibration, out=args.out, errors=args.errors,
        cameras=names(args.cameras), fps=args.fps, units=args.units, up=args.up, min_score=args.min_score,
        max_error=args.max_error or None, max_epipolar=args.max_epipolar, match=args.match, refine=args.refine,
        cutoff=args.cutoff, max_gap=args.max_gap, keypoint_names=names(args.keypoint_names))


def run(args) -> int:
    summary = triangulate_files(triangulate_options(args))
    for line in summary.lines():
        print(line)
    return EXIT_OK
