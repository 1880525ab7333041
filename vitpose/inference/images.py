"""Poses of image files: `predict_images(predictor, paths, options, boxes, stop)`, the image path of
`vitpose predict` (folders and image files; videos go to `vitpose.inference.video`).

Images are decoded a chunk at a time (`--batch-images` images or CHUNK_PIXELS pixels), the chunk
goes to the predictor in one call (`vitpose.inference.runner.predict_chunk`: one bad image costs
itself), and each image's records go to the results writer as one unit (`begin / add / end`:
COCO results, a shard file, or the pre-annotation formats by `--format`), its drawing to `--out`.
Names: `output_names` (the source's names made unique), `drawing_names` (a drawing's name).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from vitpose.inference.pipeline import image_ids
from vitpose.inference.pose_formats import POSE_FORMATS, PoseFormatFile
from vitpose.inference.records import image_records
from vitpose.inference.runner import Item, PredictOptions, RunSummary, predict_units
from vitpose.inference.writers import ResultsFile

__all__ = ["CHUNK_PIXELS", "drawing_names", "open_results", "output_names", "predict_images"]

STAGES = ("decode", "detect", "crop", "pose", "decode heatmaps", "draw", "write")


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



class _ImageRun:
    """The outputs of one run over image files: the results writer, the drawings, the items."""

    def __init__(self, predictor, options: PredictOptions, names: list[str], plan=None):
        self.predictor, self.options = predictor, options
        self.ids = dict(zip(names, image_ids(names)[0]))
        self.results = open_results(options, predictor, plan)
        self.summary = RunSummary("images")
        self.skeleton = getattr(predictor, "skeleton", None)
        self.drawing_of = dict(zip(names, drawing_names(names))) if options.out is not None else {}
        self.renamed = sorted(name for name, drawn in self.drawing_of.items() if drawn != name)
        self.exif_noted = False

    def items(self, paths: list[Path], names: list[str], todo: list[int], progress, note_exif: bool):
        """The images to do, decoded as the runner takes them (an unreadable one is counted and skipped)."""
        from vitpose.data.errors import DataError
        from vitpose.data.image_io import load_image

        for i in todo:
            progress.update(1)
            try:
                with self.predictor.timer.stage("decode"):
                    image = load_image(paths[i])[0]  # BGR; missing, empty, truncated and oversized files raise
            except DataError as e:
                self.summary.failures.note(str(e))
                continue
            if note_exif and not self.exif_noted:
                self.note_exif_orientation(paths[i], image)
            yield Item(names[i], names[i], image)

    def note_exif_orientation(self, path, image) -> None:
        """With --boxes, one note for the first image that has an EXIF orientation: OpenCV decodes
        it turned or mirrored upright, and its boxes are taken in that frame."""
        from vitpose.data.image_io import exif_orientation

        orientation = exif_orientation(path)
        if orientation != 1:
            self.exif_noted = True
            print(f"vitpose predict: note: {path} has EXIF orientation {orientation}: it is decoded turned "
                  f"upright ({image.shape[1]}x{image.shape[0]}, as a viewer shows it) and --boxes are taken "
                  f"in that frame, not the stored pixels' (noted for the first such image only)", file=sys.stderr)

    def finish(self, item: Item, poses) -> tuple[list[dict], int]:
        """An image's records (for the results file) and its drawing."""
        records, nonfinite = [], 0
        if self.results is not None:
            with self.predictor.timer.stage("write"):
                # the pre-annotation formats need the size; `vitpose serve` answers with the same records
                size = item.image.shape[:2] if self.options.format != "coco" else None
                records, nonfinite = image_records(poses, item.label, self.ids[item.label], size,
                                                   self.options.rescore)
        if self.options.out is not None:
            self.draw(item, poses)
        return records, nonfinite

    def draw(self, item: Item, poses) -> None:
        from vitpose.files import write_image
        from vitpose.inference.draw import draw_people

        timer = self.predictor.timer
        with timer.stage("draw"):
            canvas = draw_people(item.image, poses, self.skeleton, self.options.keypoint_threshold, "bgr")
        drawn = Path(self.options.out) / self.drawing_of.get(item.label, item.label)
        with timer.stage("write"):
            try:  # through a numpy buffer and the atomic writer: any file name the OS allows
                write_image(drawn, canvas)
            except (OSError, ValueError) as e:
                self.summary.failures.note(f"{item.label}: could not write {drawn} ({e})")


# Decoded pixels held at once by one chunk of images (50 MP: 150 MB as BGR): a chunk ends at
# --batch-images images or at this many pixels, whichever comes first, so a folder of 12000x9000
# photos is done one image at a time instead of eight (one image alone is bounded by the pixel
# limit of vitpose.files, read from its header before decoding).
CHUNK_PIXELS = 50_000_000


def predict_images(predictor, paths: list[Path], options: PredictOptions, boxes=(None, None), stop=None,
                   plan=None) -> int:
    """Poses of image files, `options.batch_images` at a time (`predict_units`); results,
    drawings and the summary. plan: a sharded run's `ShardPlan` (its shard file is the results file)."""
    from tqdm import tqdm

    predictor.timer.reset()
    names = output_names(paths)
    state = _ImageRun(predictor, options, names, plan)
    table, key = boxes if boxes is not None else (None, None)
    todo = [i for i, name in enumerate(names) if state.results is None or name not in state.results.done]
    lookup = None
    if table is not None:
        _note_unused(table, key, names, list(state.ids.values()))
        lookup = _box_lookup(table, key, state.ids)
    if options.out is not None:
        Path(options.out).mkdir(parents=True, exist_ok=True)
    event = getattr(stop, "event", stop)
    summary = state.summary
    summary.skipped = len(paths) - len(todo)
    try:
        with tqdm(total=len(todo), unit="img", desc="predict", dynamic_ncols=True, file=sys.stderr) as bar:
            items = state.items(paths, names, todo, bar, note_exif=table is not None)
            predict_units(predictor, items, state.results, state.finish, event, batch=options.batch_images,
                          max_pixels=CHUNK_PIXELS, box_lookup=lookup, summary=summary)
    finally:
        summary.interrupted = event is not None and event.is_set()
        where = _close_results(state, completed=not summary.interrupted)
    summary.signal_name = getattr(stop, "signal_name", None)
    return print_summary(state, where)


def open_results(options: PredictOptions, predictor, plan=None):
    """The writer of `--json` by `--format` (None without --json): a sharded run's shard file, the
    pre-annotation formats as one rendered file, else COCO results (JSON Lines or one list)."""
    if options.json is None:
        return None
    if plan is not None:
        return plan.results_file()
    if options.format in POSE_FORMATS:  # OpenPose, DeepLabCut, AlphaPose: written at the end
        return PoseFormatFile(options.json, options.format, _skeleton(predictor), source="images")
    if options.format != "coco":
        return ResultsFile(options.json, "file_name", array=True, render=_annotation_writer(options, predictor))
    return ResultsFile(options.json, "file_name", array=options.json_array, resume=options.resume)


def _annotation_writer(options: PredictOptions, predictor):
    """records -> the text of `--format labelstudio | cvat` (`vitpose.inference.records.render_records`)."""
    from vitpose.inference.records import render_records

    skeleton = _skeleton(predictor)
    return lambda records: render_records(records, options.format, skeleton, options.mark_below, options.mark_by)


def _skeleton(predictor):
    """The model's skeleton (COCO's for a model file that records none)."""
    from vitpose.data.metainfo import dataset_info

    return getattr(predictor, "skeleton", None) or dataset_info("coco")


def _box_lookup(table, key: str, ids: dict):
    """(name, (w, h)) -> the image's `--boxes`, checked against its size (a box far outside it fails the image)."""
    return lambda name, size: table.lookup(key, name if key == "file_name" else ids[name], size)


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
        return state.results.close(completed and (state.summary.items > 0 or not state.summary.failures))


def print_summary(state: _ImageRun, where) -> int:
    """The run's closing lines (`RunSummary.report`, with the stage timings and the notes of images) -> its status."""
    from vitpose.files import STDOUT

    timer = state.predictor.timer
    timer.seconds = timer.ordered(STAGES)
    lines = [timer.summary(state.summary.items, "image")]
    if getattr(state.options.model, "precision", "auto") == "auto":
        from vitpose.device import auto_precision_reason

        reason = auto_precision_reason()  # set where a CPU's bf16 was timed (the figure behind the choice)
        lines += [reason] if reason else []
    if state.renamed:
        print(f"vitpose predict: note: {len(state.renamed)} images are in a format that cannot hold a colour "
              f"picture; drawn as PNG: {state.renamed[0]} -> {state.drawing_of[state.renamed[0]]}"
              + (" ..." if len(state.renamed) > 1 else ""), file=sys.stderr)
    if state.results is not None and state.results.nonfinite:
        print(f"vitpose predict: warning: {state.results.nonfinite} keypoint or score values were not finite "
              f"and are written as null", file=sys.stderr)
    # with --json /dev/stdout the results own stdout: the summary goes to stderr
    out = sys.stderr if state.results is not None and state.results.stream == STDOUT else sys.stdout
    written = [p for p in (state.options.out, where) if p is not None]
    return state.summary.report(where, json=state.options.json, written=written, out=out, lines=lines,
                                resumable=state.options.format == "coco")
