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
replace an input (a source image or video, the --boxes file, the model). An existing --json is
replaced only when the run completes (until then the results go to `<json>.partial`); with
`--resume` it is continued: the images or frames in it are skipped. SIGINT / SIGTERM (Ctrl-C)
finish the current images or frames, close the files (a playable video, a parseable JSON) and
exit 130; a second signal stops at once.

Exit status: 0 all done; 1 some inputs failed (unreadable images, frames that failed; each is
counted, skipped and named at the end); 2 nothing done (usage, model, outputs); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

import numpy as np

from vitpose.errors import UserError
from vitpose.files import check_output
from vitpose.inference.pipeline import (
    IMAGE_SUFFIXES,
    ResultsFile,
    classify_source,
    coco_records,
    image_ids,
    read_boxes_file,
)

DEFAULT_MODEL = "vitpose-b-simple"
STAGES = ("decode", "detect", "crop", "pose", "decode heatmaps", "draw", "write")
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(UserError):
    """A problem with the command line or the user's files, reported in one line (exit status 2)."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = subparsers.add_parser("predict", help="poses in images, directories, videos or a webcam",
                              shared=("--config", "--device", "--debug"), description=doc[0], epilog="\n\n".join(doc[1:]),
                              formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("source", nargs="+",
                   help="images and directories of images, or one video file or webcam index (0, 1, ...)")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="a published name (vitpose.hub.list_models()), an HF repo id (org/repo[@revision]), a "
                        "weights or checkpoint file, or an .onnx file from vitpose export (default: %(default)s)")
    p.add_argument("--config", default=None, help="training config of the weights (custom models); "
                   "without it the size and decoder are read from the file")
    p.add_argument("--detector", default=None,
                   help="default | none | full-frame | a name of vitpose.inference.detect.DETECTORS "
                        "(default: 'default', or 'none' with --boxes)")
    p.add_argument("--detector-threshold", type=float, default=None, help="minimum person score (default 0.3)")
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
    p.add_argument("--no-flip", action="store_true", help="skip the flip test (about 2x faster)")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: CUDA when available)")
    p.add_argument("--det-classes", nargs="+", default=None, metavar="CLASS",
                   help="COCO classes the detector keeps, names or ids (default: the model's skeleton's: "
                        "bird..giraffe for AP-10K / APT-36K, person otherwise)")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                   help="auto (default): fp16 on CUDA, bf16 on a CPU with AVX512-BF16 or AMX (ViTPose-S "
                        "2.1-2.6x faster than fp32 there), else fp32; what auto picks passed the accuracy gate, "
                        "AP within 0.002 of fp32 (BENCHMARKS.md). fp32 gives the reference numbers")
    p.add_argument("--batch-images", type=int, default=8, help="images per model call (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="person boxes per forward pass, doubled by the flip test (default: 8 on a CPU, 32 on a GPU)")
    p.add_argument("--keypoint-threshold", type=float, default=0.3,
                   help="drawing: keypoints with a lower score are not drawn (default: %(default)s)")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
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


def check_outputs(args, inputs: list[Path], video_source=None) -> None:
    """--out, --json and their combinations (see the module docstring), before any work
    (`vitpose.files.check_output`: folder vs file, a path under a file, writable, not an input)."""
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
        check_output(args.json, "--json", "file", inputs + extra + outputs)


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
# Signals


class StopOnSignal:
    """SIGINT / SIGTERM set `event` (the run ends after the items in flight); a second one raises
    KeyboardInterrupt. Installed only in the main thread; the old handlers come back on exit."""

    def __init__(self):
        self.event = threading.Event()
        self.signal_name = None
        self._previous = {}

    def _handle(self, signum, frame):
        if self.event.is_set():
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        self.event.set()

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        return False


# ----------------------------------------------------------------------------------------------
# The command


def build_predictor(args):
    """The Predictor of the command line (the model downloads here when it is not cached)."""
    from vitpose.device import resolve_device, tune_cpu_allocator
    from vitpose.inference.predictor import Predictor

    detector = args.detector or ("none" if args.boxes is not None else "default")
    try:
        device = resolve_device(args.device)
    except ValueError as e:
        raise UsageError(f"--device: {e}") from None
    tune_cpu_allocator(device)  # on a CPU: this process runs models pass after pass (see its docstring)
    if args.det_classes is not None:  # a misspelt class stops before any model loads
        from vitpose.inference.detect import parse_det_classes

        try:
            parse_det_classes(args.det_classes)
        except ValueError as e:
            raise UsageError(str(e)) from None
    if Path(args.model).suffix.lower() == ".onnx":
        return build_onnx_predictor(args, None if detector == "none" else detector, device)
    return Predictor.from_pretrained(args.model, detector=None if detector == "none" else detector, device=device,
                                     config=args.config, flip_test=not args.no_flip, batch_size=args.batch_size,
                                     detector_threshold=args.detector_threshold, precision=args.precision,
                                     det_classes=args.det_classes)


def build_onnx_predictor(args, detector, device):
    """`--model FILE.onnx`: an `OnnxPredictor` (onnxruntime) with the command line's detector, and the
    skeleton the file's ModelSpec records (COCO's for a 17-keypoint file that records none) for the
    drawings and the detector's classes. The flip test and the crops are the file's."""
    from vitpose.builders import skeleton_of
    from vitpose.data.metainfo import dataset_info
    from vitpose.device import default_batch_size
    from vitpose.inference.detect import DEFAULT_SCORE_THRESHOLD, detector_labels, make_detector
    from vitpose.inference.onnx import OnnxPredictor
    from vitpose.models.spec import METADATA_KEY, ModelSpec

    if args.config is not None:
        raise UsageError(f"--config: {args.model} is an exported ONNX file, which carries its model; leave out --config")
    if args.precision not in ("auto", "fp32"):
        raise UsageError(f"--precision {args.precision}: an ONNX file runs in the precision it was exported in "
                         f"(vitpose export --fp16 writes a float16 one)")
    if not Path(args.model).is_file():
        raise UsageError(f"--model {args.model}: no such ONNX file")
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device.type == "cuda" else ["CPUExecutionProvider"]
    predictor = OnnxPredictor(args.model, flip_test=not args.no_flip, providers=providers,
                              batch_size=args.batch_size or default_batch_size(device))
    spec = getattr(predictor, "spec", None)
    recorded = predictor.metadata.get(METADATA_KEY)
    if spec is None and recorded:
        spec = ModelSpec.from_json(recorded, origin=f"recorded in {args.model}")
    if spec is not None and spec.skeleton is not None:
        predictor.skeleton = skeleton_of(spec)
    else:
        predictor.skeleton = dataset_info("coco") if predictor.num_keypoints == 17 else None
    threshold = DEFAULT_SCORE_THRESHOLD if args.detector_threshold is None else args.detector_threshold
    predictor.detector = make_detector(detector, device, threshold, detector_labels(predictor.skeleton, args.det_classes))
    return predictor


def _check_flags(args) -> None:
    if args.batch_images < 1:
        raise UsageError(f"--batch-images must be >= 1, got {args.batch_images}")
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.det_every < 1:
        raise UsageError(f"--det-every must be >= 1 (1 = the detector on every frame), got {args.det_every}")
    if args.detector_threshold is not None and not 0.0 <= args.detector_threshold <= 1.0:
        raise UsageError(f"--detector-threshold must be in [0, 1], got {args.detector_threshold}")
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
    """`vitpose predict`; returns the exit status (errors about the user's input: one line, 2)."""
    from vitpose.config import ConfigError

    expected = (UserError, ConfigError, FileNotFoundError)  # load_model's errors (names, downloads, files) are UserErrors
    try:
        return _run(args)
    except KeyboardInterrupt:  # a second Ctrl-C: the files were closed on the way out
        print("vitpose predict: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except expected as e:
        if args.debug:
            raise
        print(f"vitpose predict: error: {e}", file=sys.stderr)
        return EXIT_USAGE


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
    try:  # after the sources, the outputs and the boxes file are checked
        predictor = build_predictor(args)
    except (ValueError, RuntimeError) as e:  # an unrecognised weights file, detector weights, ViTPose+
        if args.debug:
            raise
        raise UsageError(str(e)) from None
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
        self.people = self.nobody = self.done = 0
        self.skeleton = getattr(predictor, "skeleton", None)

    def predict(self, images, given, names) -> list:
        """The predictor on a chunk of images; when it fails, image by image (one bad image costs one)."""
        try:
            return self.predictor(images, boxes=given, channels="bgr")
        except Exception as e:  # noqa: BLE001 - any failure on one image's pixels costs that image
            if len(images) > 1:
                return [self.predict([i], None if given is None else [g], [n])[0]
                        for i, g, n in zip(images, given or [None] * len(images), names)]
            self.failed.append(f"{names[0]}: {type(e).__name__}: {e}")
            return [None]

    def output(self, name: str, image_id: int, image, poses) -> None:
        from vitpose.files import write_image
        from vitpose.inference.draw import draw_people

        timer = self.predictor.timer
        if self.results is not None:
            with timer.stage("write"):
                records, nonfinite = coco_records(poses, image_id=image_id, file_name=name)
                if getattr(self.args, "format", "coco") != "coco":  # the pre-annotation formats need the size
                    records = [{**r, "width": image.shape[1], "height": image.shape[0]} for r in records]
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
            with timer.stage("write"):
                try:  # through a numpy buffer and the atomic writer: any file name the OS allows
                    write_image(self.args.out / name, canvas)
                except (OSError, ValueError) as e:
                    self.failed.append(f"{name}: could not write {self.args.out / name} ({e})")


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
                given = None if table is None else [_boxes_of(table, key, names[i], state.ids[i]) for i in chunk]
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
    """records -> the text of `--format labelstudio | cvat` (vitpose/data/annotation_formats.py)."""
    from vitpose.data import annotation_formats
    from vitpose.data.metainfo import dataset_info

    skeleton = getattr(predictor, "skeleton", None) or dataset_info("coco")

    def render(records: list[dict]) -> str:
        K = len(records[0]["keypoints"]) // 3 if records else skeleton.num_keypoints
        if K != skeleton.num_keypoints:
            raise UsageError(f"--format {args.format}: the model predicts {K} keypoints but the skeleton "
                             f"{skeleton.name!r} names {skeleton.num_keypoints}; give the model's training config "
                             f"with --config")
        if args.format == "labelstudio":
            return json.dumps(annotation_formats.to_labelstudio_tasks(records, skeleton.keypoint_names,
                                                                      mark_below=args.mark_below), indent=1)
        return annotation_formats.to_cvat_xml(records, skeleton.keypoint_names, skeleton.skeleton,
                                              mark_below=args.mark_below)
    return render


def _boxes_of(table, key: str, name: str, image_id: int) -> np.ndarray:
    found = table.lookup(key, name if key == "file_name" else image_id)
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
    timer = state.predictor.timer
    timer.seconds = timer.ordered(STAGES)
    print(f"{state.done} images, {state.people} people"
          + (f", {state.nobody} images with nobody found" if state.nobody else "")
          + (f" ({resumed} already in {state.args.json}, skipped)" if resumed else ""))
    print(timer.summary(state.done, "image"))
    written = [str(p) for p in (state.args.out, json_path) if p is not None]
    if written:
        print("written: " + ", ".join(written))
    if state.results is not None and state.results.nonfinite:
        print(f"vitpose predict: warning: {state.results.nonfinite} keypoint or score values were not finite "
              f"and are written as null", file=sys.stderr)
    if interrupted:
        why = stop.signal_name if stop is not None and stop.signal_name else "the user"
        if json_path is not None and Path(json_path) != Path(state.args.json):
            hint = f"; {state.args.json} is unchanged, this run's results so far are in {json_path}"
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
