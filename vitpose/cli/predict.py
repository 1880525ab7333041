"""`vitpose predict SOURCE`: poses of every person in images, a directory, a video or a webcam.

    vitpose predict photo.jpg --out drawn/                     # downloads vitpose-b-simple once
    vitpose predict images/ --json poses.jsonl --model vitpose-l
    vitpose predict val2017/ --boxes dets.json --detector none --json results.jsonl
    vitpose predict clip.mp4 --out drawn/ --track --smooth     # video files and webcams (0, 1, ...)
    vitpose predict clip.mp4 --json poses.jsonl --track --smooth offline   # a recorded video, zero lag

Every source goes through the same steps (`vitpose.inference.pipeline`): boxes (the detector,
`--detector full-frame`, or `--boxes`), crops, the model, heatmap decode. Images: the crops of
`--batch-images` images go through the model together; `--out` gets the drawn image under the same
name. Video files and webcam indices go to `vitpose.inference.video.run_video`.

For folders, videos and webcams `--json` is written as it goes, as JSON Lines (one COCO keypoint
result per line, flushed after every image or frame); for image files named on the command line it
is one COCO results list. Each record: `image_id`, `file_name` (images) or `frame` (videos), `category_id` 1,
`bbox` [x, y, w, h], `keypoints` [x1, y1, s1, ...], `bbox_score`, `score` (= bbox_score x the mean
of the keypoint scores above 0.2: the evaluator's instance score), `track_id` with --track.
Non-finite values are written as null. `--json-array` writes one JSON list (what `COCO.loadRes`
reads) at the end instead (images and video files). `image_id` is the file name's number when
every file name is a number (000000197388.jpg -> 197388; two names with one number are an
error), else a running index, and then `--boxes` records are matched by `file_name`.

Safety: outputs are checked before any work (folder vs file, parent exists, writable) and may not
replace an input (a source image or video, the --boxes file, the model) or each other (--json named
like a drawing). An existing --json is replaced only when the run completes (until then the results
go to a new `.<json>.XXXXXXXX.partial` beside it, created exclusively); `--resume` continues that
file when a stopped run left one, else the --json itself: the images or frames in it are skipped
(with --track the people keep their ids). `--json /dev/stdout` (or another device or pipe) is
written directly, and the summary goes to stderr. Drawings keep the image's name, or get `.png`
added when its format cannot hold colour (.pgm). SIGINT / SIGTERM (Ctrl-C)
finish the current images or frames, close the files (a playable video, a parseable JSON) and
exit 130; a second signal stops at once.

Exit status (`vitpose.errors.EXIT_STATUSES`): 0 all done; 1 some inputs failed (unreadable
images, frames that failed; each is counted, skipped and named at the end); 2 nothing done (usage,
model, outputs); 70 a bug (its traceback); 130 interrupted.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vitpose.cli.options import add_mark_by_argument, add_model_arguments, check_numbers, model_options, open_model
from vitpose.errors import UsageError
from vitpose.inference.dispatch import check_outputs, read_boxes  # noqa: F401 - public here too
from vitpose.inference.images import drawing_names, output_names, predict_images  # noqa: F401 - public here too
from vitpose.inference.pose_formats import POSE_FORMATS
from vitpose.inference.runner import PredictOptions
from vitpose.run.sources import list_images  # noqa: F401 - public here too

STAGES = ("decode", "detect", "crop", "pose", "decode heatmaps", "draw", "write")


class SmoothAction(argparse.Action):
    """`--smooth [live|offline]`. A bare `--smooth` written before the source (`--smooth clip.mp4`) meant
    the live filter before the flag took a value: such a value is a source, kept in `smooth_sources`."""

    def __call__(self, parser, namespace, value, option_string=None):
        if value in ("live", "offline"):
            namespace.smooth = value
        else:
            namespace.smooth = "live"
            namespace.smooth_sources = [*getattr(namespace, "smooth_sources", []), value]


def add_parser(subparsers) -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = subparsers.add_parser("predict", help="poses in images, directories, videos or a webcam",
                              shared=("--config", "--device", "--debug"), description=doc[0], epilog="\n\n".join(doc[1:]),
                              formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("source", nargs="*",
                   help="images and directories of images, or one video file or webcam index (0, 1, ...)")
    add_model_arguments(p)
    p.add_argument("--boxes", type=Path, default=None,
                   help="person boxes from a COCO detection results JSON (image_id or file_name, or frame for "
                        "videos; bbox xywh; score)")
    p.add_argument("--out", type=Path, default=None, help="directory for the drawn images (or video, or a video file)")
    p.add_argument("--json", type=Path, default=None, help="write the COCO keypoint results here (JSON Lines for folders, videos and webcams; a list for image files)")
    p.add_argument("--json-array", action="store_true",
                   help="--json as one JSON list written at the end (images and video files, not webcams)")
    p.add_argument("--resume", action="store_true", help="continue --json: skip the images or frames it holds")
    p.add_argument("--format", choices=("coco", "labelstudio", "cvat", *POSE_FORMATS), default="coco",
                   help="--json layout: COCO results; pre-annotations of images to correct in Label Studio (tasks "
                        "with predictions) or CVAT (CVAT for images 1.1 XML), see docs/annotations.md; or what 3D "
                        "tools read: openpose (--json names a folder of per-frame *_keypoints.json, Pose2Sim), dlc "
                        "(DeepLabCut's .csv or .h5, anipose), alphapose (.json, MotionBERT), nwb (a video's .nwb with "
                        "ndx-pose), see docs/formats3d.md (default: %(default)s)")
    p.add_argument("--mark-below", type=float, default=0.3,
                   help="labelstudio/cvat: keypoints scored below this are marked for checking, not dropped "
                        "(default: %(default)s)")
    add_mark_by_argument(p)
    p.add_argument("--rescore", choices=("none", "calibrated"), default="none",
                   help="calibrated: each person's score from its keypoints' calibrated p (box score x mean p above "
                        "0.2), only for a model whose calibration records that the AP gate kept it (`vitpose evaluate "
                        "--rescore calibrated` measures it; docs/calibration.md §5.6; default: %(default)s)")
    p.add_argument("--track", action="store_true", help="video: stable person ids (track_id)")
    p.add_argument("--smooth", nargs="?", const="live", default=None, action=SmoothAction, metavar="live|offline",
                   help="video: less keypoint jitter per track. live (the default of a bare --smooth): the causal "
                        "One-Euro filter, for webcams and streams; offline: a recorded video's whole tracks, gaps "
                        "filled and a zero-lag confidence-weighted Savitzky-Golay filter (works with --segment; "
                        "docs/smoothing.md)")
    p.add_argument("--smooth-gap", type=int, default=None, metavar="N",
                   help="--smooth offline: fill gaps of up to N frames in a track; longer gaps stay missing "
                        "(default: 10)")
    p.add_argument("--smooth-cutoff", type=float, default=None, metavar="HZ",
                   help="--smooth offline: the filter's -3 dB frequency in Hz at the video's frame rate "
                        "(default: 6, as Pose2Sim's Butterworth)")
    p.add_argument("--det-every", type=int, default=1, metavar="N",
                   help="video: run the detector on every N-th frame and carry people between on their previous "
                        "poses (again at once when someone's score halves; default: every frame)")
    p.add_argument("--batch-images", type=int, default=8, help="images per model call (default: %(default)s)")
    p.add_argument("--keypoint-threshold", type=float, default=0.3,
                   help="drawing: keypoints with a lower score are not drawn (default: %(default)s)")
    add_shard_arguments(p)
    p.set_defaults(run=run)
    return p


def add_shard_arguments(p) -> None:
    """Many processes, GPUs and machines (vitpose.inference.sharded; README "Many GPUs, many machines")."""
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="run the work units (images, or --segment frame ranges) whose id hashes to K mod N; "
                        "--json names a directory (or a pattern with {shard}) for one JSON Lines file per shard, "
                        "joined by `vitpose merge`. Default: torchrun's RANK/WORLD_SIZE, else SLURM_PROCID/NTASKS "
                        "and SLURM_ARRAY_TASK_ID/COUNT, else one process")
    p.add_argument("--segment", type=int, default=None, metavar="FRAMES",
                   help="a video as units of FRAMES frames (sharded and resumed apart; track ids joined by merge)")
    p.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                   help="start N processes here, shard k/N each (one GPU each where there are GPUs)")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="ray: the units go to a pool of Ray actors (pip install 'vitpose[ray]'); the same shard "
                        "files (default: %(default)s)")
    p.add_argument("--workers", type=int, default=None, metavar="N", help="--engine ray: model actors (default 1)")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="--engine ray: a running cluster (default: a local one on this machine's CPUs and GPUs)")


# ----------------------------------------------------------------------------------------------
# Sources and outputs, all checked before the model loads


# ----------------------------------------------------------------------------------------------
# The command


def build_predictor(model_options, mark_by: str = "auto"):
    """The predictor of the command line through the one door (the model downloads here when it is
    not cached); `--mark-below-by p` refused there for a model without a calibration."""
    return open_model(model_options, mark_by=mark_by)


def predict_options(args) -> PredictOptions:
    """The typed options of the command line (checked here, before any work)."""
    _check_flags(args)
    return PredictOptions(
        sources=given_sources(args), model=model_options(args), boxes=args.boxes, out=args.out,
        json=args.json, json_array=args.json_array, resume=args.resume, format=args.format, mark_below=args.mark_below,
        mark_by=args.mark_below_by, rescore=args.rescore,
        keypoint_threshold=args.keypoint_threshold, track=args.track, smooth=args.smooth or False,
        smooth_gap=PredictOptions.smooth_gap if args.smooth_gap is None else args.smooth_gap,
        smooth_cutoff=PredictOptions.smooth_cutoff if args.smooth_cutoff is None else args.smooth_cutoff,
        det_every=args.det_every,
        batch_images=args.batch_images, shard=args.shard, segment=args.segment, nproc_per_node=args.nproc_per_node,
        engine=args.engine, workers=args.workers, ray_address=args.ray_address, argv=tuple(getattr(args, "argv", ())))


def given_sources(args) -> tuple[str, ...]:
    """The sources in the order given (one written right after a bare `--smooth` included)."""
    sources = (*getattr(args, "smooth_sources", ()), *(str(x) for x in args.source))
    if not sources:
        raise UsageError("vitpose predict: give at least one image, folder of images, video file or webcam index")
    return sources


def _check_flags(args) -> None:
    for flag, value in (("--smooth-gap", args.smooth_gap), ("--smooth-cutoff", args.smooth_cutoff)):
        if value is not None and args.smooth != "offline":
            raise UsageError(f"{flag} sets up --smooth offline; add --smooth offline or leave out {flag}")
    check_numbers(("--batch-images", args.batch_images, 1, None),
                  ("--det-every", args.det_every, 1, None, " (1 = the detector on every frame)"),
                  ("--keypoint-threshold", args.keypoint_threshold, 0.0, 1.0),
                  ("--mark-below", args.mark_below, 0.0, 1.0, " (as vitpose serve's)"),
                  ("--smooth-gap", args.smooth_gap, 0, None, " frames"))
    if args.smooth_cutoff is not None and not args.smooth_cutoff > 0:
        raise UsageError(f"--smooth-cutoff must be > 0 Hz, got {args.smooth_cutoff}")
    if args.format != "coco" and args.json is None:
        raise UsageError(f"--format {args.format} writes to --json (a {'folder' if args.format == 'openpose' else 'file'}"
                         f"); give --json")
    if args.format != "coco" and args.resume:
        raise UsageError(f"--resume continues COCO JSON Lines; --format {args.format} writes one whole file")
    if args.format in POSE_FORMATS:
        sharded = [flag for flag, given in (("--shard", args.shard), ("--segment", args.segment),
                                            ("--nproc-per-node", args.nproc_per_node),
                                            ("--engine ray", args.engine == "ray")) if given]
        if sharded:
            raise UsageError(f"--format {args.format} with {sharded[0]}: shards write JSON Lines; join them with vitpose "
                             f"merge, then write {args.format} with vitpose convert")
    if args.boxes is not None and args.detector not in (None, "none"):
        raise UsageError("--boxes gives the person boxes: leave out --detector (or say --detector none)")
    if args.rescore != "none" and args.engine == "ray":
        raise UsageError("--rescore calibrated runs with the local engine; leave out --engine ray")
    if args.boxes is None and args.detector == "none":
        raise UsageError("--detector none needs the boxes from --boxes FILE.json (or use --detector full-frame)")


def check_rescore_kept(predictor) -> None:
    """`--rescore calibrated` only for a model whose recorded calibration says the AP gate kept it."""
    from vitpose.evaluation.rescoring import RESCORE_KEPT, RescoreError, rescore_kept

    spec, model = getattr(predictor, "spec", None), getattr(predictor, "model", None)
    if spec is None and model is not None:  # a Predictor: the spec its loaded model carries
        from vitpose.models.wrappers import unwrap_model

        spec = getattr(unwrap_model(model), "spec", None)
    if not rescore_kept(spec):
        raise RescoreError("--rescore calibrated: the model file records no calibration whose rescoring the AP gate "
                           f"kept ({RESCORE_KEPT}); `vitpose calibrate` fits one, `vitpose evaluate --rescore calibrated` "
                           "measures it; leave out the flag")


def run(args) -> int:
    """`vitpose predict`; returns the exit status. Errors that are the user's are UserErrors, which
    the command's one handler (vitpose.cli.run_command) prints as one line; a second Ctrl-C reaches
    it as KeyboardInterrupt after the files were closed on the way out."""
    from vitpose.inference import dispatch, sharded

    run = dispatch.prepare(predict_options(args))  # everything checked before the model loads
    if run.spawn:
        return sharded.spawn_shards(run.options)
    predictor = build_predictor(run.options.model, run.options.mark_by)
    if run.options.rescore == "calibrated":
        check_rescore_kept(predictor)
    if run.options.engine == "ray":  # the model runs in Ray's actors; opened here first all the same, so
        from vitpose.integrations.ray import (
            predict_with_ray,  # a mistake in its flags is one line, not each actor's death
        )

        del predictor
        if run.plan is not None:
            run.plan.announce()
        return predict_with_ray(run.options, run.plan, run.boxes)
    return dispatch.run_local(run, predictor)


