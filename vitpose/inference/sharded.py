"""Prediction over shards: `vitpose predict ... --shard K/N`, `--nproc-per-node N`, `--segment FRAMES`.

`vitpose.inference.units` says what a unit, a shard and a shard file are; this module runs them:
- `shard_setting(args)`: K/N from `--shard`, else from a launcher's environment (torchrun,
  SLURM's tasks and job arrays; `units.shard_from_environment`), else None (one process, as before).
- `plan_images(args, paths, names)` / `plan_segments(args, video)`: this shard's units; `args.json`
  becomes this shard's file (`--json` names a directory or a `{shard}` pattern), `args.shard_plan`
  the plan, and the image loop of `vitpose predict` writes through `ShardPlan.results_file()`.
- `predict_segments`: the frame ranges of one video, each with its own tracker, records flushed
  frame by frame and a unit's end line when its last frame is done.
- `spawn_shards(args)`: `--nproc-per-node N` starts N copies of the command with `--shard k/N`
  (one GPU each where there are GPUs), forwards SIGINT/SIGTERM to them and returns the worst status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from vitpose.errors import EXIT_FAILED, EXIT_INTERRUPTED, UserError
from vitpose.files import opencv_path
from vitpose.inference.pipeline import coco_records, image_ids, video_boxes
from vitpose.inference.units import (
    ShardError,
    ShardFile,
    WorkUnit,
    finish_shard_run,
    image_units,
    parse_shard,
    segment_units,
    shard_file_path,
    shard_from_environment,
    source_root,
    unit_shard,
    write_manifest,
)

__all__ = ["ShardPlan", "check_shard_flags", "plan_images", "plan_segments", "predict_segments", "shard_setting", "spawn_shards"]



def check_shard_flags(args, stream: str | None) -> None:
    """Flags of this module that the rest of the command line makes meaningless: one line each.
    stream: "video" / "webcam" when the source is one, else None (images)."""
    engine = getattr(args, "engine", "local")
    if engine != "ray":
        for flag, value in (("--workers", getattr(args, "workers", None)), ("--ray-address", getattr(args, "ray_address", None))):
            if value is not None:
                raise ShardError(f"{flag} sets up --engine ray; add --engine ray or leave out {flag}")
    elif args.out is not None:
        raise ShardError("--out: --engine ray writes the JSON results only; draw with a local run")
    if args.nproc_per_node is not None and engine == "ray":
        raise ShardError("--nproc-per-node starts local processes; --engine ray has its --workers: choose one")
    if args.segment is not None and stream != "video":
        raise ShardError("--segment cuts a video file into frame ranges; the source is not a video file")
    setting = (0, args.nproc_per_node, "--nproc-per-node") if args.nproc_per_node else shard_setting(args)
    if stream is not None and args.segment is None and setting is not None and setting[1] > 1:
        k, n, where = setting
        raise ShardError(f"shard {k}/{n} ({where}): a {stream} is one unit of work and would be done by every "
                         f"shard; cut a video with --segment FRAMES, or run it in one process (--shard 0/1)")


def shard_setting(args) -> tuple[int, int, str] | None:
    """(K, N, where it came from), or None when nothing asks for shards."""
    if getattr(args, "shard", None):
        k, n = parse_shard(args.shard)
        return k, n, "--shard"
    return shard_from_environment(os.environ)


@dataclass
class ShardPlan:
    shard: int
    shards: int
    where: str
    root: Path
    units: list[WorkUnit]  # every unit of the source, in one process's order
    mine: list[WorkUnit] = field(default_factory=list)
    json_path: Path | None = None  # this shard's file
    resume: bool = False

    def results_file(self) -> ShardFile:
        """This shard's file, opened (continued with --resume); the manifest written beside it."""
        write_manifest(self.json_path.parent, self.units, self.root)
        return ShardFile(self.json_path, self.shard, self.shards, self.mine, resume=self.resume)

    @property
    def paths(self) -> list[Path]:
        return [u.path for u in self.mine]


def _plan(args, units: list[WorkUnit], setting, root: Path) -> ShardPlan:
    k, n, where = setting
    plan = ShardPlan(k, n, where, root, units, [u for u in units if unit_shard(u.id, n) == k],
                     resume=bool(getattr(args, "resume", False)))
    if getattr(args, "json", None) is not None:
        plan.json_path = shard_file_path(args.json, k, n)
        args.json = plan.json_path  # checked as this shard's output file, named in the summary
    args.json_array = False  # shard files are JSON Lines (vitpose merge --format coco writes a list)
    args.shard_plan = plan
    if where != "--shard":
        print(f"vitpose predict: shard {k}/{n} from {where} (give --shard 0/1 to run every unit here)",
              file=sys.stderr)
    print(f"vitpose predict: shard {k}/{n}: {len(plan.mine)} of {len(units)} units", file=sys.stderr)
    return plan


def plan_images(args, paths: list[Path], names: list[str]) -> ShardPlan | None:
    """This shard's images (None: no shards asked for). Image ids and file names are those of the
    whole source, so that the merged files equal one process's output."""
    setting = shard_setting(args)
    if setting is None and getattr(args, "engine", "local") == "ray":
        setting = (0, 1, "--shard")  # Ray's pool runs every unit; the driver writes one shard file
    if setting is None:
        return None
    if getattr(args, "format", "coco") != "coco":
        raise ShardError(f"--format {args.format} writes one whole file; shard with --format coco and convert "
                         f"the merged results")
    root = source_root([Path(s) for s in args.source])
    ids, _ = image_ids(names)
    return _plan(args, image_units(paths, names, ids, root), setting, root)


def video_frame_count(video: Path) -> int:
    with opencv_path(video) as name:
        capture = cv2.VideoCapture(name)
        try:
            count = capture.get(cv2.CAP_PROP_FRAME_COUNT) if capture.isOpened() else 0
        finally:
            capture.release()
    return int(count) if count and count > 0 else 0


def plan_segments(args, video: Path) -> ShardPlan:
    """`--segment FRAMES` on one video: its frame ranges, this shard's share (shard 0/1 without shards)."""
    if getattr(args, "json", None) is None:
        raise ShardError("--segment writes each frame range's records to a shard file: give --json DIR")
    for flag, given in (("--out", args.out is not None), ("--smooth", args.smooth), ("--json-array", args.json_array),
                        ("--det-every", args.det_every != 1)):
        if given:
            raise ShardError(f"{flag} is not available with --segment (the segments run apart: no one video to "
                             f"draw, and the filters would restart at every border); leave out {flag}")
    count = video_frame_count(video)
    if count == 0:
        raise ShardError(f"--segment: {video} does not say how many frames it has; run it without --segment")
    root = source_root([video])
    setting = shard_setting(args) or (0, 1, "--shard")
    return _plan(args, segment_units(video, root, count, args.segment), setting, root)


# ---------------------------------------------------------------------------------------------
# Video segments


def _frames_of(unit: WorkUnit, max_failures: int = 25):
    """(index, BGR frame) of the unit's range: the frames before it are decoded and dropped
    (`grab`), which is exact in every container, where seeking lands on a key frame in some."""
    with opencv_path(unit.path) as name:
        capture = cv2.VideoCapture(name)
    try:
        if not capture.isOpened():
            raise UserError(f"{unit.path}: OpenCV cannot open this file as a video")
        for _ in range(unit.start):
            if not capture.grab():
                return
        index, failures = unit.start, 0
        while unit.stop is None or index < unit.stop:
            ok, bgr = capture.read()
            if ok and bgr is not None:
                failures = 0
                yield index, bgr
            else:
                failures += 1
                if unit.stop is None or failures >= max_failures:
                    return
            index += 1
    finally:
        capture.release()


def _predict_chunk(predictor, chunk: list, boxes, failed: list[str]) -> list:
    """The predictor on (index, frame) pairs, in one call as the unsplit run batches them; when it
    fails, frame by frame, so that one bad frame costs one frame. -> [Poses | None]."""
    table, key = boxes
    given = None
    if table is not None:
        given = [np.concatenate([d.boxes, d.scores[:, None]], axis=1) for d in (table.lookup(key, i) for i, _ in chunk)]
    try:
        found = predictor([bgr for _, bgr in chunk], boxes=given, channels="bgr")
    except Exception as e:  # noqa: BLE001 - any failure on one frame's pixels costs that frame
        if len(chunk) > 1:
            return [p for pair in chunk for p in _predict_chunk(predictor, [pair], boxes, failed)]
        failed.append(f"frame {chunk[0][0]}: {type(e).__name__}: {e}")
        return [None]
    for (index, _), poses in zip(chunk, found):
        poses.frame = index
    return found


def predict_segments(predictor, plan: ShardPlan, args, stop: threading.Event | None = None) -> int:
    """This shard's segments; returns the exit status (0, 1 some frames failed, 130 interrupted)."""
    from vitpose.inference.tracking import Tracker

    results = plan.results_file()
    boxes = video_boxes(getattr(args, "boxes", None))
    batch = max(1, int(getattr(args, "batch_images", 8) or 8))
    todo = [u for u in plan.mine if u.id not in results.done_units]
    failed: list[str] = []
    frames = people = 0
    interrupted = False
    try:
        for unit in todo:
            tracker = Tracker() if args.track else None  # each segment its own; merge joins the ids
            results.begin(unit)
            chunk: list = []
            source = _frames_of(unit)
            while True:
                if stop is not None and stop.is_set():
                    interrupted = True
                    break
                pair = next(source, None)
                if pair is not None:
                    chunk.append(pair)
                if chunk and (pair is None or len(chunk) == batch):
                    for poses in _predict_chunk(predictor, chunk, boxes, failed):
                        if poses is None:
                            continue
                        if tracker is not None:
                            poses.track_ids = tracker.update(poses.boxes, poses.keypoints, poses.keypoint_scores,
                                                             frame=poses.frame, follows=poses.follows)
                        results.add(*coco_records(poses))
                        frames += 1
                        people += len(poses)
                    chunk = []
                if pair is None:
                    break
            if interrupted:
                break
            results.end()
    finally:
        where = results.close(completed=not interrupted)
    return finish_shard_run(f"{frames} frames, {people} people in {len(todo)} segments", where,
                            len(plan.mine) - len(todo), interrupted, failed, "frames")


# ---------------------------------------------------------------------------------------------
# --nproc-per-node


def _without(argv: list[str], flags: dict[str, int]) -> list[str]:
    """argv without the given flags (each mapped to the number of values it takes)."""
    out, i = [], 0
    while i < len(argv):
        name = argv[i].split("=", 1)[0]
        if name in flags:
            i += 1 if "=" in argv[i] else 1 + flags[name]
            continue
        out.append(argv[i])
        i += 1
    return out


def _visible_gpus() -> list[str]:
    try:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        count = 0
    if not count:
        return []
    listed = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return listed[:count] if listed else [str(i) for i in range(count)]


def spawn_shards(args) -> int:
    """`--nproc-per-node N`: this command N times with `--shard k/N`, one GPU each (round robin when
    there are fewer GPUs), CPU threads split between them; the worst exit status (130 first)."""
    n = int(args.nproc_per_node)
    if n < 1:
        raise ShardError(f"--nproc-per-node must be >= 1, got {n}")
    if getattr(args, "shard", None):
        raise ShardError("--nproc-per-node gives each process its shard; leave out --shard")
    if getattr(args, "json", None) is None:
        raise ShardError("--nproc-per-node writes one file per process: give --json DIR (then vitpose merge DIR)")
    argv = _without(list(getattr(args, "argv", None) or []), {"--nproc-per-node": 1, "--shard": 1})
    gpus = _visible_gpus()
    if gpus and str(getattr(args, "device", None) or "").startswith("cuda:"):
        raise ShardError(f"--device {args.device}: --nproc-per-node gives each process its own GPU; say --device cuda")
    threads = max(1, (os.cpu_count() or 1) // n)
    children = []
    for k in range(n):
        env = dict(os.environ)
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):  # --shard decides; a launcher's own variables do not
            env.pop(name, None)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[k % len(gpus)]
        env.setdefault("OMP_NUM_THREADS", str(threads))
        if k:
            env["TQDM_DISABLE"] = "1"  # one progress bar on the terminal
        children.append(subprocess.Popen([sys.executable, "-m", "vitpose", "predict", *argv, "--shard", f"{k}/{n}"],
                                         env=env))

    def forward(signum, frame):  # Ctrl-C reaches the group anyway; a SIGTERM to this process alone does not
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, forward)
    try:
        statuses = [child.wait() for child in children]
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if any(s in (EXIT_INTERRUPTED, -signal.SIGINT, -signal.SIGTERM) for s in statuses):
        return EXIT_INTERRUPTED
    worst = max(EXIT_FAILED if s < 0 else s for s in statuses)  # killed by another signal: that shard failed
    print(f"vitpose predict: {n} shards exited with {statuses}"
          + (f"; the results: vitpose merge {args.json} --json MERGED.jsonl" if worst <= EXIT_FAILED else ""),
          file=sys.stderr)
    return worst
