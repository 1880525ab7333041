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

from vitpose.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from vitpose.inference.pipeline import image_ids
from vitpose.inference.records import image_records
from vitpose.inference.runner import Failures, PredictOptions, predict_chunk
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
    """The outputs and tallies of one run over image files."""

    def __init__(self, predictor, options: PredictOptions, names: list[str], plan=None):
        self.predictor, self.options = predictor, options
        self.ids, _ = image_ids(names)
        self.results = open_results(options, predictor, plan)
        self.failures = Failures()
        self.people = self.nobody = self.done = 0
        self.skeleton = getattr(predictor, "skeleton", None)
        self.drawing_of = dict(zip(names, drawing_names(names))) if options.out is not None else {}
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

    def output(self, name: str, image_id: int, image, poses) -> None:
        from vitpose.files import write_image
        from vitpose.inference.draw import draw_people

        timer = self.predictor.timer
        if self.results is not None:
            with timer.stage("write"):
                # the pre-annotation formats need the size; `vitpose serve` answers with the same records
                with_size = self.options.format != "coco"
                records, nonfinite = image_records(poses, name, image_id, image.shape[:2] if with_size else None)
                self.results.write(records, nonfinite, unit=name)
        people = len(poses)
        self.people += people
        self.nobody += people == 0
        self.done += 1
        if self.options.out is not None:
            with timer.stage("draw"):
                canvas = draw_people(image, poses, self.skeleton, self.options.keypoint_threshold, "bgr")
            drawn = Path(self.options.out) / self.drawing_of.get(name, name)
            with timer.stage("write"):
                try:  # through a numpy buffer and the atomic writer: any file name the OS allows
                    write_image(drawn, canvas)
                except (OSError, ValueError) as e:
                    self.failures.note(f"{name}: could not write {drawn} ({e})")


# Decoded pixels held at once by one chunk of images (50 MP: 150 MB as BGR): a chunk ends at
# --batch-images images or at this many pixels, whichever comes first, so a folder of 12000x9000
# photos is done one image at a time instead of eight (one image alone is bounded by the pixel
# limit of vitpose.files, read from its header before decoding).
CHUNK_PIXELS = 50_000_000


def _decode_chunk(queue, paths: list[Path], batch_images: int, failures: Failures):
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
            failures.note(str(e))
            continue
        chunk.append(i)
        images.append(image)
        pixels += image.shape[0] * image.shape[1]
    return chunk, images, taken


def predict_images(predictor, paths: list[Path], options: PredictOptions, boxes=(None, None), stop=None,
                   plan=None) -> int:
    """Poses of image files, `options.batch_images` at a time; results, drawings and the summary.
    plan: a sharded run's `ShardPlan` (its shard file is the results file)."""
    from tqdm import tqdm

    predictor.timer.reset()
    names = output_names(paths)
    state = _ImageRun(predictor, options, names, plan)
    table, key = boxes if boxes is not None else (None, None)
    todo = [i for i, name in enumerate(names) if state.results is None or name not in state.results.done]
    if table is not None:
        _note_unused(table, key, names, state.ids)
    if options.out is not None:
        Path(options.out).mkdir(parents=True, exist_ok=True)
    interrupted = False
    try:
        with tqdm(total=len(todo), unit="img", desc="predict", dynamic_ncols=True, file=sys.stderr) as bar:
            queue = iter(todo)
            while not interrupted:
                if stop is not None and stop.event.is_set():
                    interrupted = True
                    break
                with predictor.timer.stage("decode"):
                    chunk, images, taken = _decode_chunk(queue, paths, options.batch_images, state.failures)
                if not taken:
                    break
                lookup = None
                if table is not None:
                    state.note_exif_orientation([paths[i] for i in chunk], images)
                    lookup = _box_lookup(table, key, dict(zip(names, state.ids)))
                found = predict_chunk(predictor, images, None, [names[i] for i in chunk], state.failures,
                                      box_lookup=lookup)
                for i, image, poses in zip(chunk, images, found):
                    if poses is not None:
                        state.output(names[i], state.ids[i], image, poses)
                bar.update(taken)
    finally:
        where = _close_results(state, completed=not interrupted)
    print_summary(state, len(paths) - len(todo), where, interrupted, stop)
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if state.failures else EXIT_OK


def open_results(options: PredictOptions, predictor, plan=None):
    """The writer of `--json` by `--format` (None without --json): a sharded run's shard file, the
    pre-annotation formats as one rendered file, else COCO results (JSON Lines or one list)."""
    if options.json is None:
        return None
    if plan is not None:
        return plan.results_file()
    if options.format != "coco":
        return ResultsFile(options.json, "file_name", array=True, render=_annotation_writer(options, predictor))
    return ResultsFile(options.json, "file_name", array=options.json_array, resume=options.resume)


def _annotation_writer(options: PredictOptions, predictor):
    """records -> the text of `--format labelstudio | cvat` (`vitpose.inference.records.render_records`)."""
    from vitpose.data.metainfo import dataset_info
    from vitpose.inference.records import render_records

    skeleton = getattr(predictor, "skeleton", None) or dataset_info("coco")
    return lambda records: render_records(records, options.format, skeleton, options.mark_below)


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
        return state.results.close(completed and (state.done > 0 or not state.failures))


def print_summary(state: _ImageRun, resumed: int, json_path, interrupted: bool, stop) -> None:
    from vitpose.files import STDOUT

    timer = state.predictor.timer
    timer.seconds = timer.ordered(STAGES)
    # with --json /dev/stdout the results own stdout: the summary goes to stderr
    report = sys.stderr if state.results is not None and state.results.stream == STDOUT else sys.stdout
    print(f"{state.done} images, {state.people} people"
          + (f", {state.nobody} images with nobody found" if state.nobody else "")
          + (f" ({resumed} already in {state.options.json}, skipped)" if resumed else ""), file=report)
    print(timer.summary(state.done, "image"), file=report)
    written = [str(p) for p in (state.options.out, json_path) if p is not None]
    if written:
        print("written: " + ", ".join(written), file=report)
    if getattr(state.options.model, "precision", "auto") == "auto":
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
        if json_path is not None and Path(json_path) != Path(state.options.json):
            hint = (f"; {state.options.json} is unchanged, this run's results so far are in {json_path} (run again "
                    f"with --resume to finish them)")
        else:
            hint = "; run again with --resume to finish --json" if state.options.json is not None else ""
        print(f"vitpose predict: interrupted by {why} after {state.done} images{hint}", file=sys.stderr)
    state.failures.report("images skipped (missing, unreadable or failed) or not written")
