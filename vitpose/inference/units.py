"""Work units with stable ids, shards of them, the manifest, the shard files and their merge.

`vitpose predict SRC --shard K/N` (and the launchers that set K and N from their environment:
torchrun, SLURM, a Kubernetes indexed job, `--nproc-per-node`, `--engine ray`) cut the work into
*units*: an image file, or (`--segment FRAMES`) a frame range of a video. A unit's id is its path
relative to the source root, POSIX style (`val/000000000785.jpg`), plus the range for a segment
(`clip.mp4#300-600`, the last one open: `clip.mp4#600-`). A unit belongs to shard
`sha1(id) mod N` (`unit_shard`): adding files adds ids and never moves an earlier unit to another
shard, and the assignment is the same in every process, on every machine (Python's `hash()` is
salted per process, so it is never used).

Files, all in the `--json` directory (or beside the `--json` pattern's files):
- `manifest.json`: every unit of the source in the single-process order (what one process would
  write), with the `file_name` and `image_id` one process would give it. Each shard writes it
  (the same content from the same source; atomic, so concurrent writers cannot tear it).
- one shard file per shard (`shard-K-of-N.jsonl`, or the pattern with `{shard}` = `K-of-N`):
  JSON Lines; the first line a header `{"vitpose_shard": "K/N", "model": ..., "model_sha256": ...,
  "source": ROOT}` (the model as given and the SHA-256 of its file, `model_identity`; the source
  root; a header of an older vitpose without them reads as unknown), then for each unit its COCO
  records (the fields of `vitpose predict --json`, plus `"unit"`) followed by one end line
  `{"unit_done": ID, "records": COUNT}`. A unit counts only with its end line and that many
  records: a process killed mid-unit leaves records without one, which `--resume` cuts off and
  does again (`ShardFile`) and `merge_shards` ignores.

`merge_shards(directory)` refuses shard files of different models or sources (one line naming
both: the merged file would mix two models' poses, or two folders' images under one name), checks
that every unit of the manifest is complete in some shard file
(a unit complete in two files, e.g. after a rerun with another N, collapses to the first complete
copy in file-name order; units missing are listed), puts the records in the manifest's order with
the manifest's `file_name`/`image_id` (so the result equals one process's JSON Lines), and joins
the track ids of a segmented video across segment borders (`join_tracks`).

What is exactly-once: every unit is in the merged output once, whatever was killed, retried or
run twice. What is not: the work itself (a unit interrupted mid-way runs again; two processes
given the same shard both run it), and drawings (`--out`), which are rewritten by a retry.
No torch here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vitpose.errors import EXIT_FAILED, UserError
from vitpose.files import OutputWriteError, create_exclusive, write_atomic, write_error
from vitpose.inference.segment_join import JOIN_MIN_IOU, join_tracks  # noqa: F401 - importable here as before
from vitpose.inference.shard_origin import ORIGIN_KEYS, model_identity, origin_differences
from vitpose.inference.writers import PARTIAL_SUFFIX, ResultsFile

__all__ = ["MANIFEST_NAME", "Merged", "ShardFile", "ShardWriteError", "WorkUnit", "join_tracks", "merge_shards",
           "model_identity", "parse_shard", "read_manifest", "read_shard_file", "segment_units", "shard_file_path",
           "shard_from_environment", "source_root", "unit_shard", "write_manifest"]

MANIFEST_NAME = "manifest.json"
HEADER_KEY = "vitpose_shard"
DONE_KEY = "unit_done"
SHARD_FIELD = "{shard}"


class ShardError(UserError):
    """A shard setting, shard file or manifest that cannot be used, in one line."""


class ShardWriteError(OutputWriteError):
    """A shard file's disk is full (or read-only): one line, exit status 1, not 2: the run did part
    of its work and kept every complete unit, which `--resume` continues (as a run whose inputs
    partly failed); a bad flag or file is 2, and nothing was done."""

    exit_status = EXIT_FAILED


@dataclass(frozen=True)
class WorkUnit:
    """One unit of work: an image file, or the frames [start, stop) of a video (stop None: to the end)."""

    id: str
    path: Path
    file_name: str | None = None  # images: the `file_name` of its records
    image_id: int | None = None  # images: the `image_id` one process gives it
    start: int | None = None  # video segments
    stop: int | None = None

    def to_json(self) -> dict:
        if self.start is None:
            return {"id": self.id, "file_name": self.file_name, "image_id": self.image_id}
        return {"id": self.id, "video": self.path.name, "start": self.start, "stop": self.stop}


# ---------------------------------------------------------------------------------------------
# Ids and shards


def unit_shard(unit_id: str, shards: int) -> int:
    """The shard of a unit: the first 8 bytes of sha1(id) as an integer, mod `shards`."""
    digest = hashlib.sha1(unit_id.encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") % shards


_SHARD = re.compile(r"([0-9]+)/([0-9]+)")


def parse_shard(text: str, flag: str = "--shard") -> tuple[int, int]:
    """"K/N" -> (K, N) with 0 <= K < N; anything else is one line naming the flag."""
    match = _SHARD.fullmatch(str(text).strip())
    if not match:
        raise ShardError(f"{flag}: expected K/N (this process's shard K of N, counted from 0, e.g. 0/4), "
                         f"got {text!r}")
    k, n = int(match.group(1)), int(match.group(2))
    if n < 1 or k >= n:
        raise ShardError(f"{flag}: shard {k} of {n} does not exist (K counts from 0 to N-1), got {text!r}")
    return k, n


def _int_env(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name)
    if value is None or value == "":
        return None
    if not value.strip().isascii() or not value.strip().isdigit():
        raise ShardError(f"environment variable {name}={value!r} is not a whole number")
    return int(value)


def shard_from_environment(environ: Mapping[str, str] = os.environ) -> tuple[int, int, str] | None:
    """(K, N, where) from a launcher's variables when `--shard` is not given, else None.

    - torchrun: RANK / WORLD_SIZE (when WORLD_SIZE > 1).
    - SLURM: SLURM_PROCID / SLURM_NTASKS of `srun --ntasks N`, and a job array's
      SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT (counted from SLURM_ARRAY_TASK_MIN); both at
      once make task t of the array's procid p shard t * NTASKS + p of COUNT * NTASKS.
    A Kubernetes indexed job sets only JOB_COMPLETION_INDEX (not the count): pass
    `--shard $(JOB_COMPLETION_INDEX)/N` there.
    """
    world = _int_env(environ, "WORLD_SIZE")
    if world is not None and world > 1 and _int_env(environ, "RANK") is not None:
        rank = _int_env(environ, "RANK")
        if rank >= world:
            raise ShardError(f"RANK={rank} is not below WORLD_SIZE={world}")
        return rank, world, f"torchrun's RANK/WORLD_SIZE ({rank}/{world})"
    tasks = _int_env(environ, "SLURM_NTASKS") or 1
    procid = (_int_env(environ, "SLURM_PROCID") or 0) if tasks > 1 else 0
    count = _int_env(environ, "SLURM_ARRAY_TASK_COUNT")
    task = _int_env(environ, "SLURM_ARRAY_TASK_ID")
    if count is not None and task is not None and count > 1:
        index = task - (_int_env(environ, "SLURM_ARRAY_TASK_MIN") or 0)
        if not 0 <= index < count:
            raise ShardError(f"SLURM_ARRAY_TASK_ID={task} is outside the array's {count} tasks counted from "
                             f"SLURM_ARRAY_TASK_MIN; give --shard K/N")
        k, n = index * tasks + procid, count * tasks
        return k, n, f"SLURM's array task {index} of {count}" + (f", task {procid} of {tasks}" if tasks > 1 else "")
    if tasks > 1:
        if procid >= tasks:
            raise ShardError(f"SLURM_PROCID={procid} is not below SLURM_NTASKS={tasks}")
        return procid, tasks, f"SLURM_PROCID/SLURM_NTASKS ({procid}/{tasks})"
    return None


# ---------------------------------------------------------------------------------------------
# Units of a source


def source_root(sources: Sequence[Path]) -> Path:
    """The folder unit ids are relative to: a directory source itself; for files or several
    sources, the deepest folder that holds them all."""
    sources = [Path(os.path.abspath(Path(s).expanduser())) for s in sources]
    if len(sources) == 1 and sources[0].is_dir():
        return sources[0]
    folders = [s if s.is_dir() else s.parent for s in sources]
    return Path(os.path.commonpath([str(f) for f in folders]))


def unit_id_of(path: Path, root: Path) -> str:
    """The path relative to the root, with / between folders on every OS."""
    return Path(os.path.abspath(Path(path).expanduser())).relative_to(root).as_posix()


def image_units(paths: Sequence[Path], names: Sequence[str], image_ids: Sequence[int], root: Path) -> list[WorkUnit]:
    """One unit per image file; two sources that share a file name cannot be told apart in the
    records (`file_name`) and are refused."""
    units, seen = [], {}
    for path, name, image_id in zip(paths, names, image_ids):
        if Path(path).name != name:
            raise ShardError(f"{seen.get(Path(path).name, path)} and {path} share the file name "
                             f"{Path(path).name!r}; sharded runs need file names that are unique across the "
                             f"sources (shard one folder at a time, or rename)")
        seen[name] = path
        units.append(WorkUnit(unit_id_of(path, root), Path(path), file_name=name, image_id=image_id))
    return units


def segment_units(video: Path, root: Path, frame_count: int, length: int) -> list[WorkUnit]:
    """Units of `length` frames; the last one runs to the video's end, whatever the container's
    count said (`#START-`)."""
    if length < 1:
        raise ShardError(f"--segment must be >= 1 frames, got {length}")
    base = unit_id_of(video, root)
    starts = list(range(0, max(frame_count, 1), length))
    units = []
    for i, start in enumerate(starts):
        stop = starts[i + 1] if i + 1 < len(starts) else None
        units.append(WorkUnit(f"{base}#{start}-{'' if stop is None else stop}", Path(video), start=start, stop=stop))
    return units


# ---------------------------------------------------------------------------------------------
# Where the files go


def shard_file_path(json_arg: Path, shard: int, shards: int) -> Path:
    """`--json DIR` -> DIR/shard-K-of-N.jsonl; `--json 'out/poses-{shard}.jsonl'` -> K-of-N in place of {shard}."""
    text = str(json_arg)
    tag = f"{shard}-of-{shards}"
    if SHARD_FIELD in text:
        if text.count(SHARD_FIELD) != 1 or SHARD_FIELD in Path(text).parent.as_posix():
            raise ShardError(f"--json {text}: put {SHARD_FIELD} once, in the file name (e.g. out/poses-{SHARD_FIELD}.jsonl)")
        return Path(text.replace(SHARD_FIELD, tag))
    if Path(text).suffix.lower() in (".json", ".jsonl") and not Path(text).is_dir():
        raise ShardError(f"--json {text}: a sharded run writes one file per shard; name a directory "
                         f"(--json {Path(text).with_suffix('')}/) or a pattern with {SHARD_FIELD} "
                         f"(--json {Path(text).with_name(Path(text).stem + '-' + SHARD_FIELD + '.jsonl')})")
    return Path(text) / f"shard-{tag}.jsonl"


def write_manifest(directory: Path, units: Sequence[WorkUnit], source_root_: Path) -> Path:
    """`manifest.json` in `directory`: the units in one process's order (rewritten only when it changes)."""
    path = Path(directory) / MANIFEST_NAME
    text = json.dumps({"version": 1, "root": str(source_root_), "units": [u.to_json() for u in units]},
                      indent=0) + "\n"
    if not (path.is_file() and path.read_text(encoding="utf-8") == text):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    return path


def read_manifest(directory: Path) -> list[dict]:
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        raise ShardError(f"{directory}: no {MANIFEST_NAME} (the shards of `vitpose predict --shard K/N --json "
                         f"{directory}` write it); is this the --json directory of a sharded run?")
    try:
        units = json.loads(path.read_text(encoding="utf-8"))["units"]
        ids = [u["id"] for u in units]
    except (ValueError, KeyError, TypeError) as e:
        raise ShardError(f"{path}: not a manifest of vitpose predict ({e})") from None
    for i, unit in enumerate(units):
        if not _unit_entry_ok(unit):
            raise ShardError(f"{path}: unit [{i}] is not a unit of vitpose predict's manifest ({unit!r:.80}); "
                             f"run a shard again to rewrite it")
    if len(set(ids)) != len(ids):
        raise ShardError(f"{path}: a unit id appears twice")
    return units


def _unit_entry_ok(unit) -> bool:
    if not isinstance(unit, dict) or not isinstance(unit.get("id"), str):
        return False
    if "start" in unit:
        return isinstance(unit.get("video"), str) and isinstance(unit["start"], int)
    return isinstance(unit.get("file_name"), str) and isinstance(unit.get("image_id"), int)


def read_manifest_root(directory: Path) -> str | None:
    """The source root the manifest records (None: not recorded)."""
    try:
        root = json.loads((Path(directory) / MANIFEST_NAME).read_text(encoding="utf-8")).get("root")
    except (OSError, ValueError, AttributeError):
        return None
    return root if isinstance(root, str) else None


# ---------------------------------------------------------------------------------------------
# Shard files


class ShardFile(ResultsFile):
    """This shard's file: the results file's writer protocol (`begin(unit)`, `add(records)`,
    `end()`, `close(completed)`, and its full-disk and partial-file handling) with a header line
    first and an end line after each unit's records.

    `resume=True` continues an existing file: what follows its last end line (a unit cut off by a
    kill) is truncated and done again; `done_units` holds the ids of the units it holds. Without
    `resume` an existing file is replaced only when the run completes (until then the records go
    to a new `.<name>.XXXXXXXX.partial` beside it, created exclusively), as `--json` is. `units`
    maps a name (an image's file_name) to its unit, so `begin` takes a name or a `WorkUnit`;
    an image's records get the manifest's `image_id`.
    """

    def __init__(self, path: Path, shard: int, shards: int, units: Sequence[WorkUnit] = (), resume: bool = False,
                 origin: Mapping[str, str | None] | None = None):
        # The shard file's own opening rules (below); the protocol's state as the results file keeps it.
        self.path, self.key, self.array, self.flag, self.render = Path(path), "unit", False, "--json", None
        self.shard, self.shards = shard, shards
        self.origin = {k: v for k, v in (origin or {}).items() if v is not None}  # model, model_sha256, source
        self.records, self.nonfinite, self.count, self.failed, self.stream = [], 0, 0, False, None
        self.unit, self._open_records = None, 0
        self.by_name = {u.file_name: u for u in units if u.file_name is not None}
        self.done_units: set[str] = set()
        self.existed = os.path.lexists(self.path)
        # Opened without following links, created exclusively: a link planted at the shard file's
        # name, or at a guessable partial name beside it (by another user of a shared folder),
        # never redirects a write.
        if resume and self.path.is_file() and not self.path.is_symlink() and self.path.stat().st_size:
            self._truncate_to_complete_units()
            self.target = self.path
            self.file = os.fdopen(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW), "ab")
            return
        # (an empty file resumed: killed before its header was written)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.existed and not (resume and self.path.is_file() and not self.path.is_symlink()):
            fd, self.target = create_exclusive(self.path, PARTIAL_SUFFIX)  # replaced on completion
        else:
            self.target = self.path
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | (0 if resume else os.O_EXCL),
                         0o666)
        self.file = os.fdopen(fd, "wb")
        self._write_text(json.dumps({HEADER_KEY: f"{shard}/{shards}", **self.origin}) + "\n")

    @property
    def done(self) -> set[str]:
        """The names (images) of the complete units, as the image loop of `vitpose predict` skips them."""
        names = {u.id: name for name, u in self.by_name.items()}
        return {names.get(unit_id, unit_id) for unit_id in self.done_units}

    def _truncate_to_complete_units(self) -> None:
        contents = read_shard_file(self.path)
        if contents.shard != (self.shard, self.shards):
            raise ShardError(f"{self.path} holds shard {contents.shard[0]}/{contents.shard[1]}, not "
                             f"{self.shard}/{self.shards}")
        for what, theirs, ours in origin_differences(contents.origin, self.origin):
            raise ShardError(f"--resume: {self.path} holds the results of {what} {theirs}, this run's is {ours}; "
                             f"run without --resume to replace it, or give another --json")
        fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW)
        try:
            os.ftruncate(fd, contents.complete_bytes)
        finally:
            os.close(fd)
        self.done_units = set(contents.units)

    def begin(self, unit) -> None:
        self.unit = self.by_name[unit] if isinstance(unit, str) else unit
        self._open_records = 0

    def add(self, records: list[dict], nonfinite: int = 0) -> None:
        self._open_records += len(records)
        super().add(records, nonfinite)

    def _line(self, record: dict) -> str:
        record = dict(record, unit=self.unit.id)
        if self.unit.image_id is not None:
            record["image_id"] = self.unit.image_id
        return json.dumps(record, allow_nan=False) + "\n"

    def end(self) -> None:
        self._write_text(json.dumps({DONE_KEY: self.unit.id, "records": self._open_records}) + "\n")
        self.done_units.add(self.unit.id)
        self.unit = None

    def _failed_write(self, error: OSError):
        self.failed = True
        kept = (f"every complete unit is kept in {self.target}; run this shard again with --resume once there is "
                f"space" if self.target == self.path else
                f"{self.path} is unchanged, this run's complete units are in {self.target}")
        converted = write_error(error, self.target, self.flag, kept=kept)
        return None if converted is None else ShardWriteError(converted.errno, converted.strerror)


@dataclass
class ShardContents:
    shard: tuple[int, int]
    units: dict[str, list[dict]]  # complete units, in file order
    complete_bytes: int  # the length of the file up to its last end line
    torn: int = 0  # records after the last end line (a unit cut off)
    origin: dict = field(default_factory=dict)  # the header's model, model_sha256, source (absent: unknown)


def _json_line(line: bytes, path: Path, number: int):
    """A line's JSON; NaN / Infinity (which vitpose never writes) are one line naming the file and line."""
    def refuse(name):
        raise ShardError(f"{path}: line {number} has {name}, which is not JSON (vitpose writes a missing value as "
                         f"null); a shard file is written only by vitpose predict")
    return json.loads(line, parse_constant=refuse)


def read_shard_file(path: Path) -> ShardContents:
    """A shard file's complete units; a torn or unended tail is left out (and counted)."""
    path = Path(path)
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    try:
        header = _json_line(lines[0], path, 1) if lines else None
        shard = parse_shard(header[HEADER_KEY], f"{path}: header")
        origin = {k: header[k] for k in ORIGIN_KEYS if isinstance(header.get(k), str)}
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        raise ShardError(f"{path}: not a shard file of vitpose predict (its first line is not "
                         f'{{"{HEADER_KEY}": "K/N", ...}})') from None
    units: dict[str, list[dict]] = {}
    pending: list[dict] = []
    position = complete = len(lines[0])
    for number, line in enumerate(lines[1:], start=2):
        position += len(line)
        try:
            row = _json_line(line, path, number)
        except ValueError:
            if line.endswith(b"\n"):
                raise ShardError(f"{path}: line {number} is not JSON; a shard file is written only by "
                                 f"vitpose predict") from None
            break  # torn last line: the unit is done again
        if not isinstance(row, dict):
            raise ShardError(f"{path}: line {number} is not a record")
        if DONE_KEY in row:
            unit_id, count = row[DONE_KEY], row.get("records")
            if count != len(pending) or any(r.get("unit") != unit_id for r in pending):
                raise ShardError(f"{path}: line {number}: the end of unit {unit_id!r} says {count} records, the "
                                 f"file has {len(pending)} of it before it")
            units.setdefault(unit_id, pending)  # a unit written twice in one file: the first copy
            pending = []
            complete = position
        else:
            pending.append(row)
    return ShardContents(shard, units, complete, torn=len(pending), origin=origin)


# ---------------------------------------------------------------------------------------------
# Merge


@dataclass
class Merged:
    records: list[dict]
    units: int
    missing: list[str] = field(default_factory=list)
    duplicates: int = 0  # units complete in more than one file (collapsed)
    extra: list[str] = field(default_factory=list)  # complete units that the manifest does not list
    files: list[Path] = field(default_factory=list)
    torn: int = 0
    joins: int = 0  # track ids carried across segment borders


def shard_files(directory: Path) -> list[Path]:
    """The shard files in `directory`: regular files (a link to one counts) named *.jsonl whose first
    line is a shard header. Anything else is passed over unopened or unread: a FIFO or a device
    under a shard file's name would block a read forever (it is opened without blocking and left)."""
    found = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            first = f.readline(200)
        if first.startswith(b'{"' + HEADER_KEY.encode()):
            found.append(path)
    return found


def check_one_origin(files: Sequence[Path], origins: Sequence[Mapping], manifest_root: str | None) -> None:
    """One model and one source in every shard file (and the manifest's root): a ShardError naming
    two files that differ. A header without them (an older vitpose) is not compared."""
    claims = list(zip([p.name for p in files], origins))
    if manifest_root is not None:
        claims.append((MANIFEST_NAME, {"source": manifest_root}))
    for what in ("model", "source"):
        known = [(name, o) for name, o in claims if o.get(what) is not None]
        for name, origin in known[1:]:
            for differs, theirs, ours in origin_differences(known[0][1], origin):
                if differs == f"the {what}":
                    raise ShardError(f"{known[0][0]} and {name} hold results of different {what}s ({theirs} and "
                                     f"{ours}); merge one {what}'s shards: move the others out of the folder or "
                                     f"run them again with the same {'--model' if what == 'model' else 'source'}")


def merge_shards(directory: Path) -> Merged:
    """Every unit of the directory's manifest, each once, in the manifest's order (see the module docstring)."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    files = shard_files(directory)
    contents_of = [read_shard_file(path) for path in files]
    check_one_origin(files, [c.origin for c in contents_of], read_manifest_root(directory))
    complete: dict[str, list[dict]] = {}
    duplicates = torn = 0
    for contents in contents_of:
        torn += contents.torn
        for unit_id, records in contents.units.items():
            if unit_id in complete:
                duplicates += 1
                continue
            complete[unit_id] = records
    listed = {u["id"] for u in manifest}
    merged = Merged([], len(manifest), files=files, duplicates=duplicates, torn=torn,
                    extra=sorted(set(complete) - listed))
    segments: dict[str, list[tuple[dict, list[dict]]]] = {}
    for unit in manifest:
        records = complete.get(unit["id"])
        if records is None:
            merged.missing.append(unit["id"])
            continue
        if "start" in unit:
            segments.setdefault(unit["video"], []).append((unit, records))
            continue
        for record in records:
            record = {k: v for k, v in record.items() if k != "unit"}
            record["image_id"], record["file_name"] = unit["image_id"], unit["file_name"]
            merged.records.append(record)
    for parts in segments.values():
        joined, joins = join_tracks([records for _, records in parts], [unit["start"] for unit, _ in parts])
        merged.joins += joins
        merged.records += [{k: v for k, v in r.items() if k != "unit"} for r in joined]
    return merged


def as_coco_results(records: list[dict]) -> list[dict]:
    """Records as COCO keypoint results (`COCO.loadRes`): a video frame's `frame` is its image_id."""
    out = []
    for r in records:
        r = dict(r)
        if r.get("image_id") is None and r.get("frame") is not None:
            r["image_id"] = r["frame"]
        out.append(r)
    return out


def records_text(records: list[dict]) -> str:
    return "".join(json.dumps(r, allow_nan=False) + "\n" for r in records)


def keypoints_array(records: list[dict]) -> np.ndarray:
    """(R, K, 3) of the records' keypoints (None as NaN), for comparisons."""
    return np.asarray([[np.nan if v is None else v for v in r["keypoints"]] for r in records], np.float64
                      ).reshape(len(records), -1, 3)
