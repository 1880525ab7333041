"""One dispatch of a prediction run over every source (what `vitpose predict` runs once its flags are
parsed into `PredictOptions`): `prepare(options) -> PredictRun`, then `run_local(run, predictor)`.

Before any model loads: the sources are classified and listed (`vitpose.run.sources`), the shard
plan made (`vitpose.inference.sharded`), the outputs checked (`check_outputs`: folder vs file,
writable, never an input or each other) and the `--boxes` file read (`read_boxes`); then the model
opens (the one door), and the work goes to the images path (`vitpose.inference.images`), the video
pipeline (`vitpose.inference.video`), the segments of a sharded video, or Ray's actors. SIGINT /
SIGTERM finish the item in hand (`vitpose.run.stop.StopOnSignal`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from vitpose.errors import UsageError
from vitpose.files import check_output
from vitpose.inference import sharded
from vitpose.inference.images import drawing_names, output_names, predict_images
from vitpose.inference.pipeline import image_ids, read_boxes_file
from vitpose.inference.pose_formats import POSE_FORMATS, check_format_output, output_kind
from vitpose.inference.runner import PredictOptions
from vitpose.inference.smoothing import check_offline_smoothing
from vitpose.run.sources import survey
from vitpose.run.stop import stopped_by_signal

__all__ = ["PredictRun", "check_outputs", "prepare", "read_boxes", "run_local"]


def check_outputs(options: PredictOptions, inputs: list[Path], video_source=None) -> None:
    """--out, --json and their combinations (see the module docstring), before any work
    (`vitpose.files.check_output`: folder vs file, a path under a file, writable, not an input;
    --json may be a device or pipe such as /dev/stdout, a drawn video may not)."""

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
        _check_json(options, inputs + extra + outputs, inputs, video_source)


def _check_json(options: PredictOptions, others: list[Path], inputs: list[Path], video_source) -> None:
    """--json: a file (or a device or pipe) for COCO results and pre-annotations, a folder or file of
    `--format openpose|dlc|alphapose|nwb`; never an input, a drawing, or a folder that holds --out."""
    from vitpose.files import stream_kind

    if options.format in POSE_FORMATS:
        check_output(options.json, "--json", output_kind(options.format), others)
        check_format_output(options.format, options.json, "--json", video=video_source is not None)
    else:
        check_output(options.json, "--json", "file", others, streams=True)
        if options.resume and stream_kind(options.json.expanduser()) is not None:
            raise UsageError(f"--json {options.json} is a device or pipe; --resume continues a file")
    if options.out is None:
        return
    json_path = os.path.abspath(options.json.expanduser())
    out = os.path.abspath(options.out.expanduser())
    if output_kind(options.format) == "dir" and (out == json_path or out.startswith(json_path + os.sep)):
        raise UsageError(f"--json {options.json} is the folder of OpenPose's files, replaced whole, and --out "
                         f"{options.out} is in it: write them apart")
    if video_source is None:
        drawings = {os.path.join(out, name): name for name in drawing_names(output_names(inputs))}
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



def _video_plan(options: PredictOptions, source, kind: str):
    """A video or webcam: checked before the model loads; its `--segment` plan (or None)."""
    if options.format not in ("coco", *POSE_FORMATS):
        raise UsageError(f"--format {options.format} writes pre-annotations of images; a video takes --format coco, "
                         f"{', '.join(POSE_FORMATS)}")
    if kind == "webcam" and options.json_array:
        raise UsageError("--json-array: a webcam runs until it is stopped; its --json is JSON Lines only")
    if kind == "video":
        from vitpose.run.sources import check_video_file

        check_video_file(source)
    plan = sharded.plan_segments(options, source) if options.segment is not None else None
    if plan is None:
        check_offline_smoothing(options.smooth, webcam=kind == "webcam", out=options.out, resume=options.resume)
    checked = options if plan is None else replace(options, json=plan.json_path, json_array=False)
    check_outputs(checked, [] if kind == "webcam" else [source], video_source=source)
    if options.boxes is not None:  # its errors before the model loads (run_video reads it for the frames)
        read_boxes_file(options.boxes)
    return plan, checked


def _image_plan(options: PredictOptions, kinds: list[str], paths: list[Path]):
    """Images: listed, named and checked before the model loads -> (options, paths, names, plan)."""
    # image files named one by one are a bounded input: their --json is one COCO results list
    # (as COCO.loadRes reads it); folders stream JSON Lines
    options = replace(options, json_array=options.json_array or (
        not options.resume and all(kind == "image" for kind in kinds)))
    names = output_names(paths)
    image_ids(names)  # duplicate ids: an error before any work
    plan = sharded.plan_images(options, paths, names)  # --shard K/N (or a launcher's): this shard's images
    if plan is not None:  # shard files are JSON Lines (vitpose merge --format coco writes a list)
        paths = plan.paths
        options = replace(options, json=plan.json_path, json_array=False)
    check_outputs(options, paths)
    return options, paths, names, plan


@dataclass
class PredictRun:
    """A prediction run checked before any model loads (`prepare`): its options (the JSON layout
    decided, a shard's own file), the source (`paths` of images, or a video / camera `source`),
    the shard `plan`, the `--boxes` table and its key; `spawn`: `--nproc-per-node` asks for N copies."""

    options: PredictOptions
    streams: bool = False
    source: object = None
    paths: list | None = None
    plan: object = None
    boxes: tuple = (None, None)
    spawn: bool = False


def prepare(options: PredictOptions) -> PredictRun:
    """The sources, the shard plan, the outputs and the boxes file, all checked before the model loads."""
    kinds, paths = survey(options.sources)  # paths None: one video or webcam
    sharded.check_shard_flags(options, kinds[0] if paths is None else None)
    if options.nproc_per_node is not None:  # N copies of this command, one shard each
        return PredictRun(options, spawn=True)
    if paths is None:
        source = int(options.sources[0]) if kinds[0] == "webcam" else Path(options.sources[0]).expanduser()
        plan, options = _video_plan(options, source, kinds[0])
        return PredictRun(options, streams=True, source=source, plan=plan)
    options, paths, names, plan = _image_plan(options, kinds, paths)
    return PredictRun(options, paths=paths, plan=plan, boxes=read_boxes(options, names))


def run_local(run: PredictRun, predictor) -> int:
    """A prepared run on this process's predictor: the images path, the video pipeline or the
    segments of a video; SIGINT / SIGTERM finish the item in hand."""
    options = run.options
    if run.plan is not None:
        run.plan.announce()
    with stopped_by_signal() as stop:
        if run.plan is not None and run.streams:
            return sharded.predict_segments(predictor, run.plan, options, stop.event)
        if run.streams:
            from vitpose.inference.video import run_video  # the video pipeline (decode, detect and pose overlapped)

            return run_video(predictor, run.source, options, stop=stop.event).exit_status
        if options.track or options.smooth or options.det_every != 1:
            print("vitpose predict: note: --track, --smooth and --det-every apply to videos; ignored for images",
                  file=sys.stderr)
        return predict_images(predictor, run.paths, options, run.boxes, stop, plan=run.plan)
