"""Ray Data: poses as a `map_batches` stage, and `vitpose predict SRC --engine ray --workers N`.

Install with `pip install 'vitpose[ray]'` (Ray is Apache-2.0). In your own pipeline:

    import ray
    from vitpose.integrations.ray import PosePredictor, actor_resources

    ds = ray.data.read_binary_files("s3://bucket/frames/", include_paths=True)   # columns bytes, path
    poses = ds.map_batches(PosePredictor, fn_constructor_kwargs={"model": "vitpose-b-simple"},
                           batch_size=8, concurrency=2, **actor_resources(2))
    poses.write_parquet("poses/")

`PosePredictor` is a callable class, so Ray keeps a pool of actors, each holding one model. Rows
carry `path` (an image file the actor reads) or `bytes` (encoded image bytes), and optionally
`boxes` ((M, 4|5) xyxy pixels, a 5th column the score; `box_format="xywh"` for COCO's); without
boxes the detector finds the people. It returns one row per person with the fields of
`vitpose predict --json` (`file_name`, `category_id`, `bbox` xywh, `keypoints` [x, y, s, ...],
`bbox_score`, `score`) plus `path`, or (`rows="image"`) one row per input row with `records` (the
JSON list of them) and `error` (empty, or why the image failed), so that images with nobody and
failed images are accounted for.

`actor_resources(workers)`: what each actor asks for. Ray's default for an actor is 1 CPU, and two
model actors asking 1 CPU each on a 2-CPU machine leave nothing to the read tasks, which then never
run (the job hangs). The actors here share all CPUs but one (at most 1 each), or take one GPU each.

`vitpose predict SRC --engine ray --workers N` runs the units of this shard (all of them without
`--shard`) through such a pool and writes the same shard file as a local run (`--json DIR`), in
the driver, unit by unit as results arrive: `--resume` leaves out the units already complete in
it (not Ray's own checkpointing, which keeps nothing of a crashed run) and `vitpose merge` works
unchanged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from vitpose.errors import MissingExtraError, UserError, missing_extra
from vitpose.inference.runner import Failures, PredictOptions, RunSummary, predict_chunk

__all__ = ["PosePredictor", "actor_resources", "predict_with_ray"]


# The error of a missing Ray: the one "install the extra" error (its former name kept).
RayMissingError = MissingExtraError


def _import_ray():
    try:
        import ray
        import ray.data  # noqa: F401 - the Data library is a separate extra of ray
    except ImportError:
        raise missing_extra("--engine ray", "ray", "ray") from None
    return ray


def actor_resources(workers: int, cpus: float | None = None, gpus: float | None = None,
                    device: str | None = None) -> dict:
    """`num_cpus` / `num_gpus` for each of `workers` model actors that leave the read stage a CPU.

    cpus, gpus: the cluster's (default: `ray.cluster_resources()` when Ray is initialised, else
    this machine's CPUs and no GPU). On GPUs (and device not "cpu"): one GPU and a quarter CPU
    each. Else each takes (cpus - 1) / workers, at most 1 and at least 0.05: the actors together
    never hold the last CPU.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if cpus is None or gpus is None:
        total = {}
        try:
            import ray

            if ray.is_initialized():
                total = ray.cluster_resources()
        except ImportError:
            pass
        cpus = float(total.get("CPU", os.cpu_count() or 1)) if cpus is None else cpus
        gpus = float(total.get("GPU", 0)) if gpus is None else gpus
    if gpus >= workers and str(device or "auto") != "cpu":
        return {"num_gpus": 1, "num_cpus": 0.25}
    return {"num_cpus": round(min(1.0, max(0.05, (cpus - 1) / workers)), 3)}


def _as_boxes(value) -> np.ndarray | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = json.loads(value)
    if isinstance(value, np.ndarray) and value.dtype == object:
        value = [np.asarray(v, np.float32) for v in value]
    boxes = np.asarray(value if len(value) else np.zeros((0, 4)), np.float32)
    return boxes.reshape(len(boxes), -1) if boxes.size else np.zeros((0, 4), np.float32)


class PosePredictor:
    """A model held by one Ray actor; `__call__(batch) -> batch` for `Dataset.map_batches`.

    Args: model, config, detector ("default", "full-frame", a name of `vitpose.inference.detect`,
    or None when every row has `boxes`), device, flip_test, batch_size (boxes per forward pass),
    precision, detector_threshold, det_classes: as `vitpose.open_predictor`, the one door, so
    `model` may be weights, a published name, an HF repo id, an `.onnx` file or an OpenVINO IR,
    and a bad choice is its one-line `UsageError`. rows: "person" or
    "image" (see the module docstring). box_format: "xyxy" or "xywh" for a `boxes` column.
    threads: torch threads in this actor (default: its CPU share, at least 1).
    """

    def __init__(self, model: str = "vitpose-b-simple", *, config=None, detector: str | None = "default",
                 device: str | None = None, flip_test: bool = True, batch_size: int | None = None,
                 precision: str = "auto", detector_threshold: float | None = None, det_classes=None,
                 rows: str = "person", box_format: str = "xyxy", threads: int | None = None):
        import torch

        import vitpose  # the public API, as a user's script builds its predictor (layers: ARCHITECTURE.md)

        if rows not in ("person", "image"):
            raise ValueError(f"rows must be 'person' or 'image', got {rows!r}")
        torch.set_num_threads(max(1, int(threads or 1)))
        self.rows, self.box_format = rows, box_format
        self.predictor = vitpose.open_predictor(model, detector=detector, device=device, config=config,
                                                flip_test=flip_test, batch_size=batch_size, precision=precision,
                                                detector_threshold=detector_threshold, det_classes=det_classes)

    def _image(self, batch, i: int) -> np.ndarray:
        from vitpose.data.image_io import decode_image, load_image

        if "bytes" in batch:
            data = batch["bytes"][i]
            where = str(batch["path"][i]) if "path" in batch else "<bytes>"
            return decode_image(np.frombuffer(data, np.uint8), where)
        return load_image(str(batch["path"][i]))[0]

    def __call__(self, batch: dict) -> dict:
        from vitpose.inference.pipeline import coco_records

        n = len(batch["bytes"] if "bytes" in batch else batch["path"])
        images, errors = [None] * n, [""] * n
        for i in range(n):
            try:
                images[i] = self._image(batch, i)
            except Exception as e:  # noqa: BLE001 - an unreadable image costs that image
                errors[i] = f"{type(e).__name__}: {e}"
        good = [i for i in range(n) if images[i] is not None]
        given = [_as_boxes(batch["boxes"][i]) for i in good] if "boxes" in batch else None
        failures = Failures(prog="vitpose (ray)")
        found = predict_chunk(self.predictor, [images[i] for i in good], given, good, failures,
                              box_format=self.box_format)
        poses = {i: p for i, p in zip(good, found) if p is not None}
        for i, error in failures.errors.items():
            errors[i] = f"{type(error).__name__}: {error}"
        names = [Path(str(batch["path"][i])).name if "path" in batch else None for i in range(n)]
        ids = batch.get("image_id")
        per_image = []
        for i in range(n):
            records = []
            if i in poses:
                records, _ = coco_records(poses[i], image_id=None if ids is None else int(ids[i]), file_name=names[i])
            per_image.append(records)
        if self.rows == "image":
            out = {"records": np.array([json.dumps(r) for r in per_image], dtype=object),
                   "error": np.array(errors, dtype=object)}
            for key in ("unit", "path"):
                if key in batch:
                    out[key] = np.asarray(batch[key])
            return out
        flat = [(i, r) for i in range(n) for r in per_image[i]]
        columns = ("file_name", "category_id", "bbox", "keypoints", "bbox_score", "score")
        if getattr(self.predictor, "calibration", None) is not None:  # every batch of a calibrated model has them
            columns += ("p", "visibility")
        out = {name: np.array([r[name] for _, r in flat] if flat else [], dtype=object) for name in columns}
        if "path" in batch:
            out["path"] = np.array([str(batch["path"][i]) for i, _ in flat], dtype=object)
        return out


def _image_size(path) -> tuple[int, int] | None:
    """(width, height) from the image's header, or None when it cannot be read (the actor reports it)."""
    from vitpose.data.errors import DataError
    from vitpose.data.image_io import read_image_size

    try:
        return read_image_size(path)
    except DataError:
        return None


def predict_with_ray(options: PredictOptions, plan, boxes) -> int:
    """`vitpose predict --engine ray`: this shard's images through `--workers` actors; the driver
    writes the shard file. Exit status as the local run: 0, 1 (some images failed), 130."""
    ray = _import_ray()
    if plan is None or plan.json_path is None:
        raise UserError("--engine ray writes shard files: give --json DIR (then vitpose merge DIR)")
    if any(u.start is not None for u in plan.units):
        raise UserError("--engine ray runs images; a video's --segment units run with the local engine")
    workers = options.workers or 1
    if workers < 1:
        raise UserError(f"--workers must be >= 1, got {workers}")
    table, key = boxes if boxes is not None else (None, None)
    results = plan.results_file()
    items = []
    for unit in plan.mine:
        if unit.id in results.done_units:
            continue
        item = {"unit": unit.id, "path": str(unit.path), "image_id": unit.image_id}
        if table is not None:
            # checked against the image's size (its header) as a local run checks it: the same refusal
            found = table.lookup(key, unit.file_name if key == "file_name" else unit.image_id, _image_size(unit.path))
            item["boxes"] = json.dumps(found.as_array().tolist())
        items.append(item)
    model = options.model
    if not ray.is_initialized():
        if options.ray_address:
            ray.init(address=options.ray_address, log_to_driver=False)
        else:
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    resources = actor_resources(workers, device=model.device)
    kwargs = {"model": model.model, **model.kwargs(), "rows": "image", "threads": max(1, int(resources.get("num_cpus", 1)))}
    if kwargs["detector"] == "none":  # every unit carries its boxes
        kwargs["detector"] = None
    summary = RunSummary("images", skipped=len(plan.mine) - len(items))
    try:
        if items:
            ds = ray.data.from_items(items).map_batches(PosePredictor, fn_constructor_kwargs=kwargs,
                                                         batch_size=options.batch_images, concurrency=workers,
                                                         batch_format="numpy", **resources)
            for row in ds.iter_rows():
                name = Path(row["path"]).name
                if row["error"]:
                    summary.failures.note(f"{name}: {row['error']}")
                    continue
                records = json.loads(row["records"])
                results.write(records, unit=name)  # the image's unit, whole
                summary.items += 1
                summary.units += 1
                summary.people += len(records)
                summary.nobody += not records
    except KeyboardInterrupt:
        summary.interrupted = True
    finally:
        where = results.close(completed=not summary.interrupted)
    return summary.report(where, detail=f" (ray, {workers} workers)", written=[where])
