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
import traceback
from pathlib import Path

import numpy as np

from vitpose.cli.options import DEFAULT_MODEL, add_model_arguments, model_options, open_model
from vitpose.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, UsageError, UserError
from vitpose.files import check_output
from vitpose.inference.pipeline import (
    IMAGE_SUFFIXES,
    VIDEO_SUFFIXES,
    ResultsFile,
    classify_source,
    image_ids,
    read_boxes_file,
)
from vitpose.inference.records import image_records
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


def list_images(sources: list[str]) -> list[Path]:
    """Image files of the sources: directories (by suffix, sorted by name) and files as given.

    A file that does not exist stays in the list: it is counted and skipped like an unreadable
    one (and so is a broken link in a directory); when no source exists at all nothing is done."""
    paths = []
    for source in map(Path, sources):
        if source.is_dir():
            found = sorted(p for p in source.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and not p.is_dir())
            if not found:
                videos = sorted(p.name for p in source.iterdir() if p.suffix.lower() in VIDEO_SUFFIXES)
                if videos:  # a folder is read for images only: a video goes alone, as the only SOURCE
                    raise UsageError(f"no images in {source}, but {len(videos)} video file(s) (e.g. {videos[0]}): "
                                     f"give videos one at a time, each as the only SOURCE "
                                     f"(vitpose predict {source / videos[0]} ...)")
                raise UsageError(f"no images in {source} (looked for {', '.join(IMAGE_SUFFIXES)})")
            paths += found
        else:
            paths.append(source)
    if paths and not any(p.exists() for p in paths):
        raise UsageError(f"source not found: {paths[0]}" + (f" (nor the {len(paths) - 1} others)" if len(paths) > 1
                                                            else ""))
    return paths


def output_names(paths: list[Path]) -> list[str]:
    """File names for the drawn images and `file_name`: the source's name, made unique across directories."""
    used, names = set(), []
    for path in paths:
        name, k = path.name, 1
        while name in used:
            name, k = f"{path.stem}_{k}{path.suffix}", k + 1
        used.add(name)
        names.append(name)
    return names


def drawing_names(names: list[str]) -> list[str]:
    """The file names of the drawings in --out: the image's own name, or NAME.png when its format
    cannot hold a colour picture (.pgm is grey only), made unique among the others."""
    taken, out = set(names), []
    for name in names:
        drawn = name
        if not _holds_colour(Path(name).suffix.lower()):
            drawn, k = f"{name}.png", 1
            while drawn in taken:
                drawn, k = f"{name}_{k}.png", k + 1
            taken.add(drawn)
        out.append(drawn)
    return out


_COLOUR_FORMATS: dict[str, bool] = {}


def _holds_colour(suffix: str) -> bool:
    """Whether OpenCV encodes a colour image in the format of `suffix` (asked once per suffix)."""
    if suffix not in _COLOUR_FORMATS:
        import cv2

        try:
            _COLOUR_FORMATS[suffix] = bool(cv2.imencode(suffix, np.zeros((2, 2, 3), np.uint8))[0])
        except cv2.error:
            _COLOUR_FORMATS[suffix] = False
    return _COLOUR_FORMATS[suffix]


def check_outputs(args, inputs: list[Path], video_source=None) -> None:
    """--out, --json and their combinations (see the module docstring), before any work
    (`vitpose.files.check_output`: folder vs file, a path under a file, writable, not an input;
    --json may be a device or pipe such as /dev/stdout, a drawn video may not)."""
    from vitpose.files import stream_kind

    if args.resume and args.json is None:
        raise UsageError("--resume continues the --json file: give --json")
    if args.resume and args.json_array:
        raise UsageError("--resume continues JSON Lines; leave out --json-array")
    extra = [Path(p) for p in (args.boxes, args.config, args.model) if p is not None and Path(p).is_file()]
    outputs = []
    if args.out is not None and video_source is not None:
        from vitpose.inference.video import output_video_path  # the video module names the file

        drawn = output_video_path(args.out, video_source)
        if drawn != args.out:
            check_output(args.out, "--out", "dir", inputs + extra)
        check_output(drawn, "--out", "file", inputs + extra)  # `--out .` beside clip.mp4 names clip.mp4
        outputs.append(drawn)
    elif args.out is not None:
        check_output(args.out, "--out", "dir", inputs + extra)
        out = args.out.expanduser().resolve()
        if any(path.parent.resolve() == out for path in inputs):  # the drawings keep the images' names
            raise UsageError(f"--out {args.out} is a source directory: the drawings would overwrite the images")
    if args.json is not None:
        check_output(args.json, "--json", "file", inputs + extra + outputs, streams=True)
        if args.resume and stream_kind(args.json.expanduser()) is not None:
            raise UsageError(f"--json {args.json} is a device or pipe; --resume continues a file")
        if args.out is not None and video_source is None:
            json_path = os.path.abspath(args.json.expanduser())
            drawings = {os.path.abspath(args.out.expanduser() / name): name
                        for name in drawing_names(output_names(inputs))}
            if json_path in drawings:
                raise UsageError(f"--json {args.json} is the name of the drawing of {drawings[json_path]} in --out "
                                 f"{args.out}: choose another name")


def read_boxes(args, names: list[str] | None):
    """`--boxes` -> (BoxTable, key) for images ("image_id" when every name is a COCO id and the
    records have it, else "file_name"); names None for a video (its key is chosen there)."""
    if args.boxes is None or names is None:
        return None, None
    table = read_boxes_file(args.boxes)
    _, coco_named = image_ids(names)
    if not table.by_key or (coco_named and table.keyed_by("image_id")):
        return table, "image_id"
    if table.keyed_by("file_name"):
        return table, "file_name"
    example = next((n for n in names if not Path(n).stem.isascii() or not Path(n).stem.isdigit()), names[0])
    raise UsageError(f"--boxes: {args.boxes} gives image_id only, but the source's file names are not all COCO "
                     f"ids (e.g. {example!r}): add 'file_name' to its records")


# ----------------------------------------------------------------------------------------------
# The command


def build_predictor(args):
    """The predictor of the command line through the one door (the model downloads here when it is
    not cached)."""
    return open_model(model_options(args))


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
    return _run(args)


def _run(args) -> int:
    _check_flags(args)
    kinds = [classify_source(s) for s in args.source]
    streams = [s for s, kind in zip(args.source, kinds) if kind in ("video", "webcam")]
    if streams and len(args.source) > 1:
        raise UsageError(f"a video or webcam ({streams[0]}) must be the only SOURCE")
    from vitpose.inference import sharded  # --shard, --segment, --nproc-per-node, --engine ray

    sharded.check_shard_flags(args, kinds[0] if streams else None)
    if args.nproc_per_node is not None:  # N copies of this command, one shard each
        return sharded.spawn_shards(args)
    plan = None
    if streams and args.format != "coco":
        raise UsageError(f"--format {args.format} writes pre-annotations of images; a video takes --format coco")
    if streams:
        source = int(streams[0]) if kinds[0] == "webcam" else Path(streams[0]).expanduser()
        if kinds[0] == "webcam" and args.json_array:
            raise UsageError("--json-array: a webcam runs until it is stopped; its --json is JSON Lines only")
        if kinds[0] == "video":
            from vitpose.inference.video import check_video_file

            check_video_file(source)
        if args.segment is not None:  # frame ranges as work units: this shard's, args.json its file
            plan = sharded.plan_segments(args, source)
        check_outputs(args, [] if kinds[0] == "webcam" else [source], video_source=source)
        if args.boxes is not None:  # its errors before the model loads (run_video reads it for the frames)
            read_boxes_file(args.boxes)
        paths = names = None
    else:
        # image files named one by one are a bounded input: their --json is one COCO results list
        # (as COCO.loadRes reads it); folders stream JSON Lines
        args.json_array = args.json_array or (not args.resume and all(kind == "image" for kind in kinds))
        paths = list_images([str(Path(s).expanduser()) for s in args.source])
        names = output_names(paths)
        image_ids(names)  # duplicate ids: an error before any work
        plan = sharded.plan_images(args, paths, names)  # --shard K/N (or a launcher's): this shard's images
        if plan is not None:
            paths = plan.paths
        check_outputs(args, paths)
    boxes = read_boxes(args, names)
    if args.engine == "ray":  # the model runs in Ray's actors, not here
        from vitpose.integrations.ray import predict_with_ray

        return predict_with_ray(args, plan, boxes)
    predictor = build_predictor(args)  # after the sources, the outputs and the boxes file are checked
    with StopOnSignal() as stop:
        if plan is not None and streams:
            return sharded.predict_segments(predictor, plan, args, stop.event)
        if streams:
            from vitpose.inference.video import run_video  # the video pipeline (decode, detect and pose overlapped)

            return run_video(predictor, source, args, stop=stop.event).exit_status
        if args.track or args.smooth or args.det_every != 1:
            print("vitpose predict: note: --track, --smooth and --det-every apply to videos; ignored for images",
                  file=sys.stderr)
        return predict_images(predictor, paths, args, boxes, stop)


# ----------------------------------------------------------------------------------------------
# Images


class _ImageRun:
    """The outputs and tallies of one run over image files."""

    def __init__(self, predictor, args, names: list[str]):
        self.predictor, self.args = predictor, args
        self.ids, _ = image_ids(names)
        self.results = None
        if getattr(args, "shard_plan", None) is not None and args.json is not None:  # units.ShardFile
            self.results = args.shard_plan.results_file()
        elif args.json is not None and getattr(args, "format", "coco") != "coco":
            self.results = ResultsFile(args.json, "file_name", array=True, render=_annotation_writer(args, predictor))
        elif args.json is not None:
            self.results = ResultsFile(args.json, "file_name", array=args.json_array, resume=args.resume)
        self.failed: list[str] = []
        self.traceback_shown = False
        self.people = self.nobody = self.done = 0
        self.skeleton = getattr(predictor, "skeleton", None)
        self.drawing_of = dict(zip(names, drawing_names(names))) if args.out is not None else {}
        self.renamed = sorted(name for name, drawn in self.drawing_of.items() if drawn != name)
        self.exif_noted = False

    def note_exif_orientation(self, paths, images) -> None:
        """With --boxes, one note for the first image that has an EXIF orientation: OpenCV decodes
        it turned or mirrored upright, and its boxes are taken in that frame."""
        from vitpose.data.image_io import exif_orientation

        if self.exif_noted:
            return
        for path, image in zip(paths, images):
            orientation = exif_orientation(path)
            if orientation != 1:
                self.exif_noted = True
                print(f"vitpose predict: note: {path} has EXIF orientation {orientation}: it is decoded turned "
                      f"upright ({image.shape[1]}x{image.shape[0]}, as a viewer shows it) and --boxes are taken "
                      f"in that frame, not the stored pixels' (noted for the first such image only)",
                      file=sys.stderr)
                return

    def predict(self, images, given, names) -> list:
        """The predictor on a chunk of images; when it fails, image by image (one bad image costs one)."""
        try:
            return self.predictor(images, boxes=given, channels="bgr")
        except Exception as e:  # noqa: BLE001 - any failure on one image's pixels costs that image
            if len(images) > 1:
                return [self.predict([i], None if given is None else [g], [n])[0]
                        for i, g, n in zip(images, given or [None] * len(images), names)]
            self.failed.append(f"{names[0]}: {type(e).__name__}: {e}")
            if not isinstance(e, UserError) and not self.traceback_shown:
                # not an input the code explains: maybe a bug. The image is counted and skipped as
                # before, but a bug is never only "an input failed": its traceback, once.
                self.traceback_shown = True
                print(f"vitpose predict: {names[0]} failed with an error that is not about the input; "
                      f"its traceback (a bug in vitpose, please report it unless it names the file):",
                      file=sys.stderr)
                traceback.print_exc()
            return [None]

    def output(self, name: str, image_id: int, image, poses) -> None:
        from vitpose.files import write_image
        from vitpose.inference.draw import draw_people

        timer = self.predictor.timer
        if self.results is not None:
            with timer.stage("write"):
                # the pre-annotation formats need the size; `vitpose serve` answers with the same records
                with_size = getattr(self.args, "format", "coco") != "coco"
                records, nonfinite = image_records(poses, name, image_id, image.shape[:2] if with_size else None)
                if hasattr(self.results, "write_item"):  # a shard file: the image's unit, ended
                    self.results.write_item(name, records, nonfinite)
                else:
                    self.results.write(records, nonfinite)
        self.people += len(poses)
        self.nobody += len(poses) == 0
        self.done += 1
        if self.args.out is not None:
            with timer.stage("draw"):
                canvas = draw_people(image, poses, self.skeleton, self.args.keypoint_threshold, "bgr")
            drawn = self.args.out / self.drawing_of.get(name, name)
            with timer.stage("write"):
                try:  # through a numpy buffer and the atomic writer: any file name the OS allows
                    write_image(drawn, canvas)
                except (OSError, ValueError) as e:
                    self.failed.append(f"{name}: could not write {drawn} ({e})")


# Decoded pixels held at once by one chunk of images (50 MP: 150 MB as BGR): a chunk ends at
# --batch-images images or at this many pixels, whichever comes first, so a folder of 12000x9000
# photos is done one image at a time instead of eight (one image alone is bounded by the pixel
# limit of vitpose.files, read from its header before decoding).
CHUNK_PIXELS = 50_000_000


def _decode_chunk(queue, paths: list[Path], batch_images: int, failed: list[str]):
    """The next images of `queue` (indices into `paths`), decoded, up to `batch_images` images or
    CHUNK_PIXELS pixels -> (indices, BGR images, how many were taken incl. failures)."""
    from vitpose.data.errors import DataError
    from vitpose.data.image_io import load_image

    chunk, images, taken, pixels = [], [], 0, 0
    while len(chunk) < batch_images and pixels < CHUNK_PIXELS:
        i = next(queue, None)
        if i is None:
            break
        taken += 1
        try:
            image = load_image(paths[i])[0]  # BGR; missing, empty, truncated and oversized files raise
        except DataError as e:
            failed.append(str(e))
            continue
        chunk.append(i)
        images.append(image)
        pixels += image.shape[0] * image.shape[1]
    return chunk, images, taken


def predict_images(predictor, paths: list[Path], args, boxes=(None, None), stop=None) -> int:
    """Poses of image files, `args.batch_images` at a time; results, drawings and the summary."""
    from tqdm import tqdm

    predictor.timer.reset()
    names = output_names(paths)
    state = _ImageRun(predictor, args, names)
    table, key = boxes if boxes is not None else (None, None)
    todo = [i for i, name in enumerate(names) if state.results is None or name not in state.results.done]
    if table is not None:
        _note_unused(table, key, names, state.ids)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    interrupted = False
    try:
        with tqdm(total=len(todo), unit="img", desc="predict", dynamic_ncols=True, file=sys.stderr) as bar:
            queue = iter(todo)
            while not interrupted:
                if stop is not None and stop.event.is_set():
                    interrupted = True
                    break
                with predictor.timer.stage("decode"):
                    chunk, images, taken = _decode_chunk(queue, paths, args.batch_images, state.failed)
                if not taken:
                    break
                given = None
                if table is not None:
                    state.note_exif_orientation([paths[i] for i in chunk], images)
                    given = [_boxes_of(table, key, names[i], state.ids[i], image) for i, image in zip(chunk, images)]
                found = state.predict(images, given, [names[i] for i in chunk]) if chunk else []
                for i, image, poses in zip(chunk, images, found):
                    if poses is not None:
                        state.output(names[i], state.ids[i], image, poses)
                bar.update(taken)
    finally:
        where = _close_results(state, completed=not interrupted)
    print_summary(state, len(paths) - len(todo), where, interrupted, stop)
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if state.failed else EXIT_OK


def _annotation_writer(args, predictor):
    """records -> the text of `--format labelstudio | cvat` (`vitpose.inference.records.render_records`)."""
    from vitpose.data.metainfo import dataset_info
    from vitpose.inference.records import render_records

    skeleton = getattr(predictor, "skeleton", None) or dataset_info("coco")
    return lambda records: render_records(records, args.format, skeleton, args.mark_below)


def _boxes_of(table, key: str, name: str, image_id: int, image) -> np.ndarray:
    found = table.lookup(key, name if key == "file_name" else image_id, (image.shape[1], image.shape[0]))
    return np.concatenate([found.boxes, found.scores[:, None]], axis=1)


def _note_unused(table, key: str, names: list[str], ids: list[int]) -> None:
    unused = sorted(set(table.by_key.get(key, {})) - set(names if key == "file_name" else ids), key=str)
    if unused:
        print(f"vitpose predict: note: {table.path} has boxes for {len(unused)} images ({key}) that are not in "
              f"the source (e.g. {unused[:3]})", file=sys.stderr)


def _close_results(state: _ImageRun, completed: bool):
    if state.results is None:
        return None
    with state.predictor.timer.stage("write"):
        # a run in which every image failed replaces nothing
        return state.results.close(completed and (state.done > 0 or not state.failed))


def print_summary(state: _ImageRun, resumed: int, json_path, interrupted: bool, stop) -> None:
    from vitpose.files import STDOUT

    timer = state.predictor.timer
    timer.seconds = timer.ordered(STAGES)
    # with --json /dev/stdout the results own stdout: the summary goes to stderr
    report = sys.stderr if state.results is not None and state.results.stream == STDOUT else sys.stdout
    print(f"{state.done} images, {state.people} people"
          + (f", {state.nobody} images with nobody found" if state.nobody else "")
          + (f" ({resumed} already in {state.args.json}, skipped)" if resumed else ""), file=report)
    print(timer.summary(state.done, "image"), file=report)
    written = [str(p) for p in (state.args.out, json_path) if p is not None]
    if written:
        print("written: " + ", ".join(written), file=report)
    if state.args.precision == "auto":
        from vitpose.device import auto_precision_reason

        reason = auto_precision_reason()  # set where a CPU's bf16 was timed (the figure behind the choice)
        if reason:
            print(reason, file=report)
    if state.renamed:
        print(f"vitpose predict: note: {len(state.renamed)} images are in a format that cannot hold a colour "
              f"picture; drawn as PNG: {state.renamed[0]} -> {state.drawing_of[state.renamed[0]]}"
              + (" ..." if len(state.renamed) > 1 else ""), file=sys.stderr)
    if state.results is not None and state.results.nonfinite:
        print(f"vitpose predict: warning: {state.results.nonfinite} keypoint or score values were not finite "
              f"and are written as null", file=sys.stderr)
    if interrupted:
        why = stop.signal_name if stop is not None and stop.signal_name else "the user"
        if json_path is not None and Path(json_path) != Path(state.args.json):
            hint = (f"; {state.args.json} is unchanged, this run's results so far are in {json_path} (run again "
                    f"with --resume to finish them)")
        else:
            hint = "; run again with --resume to finish --json" if state.args.json is not None else ""
        print(f"vitpose predict: interrupted by {why} after {state.done} images{hint}", file=sys.stderr)
    if state.failed:
        print(f"vitpose predict: {len(state.failed)} images skipped (missing, unreadable or failed) or not written:",
              file=sys.stderr)
        for why in state.failed[:20]:
            print(f"  {why}", file=sys.stderr)
        if len(state.failed) > 20:
            print(f"  ... and {len(state.failed) - 20} more", file=sys.stderr)
