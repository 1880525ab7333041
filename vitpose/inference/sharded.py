"""Prediction over shards: `vitpose predict ... --shard K/N`, `--nproc-per-node N`, `--segment FRAMES`.

`vitpose.inference.units` says what a unit, a shard and a shard file are; this module runs them:
- `shard_setting(options)`: K/N from `--shard`, else from a launcher's environment (torchrun,
  SLURM's tasks and job arrays; `units.shard_from_environment`), else None (one process, as before).
- `plan_images(options, paths, names)` / `plan_segments(options, video)`: this shard's units and
  this shard's file (`plan.json_path`: `--json` names a directory or a `{shard}` pattern); the
  image loop of `vitpose predict` writes through `ShardPlan.results_file()`.
- `predict_segments`: the frame ranges of one video, each with its own tracker, records flushed
  frame by frame and a unit's end line when its last frame is done.
- `spawn_shards(options)`: `--nproc-per-node N` starts N copies of the command with `--shard k/N`
  (one GPU each where there are GPUs), forwards SIGINT/SIGTERM to them and returns the worst status.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from vitpose.errors import EXIT_FAILED, EXIT_INTERRUPTED
from vitpose.files import OutputWriteError
from vitpose.inference.pipeline import coco_records, image_ids, video_boxes
from vitpose.inference.records import rescored
from vitpose.inference.runner import Item, PredictOptions, RunSummary, offline_smoothing, predict_units
from vitpose.inference.smoothing import SmoothingWriter, smoothing_mode
from vitpose.inference.units import (
    ShardError,
    ShardFile,
    ShardWriteError,
    WorkUnit,
    image_units,
    model_identity,
    parse_shard,
    segment_units,
    shard_file_path,
    shard_from_environment,
    source_root,
    unit_shard,
    write_manifest,
)
from vitpose.run.sources import FrameReader, video_frame_count, video_frame_rate
from vitpose.run.stop import StopOnSignal

__all__ = ["ShardPlan", "check_shard_flags", "plan_images", "plan_segments", "predict_segments", "shard_setting", "spawn_shards"]



def check_shard_flags(options: PredictOptions, stream: str | None) -> None:
    """Flags of this module that the rest of the command line makes meaningless: one line each.
    stream: "video" / "webcam" when the source is one, else None (images)."""
    engine = options.engine
    if engine != "ray":
        for flag, value in (("--workers", options.workers), ("--ray-address", options.ray_address)):
            if value is not None:
                raise ShardError(f"{flag} sets up --engine ray; add --engine ray or leave out {flag}")
    elif options.out is not None:
        raise ShardError("--out: --engine ray writes the JSON results only; draw with a local run")
    if options.nproc_per_node is not None and engine == "ray":
        raise ShardError("--nproc-per-node starts local processes; --engine ray has its --workers: choose one")
    if options.segment is not None and stream != "video":
        raise ShardError("--segment cuts a video file into frame ranges; the source is not a video file")
    setting = (0, options.nproc_per_node, "--nproc-per-node") if options.nproc_per_node else shard_setting(options)
    if stream is not None and options.segment is None and setting is not None and setting[1] > 1:
        k, n, where = setting
        raise ShardError(f"shard {k}/{n} ({where}): a {stream} is one unit of work and would be done by every "
                         f"shard; cut a video with --segment FRAMES, or run it in one process (--shard 0/1)")


def shard_setting(options: PredictOptions) -> tuple[int, int, str] | None:
    """(K, N, where it came from), or None when nothing asks for shards."""
    if options.shard:
        k, n = parse_shard(options.shard)
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
    model: object = None  # the run's ModelOptions (`model`, `config`): the shard file records the model

    def results_file(self) -> ShardFile:
        """This shard's file, opened (continued with --resume; refused when it holds another model's
        or source's results); the manifest written beside it. A full disk: `ShardWriteError` (exit 1)."""
        identity = model_identity(getattr(self.model, "model", None), getattr(self.model, "config", None))
        # the shard file first: a --resume it refuses (another model or source) leaves the manifest as it was
        results = ShardFile(self.json_path, self.shard, self.shards, self.mine, resume=self.resume,
                            origin={**identity, "source": str(self.root)})
        try:
            write_manifest(self.json_path.parent, self.units, self.root)
        except OutputWriteError as e:
            with contextlib.suppress(OSError):
                results.close(completed=False)
            raise ShardWriteError(e.errno, e.strerror) from None
        return results

    @property
    def paths(self) -> list[Path]:
        return [u.path for u in self.mine]

    def announce(self) -> None:
        """This shard's share on stderr (said once the model is open: a mistake in the command line
        stays its one line)."""
        if self.where != "--shard":
            print(f"vitpose predict: shard {self.shard}/{self.shards} from {self.where} (give --shard 0/1 to run "
                  f"every unit here)", file=sys.stderr)
        print(f"vitpose predict: shard {self.shard}/{self.shards}: {len(self.mine)} of {len(self.units)} units",
              file=sys.stderr)


def _plan(options: PredictOptions, units: list[WorkUnit], setting, root: Path) -> ShardPlan:
    k, n, where = setting
    plan = ShardPlan(k, n, where, root, units, [u for u in units if unit_shard(u.id, n) == k], resume=options.resume,
                     model=options.model)
    if options.json is not None:  # this shard's file: checked as the output, named in the summary
        plan.json_path = shard_file_path(options.json, k, n)
    return plan


def plan_images(options: PredictOptions, paths: list[Path], names: list[str]) -> ShardPlan | None:
    """This shard's images (None: no shards asked for). Image ids and file names are those of the
    whole source, so that the merged files equal one process's output."""
    setting = shard_setting(options)
    if setting is None and options.engine == "ray":
        setting = (0, 1, "--shard")  # Ray's pool runs every unit; the driver writes one shard file
    if setting is None:
        return None
    if options.format != "coco":
        raise ShardError(f"--format {options.format} writes one whole file; shard with --format coco and convert "
                         f"the merged results")
    root = source_root([Path(s) for s in options.sources])
    ids, _ = image_ids(names)
    return _plan(options, image_units(paths, names, ids, root), setting, root)


def plan_segments(options: PredictOptions, video: Path) -> ShardPlan:
    """`--segment FRAMES` on one video: its frame ranges, this shard's share (shard 0/1 without shards)."""
    if options.json is None:
        raise ShardError("--segment writes each frame range's records to a shard file: give --json DIR")
    live = smoothing_mode(options.smooth) == "live"  # offline smoothing runs each segment with its context
    for flag, given in (("--out", options.out is not None), ("--smooth live", live),
                        ("--json-array", options.json_array), ("--det-every", options.det_every != 1)):
        if given:
            raise ShardError(f"{flag} is not available with --segment (the segments run apart: no one video to "
                             f"draw, and the filters would restart at every border); leave out {flag}"
                             + (" or use --smooth offline" if flag == "--smooth live" else ""))
    count = video_frame_count(video)
    if count == 0:
        raise ShardError(f"--segment: {video} does not say how many frames it has; run it without --segment")
    root = source_root([video])
    setting = shard_setting(options) or (0, 1, "--shard")
    return _plan(options, segment_units(video, root, count, options.segment), setting, root)


# ---------------------------------------------------------------------------------------------
# Video segments


def _segment_items(units: list[WorkUnit], stop: threading.Event | None, context: int = 0):
    """The frames of the units' ranges as `Item`s, read by the one frame reader (`FrameReader`: the
    frames before a range are decoded and dropped, exact in every container), with `context` frames
    more on each side (offline smoothing's). A unit's last frame is known once its reader ends by
    itself (not by a stop)."""
    for unit in units:
        previous = None
        end = None if unit.stop is None else unit.stop + context
        for frame in FrameReader(unit.path, stop=stop, start=max(0, unit.start - context), end=end):
            if previous is not None:
                yield previous
            previous = Item(unit, f"frame {frame.index}", frame.bgr, frame.index, last=False)
        if previous is not None:
            previous.last = not (stop is not None and stop.is_set())
            yield previous


def predict_segments(predictor, plan: ShardPlan, options: PredictOptions, stop: threading.Event | None = None) -> int:
    """This shard's segments (`predict_units`, each segment its own tracker); returns the exit
    status (0, 1 some frames failed, 130 interrupted). With `--smooth offline` each segment runs
    with the smoothing's support as context on both sides (`OfflineSmoothing.support`) and its
    writer (`SmoothingWriter`) smooths the segment's tracks over them and writes the segment's own
    frames: the numbers of one unsegmented run."""
    from vitpose.inference.tracking import Tracker

    results = plan.results_file()
    table, key = video_boxes(options.boxes)
    lookup = None if table is None else lambda label, size: table.lookup(key, int(label.split()[-1]), size)
    todo = [u for u in plan.mine if u.id not in results.done_units]
    trackers: dict[str, Tracker] = {}
    offline = smoothing_mode(options.smooth) == "offline"
    context = 0
    if offline and todo:
        fps = video_frame_rate(todo[0].path)
        settings = offline_smoothing(options)
        context = settings.support(fps)
        results = SmoothingWriter(results, fps, settings, keep_track_ids=options.track)

    def finish(item, poses):
        poses.frame = item.index
        if options.track or offline:  # each segment its own; merge joins the ids
            tracker = trackers.setdefault(item.unit.id, Tracker())
            poses.track_ids = tracker.update(poses.boxes, poses.keypoints, poses.keypoint_scores, frame=poses.frame,
                                             follows=poses.follows)
        return rescored(*coco_records(poses), options.rescore)

    summary = RunSummary("frames", skipped=len(plan.mine) - len(todo))
    try:
        predict_units(predictor, _segment_items(todo, stop, context), results, finish, stop,
                      batch=max(1, int(options.batch_images or 8)), box_lookup=lookup, summary=summary)
    finally:
        where = results.close(completed=not (stop is not None and stop.is_set()))
    detail = f" in {len(todo)} segments" + (f" ({context} frames of context each side)" if context else "")
    return summary.report(where, detail=detail, written=[where])


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


def spawn_shards(options: PredictOptions) -> int:
    """`--nproc-per-node N`: this command N times with `--shard k/N`, one GPU each (round robin when
    there are fewer GPUs), CPU threads split between them; the worst exit status (130 first)."""
    n = int(options.nproc_per_node)
    if n < 1:
        raise ShardError(f"--nproc-per-node must be >= 1, got {n}")
    if options.shard:
        raise ShardError("--nproc-per-node gives each process its shard; leave out --shard")
    if options.json is None:
        raise ShardError("--nproc-per-node writes one file per process: give --json DIR (then vitpose merge DIR)")
    argv = _without(list(options.argv), {"--nproc-per-node": 1, "--shard": 1})
    gpus = _visible_gpus()
    device = getattr(options.model, "device", None)
    if gpus and str(device or "").startswith("cuda:"):
        raise ShardError(f"--device {device}: --nproc-per-node gives each process its own GPU; say --device cuda")
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

    def forward(name: str) -> None:  # Ctrl-C reaches the group anyway; a SIGTERM to this process alone does not
        for child in children:
            if child.poll() is None:
                child.send_signal(getattr(signal, name))

    with StopOnSignal(on_signal=forward, hard=()):
        statuses = [child.wait() for child in children]
    return shards_status(statuses, options.json)


def shards_status(statuses: list[int], json_dir) -> int:
    """The exit status of `--nproc-per-node` from its children's (Popen's: -N killed by signal N):
    130 when one was interrupted, else the worst, a child killed by any other signal (SIGKILL, the
    OOM killer) counting as a failed shard (1, never 0: a job script must not see success with a
    shard missing). Each shard that did not succeed is named, with what finishes it."""
    n = len(statuses)
    if any(s in (EXIT_INTERRUPTED, -signal.SIGINT, -signal.SIGTERM) for s in statuses):
        return EXIT_INTERRUPTED
    for k, s in enumerate(statuses):
        if s < 0:
            name = signal.Signals(-s).name if -s in signal.valid_signals() else f"signal {-s}"
            print(f"vitpose predict: shard {k}/{n} was killed by {name}; run it again with --shard {k}/{n} --resume "
                  f"(and the same --json)", file=sys.stderr)
    worst = max(EXIT_FAILED if s < 0 else s for s in statuses)
    print(f"vitpose predict: {n} shards exited with {statuses}"
          + (f"; the results: vitpose merge {json_dir} --json MERGED.jsonl" if worst == 0 else ""), file=sys.stderr)
    return worst
