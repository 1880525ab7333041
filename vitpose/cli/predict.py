"""`vitpose predict SOURCE`: poses of every person in images, a directory, a video or a webcam.

    vitpose predict photo.jpg --out drawn/                     # downloads vitpose-b-simple once
    vitpose predict images/ --json poses.jsonl --model vitpose-l
    vitpose predict val2017/ --boxes dets.json --detector none --json results.jsonl
    vitpose predict clip.mp4 --out drawn/ --track --smooth     # video files and webcams (0, 1, ...)

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
import os
import sys
from dataclasses import replace
from pathlib import Path

from vitpose.cli.options import add_model_arguments, model_options, open_model
from vitpose.errors import UsageError
from vitpose.files import check_output
from vitpose.inference.images import drawing_names, output_names, predict_images  # noqa: F401 - public here too
from vitpose.inference.pipeline import image_ids, read_boxes_file
from vitpose.inference.runner import PredictOptions
from vitpose.run.sources import classify_source, list_images
from vitpose.run.stop import StopOnSignal

STAGES = ("decode", "detect", "crop", "pose", "decode heatmaps", "draw", "write")


def add_parser(subparsers) -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = subparsers.add_parser("predict", help="poses in images, directories, videos or a webcam",
                              shared=("--config", "--device", "--debug"), description=doc[0], epilog="\n\n".join(doc[1:]),
                              formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("source", nargs="+",
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
    p.add_argument("--format", choices=("coco", "labelstudio", "cvat"), default="coco",
                   help="--json layout: COCO results, or pre-annotations to correct in Label Studio (tasks with "
                        "predictions) or CVAT (CVAT for images 1.1 XML); see docs/annotations.md (default: %(default)s)")
    p.add_argument("--mark-below", type=float, default=0.3,
                   help="labelstudio/cvat: keypoints scored below this are marked for checking, not dropped "
                        "(default: %(default)s)")
    p.add_argument("--track", action="store_true", help="video: stable person ids (track_id)")
    p.add_argument("--smooth", action="store_true", help="video: One-Euro filter on the keypoints")
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


def check_outputs(options: PredictOptions, inputs: list[Path], video_source=None) -> None:
    """--out, --json and their combinations (see the module docstring), before any work
    (`vitpose.files.check_output`: folder vs file, a path under a file, writable, not an input;
    --json may be a device or pipe such as /dev/stdout, a drawn video may not)."""
    from vitpose.files import stream_kind

    if options.resume and options.json is None:
        raise UsageError("--resume continues the --json file: give --json")
    if options.resume and options.json_array:
        raise UsageError("--resume continues JSON Lines; leave out --json-array")
    extra = [Path(p) for p in (options.boxes, options.model.config, options.model.model)
             if p is not None and Path(p).is_file()]
    outputs = []
    if options.out is not None and video_source is not None:
        from vitpose.inference.video import output_video_path  # the video module names the file

        drawn = output_video_path(options.out, video_source)
        if drawn != options.out:
            check_output(options.out, "--out", "dir", inputs + extra)
        check_output(drawn, "--out", "file", inputs + extra)  # `--out .` beside clip.mp4 names clip.mp4
        outputs.append(drawn)
    elif options.out is not None:
        check_output(options.out, "--out", "dir", inputs + extra)
        out = options.out.expanduser().resolve()
        if any(path.parent.resolve() == out for path in inputs):  # the drawings keep the images' names
            raise UsageError(f"--out {options.out} is a source directory: the drawings would overwrite the images")
    if options.json is not None:
        check_output(options.json, "--json", "file", inputs + extra + outputs, streams=True)
        if options.resume and stream_kind(options.json.expanduser()) is not None:
            raise UsageError(f"--json {options.json} is a device or pipe; --resume continues a file")
        if options.out is not None and video_source is None:
            json_path = os.path.abspath(options.json.expanduser())
            drawings = {os.path.abspath(options.out.expanduser() / name): name
                        for name in drawing_names(output_names(inputs))}
            if json_path in drawings:
                raise UsageError(f"--json {options.json} is the name of the drawing of {drawings[json_path]} in --out "
                                 f"{options.out}: choose another name")


def read_boxes(options: PredictOptions, names: list[str] | None):
    """`--boxes` -> (BoxTable, key) for images ("image_id" when every name is a COCO id and the
    records have it, else "file_name"); names None for a video (its key is chosen there)."""
    if options.boxes is None or names is None:
        return None, None
    table = read_boxes_file(options.boxes)
    _, coco_named = image_ids(names)
    if not table.by_key or (coco_named and table.keyed_by("image_id")):
        return table, "image_id"
    if table.keyed_by("file_name"):
        return table, "file_name"
    example = next((n for n in names if not Path(n).stem.isascii() or not Path(n).stem.isdigit()), names[0])
    raise UsageError(f"--boxes: {options.boxes} gives image_id only, but the source's file names are not all COCO "
                     f"ids (e.g. {example!r}): add 'file_name' to its records")


# ----------------------------------------------------------------------------------------------
# The command


def build_predictor(model_options):
    """The predictor of the command line through the one door (the model downloads here when it is
    not cached)."""
    return open_model(model_options)


def predict_options(args) -> PredictOptions:
    """The typed options of the command line (checked here, before any work)."""
    _check_flags(args)
    return PredictOptions(
        sources=tuple(str(x) for x in args.source), model=model_options(args), boxes=args.boxes, out=args.out,
        json=args.json, json_array=args.json_array, resume=args.resume, format=args.format, mark_below=args.mark_below,
        keypoint_threshold=args.keypoint_threshold, track=args.track, smooth=args.smooth, det_every=args.det_every,
        batch_images=args.batch_images, shard=args.shard, segment=args.segment, nproc_per_node=args.nproc_per_node,
        engine=args.engine, workers=args.workers, ray_address=args.ray_address, argv=tuple(getattr(args, "argv", ())))


def _check_flags(args) -> None:
    if args.batch_images < 1:
        raise UsageError(f"--batch-images must be >= 1, got {args.batch_images}")
    if args.det_every < 1:
        raise UsageError(f"--det-every must be >= 1 (1 = the detector on every frame), got {args.det_every}")
    if not 0.0 <= args.keypoint_threshold <= 1.0:
        raise UsageError(f"--keypoint-threshold must be in [0, 1], got {args.keypoint_threshold}")
    if args.format != "coco" and args.json is None:
        raise UsageError(f"--format {args.format} writes pre-annotations to --json FILE; give --json")
    if args.format != "coco" and args.resume:
        raise UsageError(f"--resume continues COCO JSON Lines; --format {args.format} writes one whole file")
    if args.boxes is not None and args.detector not in (None, "none"):
        raise UsageError("--boxes gives the person boxes: leave out --detector (or say --detector none)")
    if args.boxes is None and args.detector == "none":
        raise UsageError("--detector none needs the boxes from --boxes FILE.json (or use --detector full-frame)")


def run(args) -> int:
    """`vitpose predict`; returns the exit status. Errors that are the user's are UserErrors, which
    the command's one handler (vitpose.cli.run_command) prints as one line; a second Ctrl-C reaches
    it as KeyboardInterrupt after the files were closed on the way out."""
    return predict(predict_options(args))


def _video_plan(options: PredictOptions, source, kind: str):
    """A video or webcam: checked before the model loads; its `--segment` plan (or None)."""
    from vitpose.inference import sharded

    if options.format != "coco":
        raise UsageError(f"--format {options.format} writes pre-annotations of images; a video takes --format coco")
    if kind == "webcam" and options.json_array:
        raise UsageError("--json-array: a webcam runs until it is stopped; its --json is JSON Lines only")
    if kind == "video":
        from vitpose.run.sources import check_video_file

        check_video_file(source)
    plan = sharded.plan_segments(options, source) if options.segment is not None else None
    checked = options if plan is None else replace(options, json=plan.json_path, json_array=False)
    check_outputs(checked, [] if kind == "webcam" else [source], video_source=source)
    if options.boxes is not None:  # its errors before the model loads (run_video reads it for the frames)
        read_boxes_file(options.boxes)
    return plan, checked


def _image_plan(options: PredictOptions, kinds: list[str]):
    """Images: listed, named and checked before the model loads -> (options, paths, names, plan)."""
    from vitpose.inference import sharded

    # image files named one by one are a bounded input: their --json is one COCO results list
    # (as COCO.loadRes reads it); folders stream JSON Lines
    options = replace(options, json_array=options.json_array or (
        not options.resume and all(kind == "image" for kind in kinds)))
    paths = list_images([str(Path(s).expanduser()) for s in options.sources])
    names = output_names(paths)
    image_ids(names)  # duplicate ids: an error before any work
    plan = sharded.plan_images(options, paths, names)  # --shard K/N (or a launcher's): this shard's images
    if plan is not None:  # shard files are JSON Lines (vitpose merge --format coco writes a list)
        paths = plan.paths
        options = replace(options, json=plan.json_path, json_array=False)
    check_outputs(options, paths)
    return options, paths, names, plan


def predict(options: PredictOptions) -> int:
    """Every source of `vitpose predict` by one dispatch: images, a video, its segments, or Ray."""
    from vitpose.inference import sharded  # --shard, --segment, --nproc-per-node, --engine ray

    kinds = [classify_source(s) for s in options.sources]
    streams = [s for s, kind in zip(options.sources, kinds) if kind in ("video", "webcam")]
    if streams and len(options.sources) > 1:
        raise UsageError(f"a video or webcam ({streams[0]}) must be the only SOURCE")
    sharded.check_shard_flags(options, kinds[0] if streams else None)
    if options.nproc_per_node is not None:  # N copies of this command, one shard each
        return sharded.spawn_shards(options)
    paths = names = source = None
    if streams:
        source = int(streams[0]) if kinds[0] == "webcam" else Path(streams[0]).expanduser()
        plan, options = _video_plan(options, source, kinds[0])
    else:
        options, paths, names, plan = _image_plan(options, kinds)
    boxes = read_boxes(options, names)
    # after the sources, the outputs and the boxes file are checked
    predictor = build_predictor(options.model)
    if plan is not None:
        plan.announce()
    if options.engine == "ray":  # the model runs in Ray's actors; opened here first, so that a mistake in
        from vitpose.integrations.ray import predict_with_ray  # the model flags is one line, not each actor's death

        del predictor
        return predict_with_ray(options, plan, boxes)
    with StopOnSignal() as stop:
        if plan is not None and streams:
            return sharded.predict_segments(predictor, plan, options, stop.event)
        if streams:
            from vitpose.inference.video import run_video  # the video pipeline (decode, detect and pose overlapped)

            return run_video(predictor, source, options, stop=stop.event).exit_status
        if options.track or options.smooth or options.det_every != 1:
            print("vitpose predict: note: --track, --smooth and --det-every apply to videos; ignored for images",
                  file=sys.stderr)
        return predict_images(predictor, paths, options, boxes, stop, plan=plan)
