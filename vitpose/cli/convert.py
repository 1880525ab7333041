"""`vitpose convert RUN.jsonl --format F --out PATH`: a run's results as the files 3D and behaviour tools read.

    vitpose predict cam1.mp4 --track --json cam1.jsonl
    vitpose convert cam1.jsonl --format openpose --out pose/cam1_json   # Pose2Sim: *_keypoints.json per frame
    vitpose convert cam1.jsonl --format dlc --out cam1.h5               # anipose / aniposelib (.h5), or .csv
    vitpose convert cam1.jsonl --format alphapose --out cam1.json       # MotionBERT (idx = track id)
    vitpose convert cam1.jsonl --format nwb --fps 30 --out cam1.nwb     # NWB with ndx-pose (pip install "vitpose[nwb]")

RUN is what `vitpose predict --json` wrote for one video or one folder of images (JSON Lines, or
one JSON list); the file is the same as `vitpose predict --format F` would have written on that run
(docs/formats3d.md). The keypoint names and limbs are the skeleton's: `--skeleton` (a built-in name
or a skeleton file), else the one of the run config `--config`, else COCO's for 17 keypoints. The
per-keypoint confidence is the calibrated `p` where the records have it, else the keypoint score.

The output is checked before the work (a folder for openpose, a file for the others; never RUN
itself) and written beside its place, then renamed into it. Reads JSON only: no torch.
Exit status: 0 written; 2 a file, flag or record that cannot be used (one line naming it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vitpose.errors import EXIT_OK, UsageError
from vitpose.inference.pose_formats import POSE_FORMATS


def add_parser(subparsers) -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = subparsers.add_parser("convert", help="a run's JSON Lines as OpenPose, DeepLabCut, AlphaPose or NWB files",
                              shared=("--config", "--debug"), description=doc[0], epilog="\n\n".join(doc[1:]),
                              formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("results", type=Path, metavar="RUN", help="the --json file of vitpose predict (JSON Lines or a JSON list)")
    p.add_argument("--format", choices=POSE_FORMATS, required=True,
                   help="openpose: a folder of per-frame *_keypoints.json; dlc: DeepLabCut's .csv or .h5; "
                        "alphapose: one .json; nwb: a video's .nwb with ndx-pose")
    p.add_argument("--out", type=Path, required=True, help="the folder (openpose) or file to write")
    p.add_argument("--skeleton", default=None, metavar="NAME|FILE",
                   help="the keypoints' names and limbs: a built-in skeleton (coco, mpii, ap10k, ...), a skeleton "
                        "YAML or a COCO annotation file (default: --config's, else coco for 17 keypoints)")
    p.add_argument("--stem", default=None,
                   help="openpose: the video's name in the file names, NAME_<frame>_keypoints.json (default: RUN's "
                        "file name without its suffix)")
    p.add_argument("--fps", type=float, default=None, help="nwb: the video's frame rate (the series' timestamps)")
    p.set_defaults(run=run)
    return p


def _skeleton(args, num_keypoints: int):
    """The skeleton of --skeleton, else --config's, else COCO's for 17 keypoints (one line otherwise)."""
    from vitpose.data.errors import DataError
    from vitpose.data.metainfo import dataset_info, dataset_info_path

    if args.skeleton is not None and args.config is not None:
        raise UsageError("--skeleton and --config both name the skeleton; give one")
    try:
        if args.skeleton is not None:
            return dataset_info(args.skeleton)
        if args.config is not None:
            from vitpose.config import load_config

            return dataset_info(dataset_info_path(load_config(args.config)))
    except DataError as e:
        raise UsageError(f"{'--skeleton' if args.skeleton is not None else '--config'}: {e}") from None
    if num_keypoints in (0, 17):
        return dataset_info("coco")
    raise UsageError(f"{args.results}: the records have {num_keypoints} keypoints; name their skeleton with --skeleton "
                     f"NAME|FILE or --config (the model's training config)")


def _check_flags(args) -> None:
    if args.fps is not None and not 0 < args.fps < float("inf"):
        raise UsageError(f"--fps must be a frame rate > 0, got {args.fps}")
    if args.format == "nwb" and args.fps is None:
        raise UsageError("--format nwb: give the video's frame rate with --fps (the series' timestamps)")
    if args.format != "nwb" and args.fps is not None:
        raise UsageError(f"--fps sets NWB's timestamps; --format {args.format} has none: leave it out")
    if args.stem is not None and args.format != "openpose":
        raise UsageError(f"--stem names OpenPose's files; --format {args.format} writes one file: leave it out")


def run(args) -> int:
    from vitpose.files import check_output
    from vitpose.inference.pose_formats import check_format_output, output_kind, write_pose_format
    from vitpose.inference.pose_table import read_run

    _check_flags(args)
    if not args.results.is_file():
        raise UsageError(f"{args.results}: no such file (the --json of vitpose predict)")
    check_output(args.out, "--out", output_kind(args.format), inputs=[args.results])
    records = read_run(args.results)
    video = bool(records) and "frame" in records[0]
    check_format_output(args.format, args.out, "--out", video=video or args.format != "nwb")
    num_keypoints = len(records[0]["keypoints"]) // 3 if records else 0
    skeleton = _skeleton(args, num_keypoints)
    stem = args.stem or args.results.stem
    where = write_pose_format(records, args.format, args.out, skeleton, stem=stem, fps=args.fps, source=str(args.results),
                              video=video if records else None,
                              skeleton_flag="--skeleton or --config")
    print(f"{len(records)} poses of {args.results} written as {args.format}: {where}")
    return EXIT_OK
