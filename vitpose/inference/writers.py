"""The writers of results: one protocol (`begin(unit) / add(records) / end() / close(completed)`)
that `vitpose predict --json`'s results file and a sharded run's shard file
(`vitpose.inference.units.ShardFile`, a subclass) both follow, so both keep every complete unit when
a run is stopped or the disk fills, and neither ever replaces an earlier file before the run completes.

`ResultsFile`: JSON Lines streamed unit by unit, or one JSON array (or another whole-file format
through `render`) written at the end; `partial_files` finds the `.NAME.XXXXXXXX.partial` files of
interrupted runs. No torch here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from pathlib import Path

from vitpose.errors import UserError
from vitpose.files import create_exclusive, fsync_dir, open_stream, stream_kind, write_atomic, write_error

__all__ = ["PARTIAL_SUFFIX", "ResultsFile", "partial_files"]


PARTIAL_SUFFIX = ".partial"


def partial_files(path) -> list[Path]:
    """The `.NAME.XXXXXXXX.partial` files of interrupted runs into `path` (`ResultsFile`) that this
    user owns, regular files only (never a link), oldest first."""
    path = Path(path)
    pattern = re.compile(re.escape(f".{path.name}.") + r"[A-Za-z0-9_]{8}" + re.escape(PARTIAL_SUFFIX))
    found = []
    try:
        entries = list(os.scandir(path.parent if str(path.parent) else "."))
    except OSError:
        return []
    for entry in entries:
        if not pattern.fullmatch(entry.name):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
            found.append((st.st_mtime_ns, path.parent / entry.name))
    return [p for _, p in sorted(found)]


class ResultsFile:
    """`--json`: records streamed as JSON Lines (each item's records in one write, flushed at once,
    so a process killed after N items keeps N items' lines), or one JSON array written at the end
    (`array=True`, bounded inputs only; `render` turns the records into another whole-file format).

    An existing file is replaced only when the run completes (`close(completed=True)`): until then
    the records go to a new file `.NAME.XXXXXXXX.partial` beside it, created exclusively (a random
    name: a link planted beside the output is never written through), renamed over it at the end.
    A new file is written in place (created with O_EXCL), so an interrupted run leaves a parseable
    file. `resume=True` continues an interrupted run: this output's `.partial` when there is one
    (the earlier, complete file stays as it is until this run completes), else the file itself; the
    records of the last item in it (which may be incomplete) are dropped and that item is done again,
    the others (`done`: their `file_name` or `frame`) are skipped.

    A device or pipe (`vitpose.files.stream_kind`: `--json /dev/stdout`, a FIFO) is written directly,
    item by item; it cannot be resumed. The lines are flushed per item, not fsynced (that would cost a
    disk flush per video frame): a killed process loses nothing, a power cut may tear the last lines,
    which `resume` drops. A full disk is an `OutputWriteError` (one line; the lines so far are kept).
    """

    def __init__(self, path, key: str, array: bool = False, resume: bool = False, render=None,
                 flag: str = "--json"):
        self.path, self.key, self.array, self.flag = Path(path), key, array, flag
        self.render = render  # array files: records -> text (default: a JSON list)
        self.done: set = set()
        self.records: list[dict] = []
        self.nonfinite = 0
        self.count = 0
        self.file = None
        self.unit = None
        self.failed = False
        self.stream = stream_kind(self.path)
        self.existed = os.path.lexists(self.path)
        if self.stream is not None:
            if resume:
                raise UserError(f"{flag} {self.path} is a device or pipe; --resume continues a file")
            self.target = self.path
            if not array:
                self.file = open_stream(self.path, self.stream)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)  # checked writable before the run
        if resume:
            self._open_for_resume()
        elif array:
            self.target = self.path
        else:
            self._open_new()

    def _open_new(self) -> None:
        if not self.existed:
            try:  # in place: a path that appeared since (a file, a link) is never opened
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
                self.target = self.path
                self.file = open(fd, "wb")  # noqa: SIM115 - closed in close()
                return
            except FileExistsError:
                self.existed = True
        fd, self.target = create_exclusive(self.path, PARTIAL_SUFFIX)
        self.file = open(fd, "wb")  # noqa: SIM115 - closed in close()

    def _open_for_resume(self) -> None:
        partials = partial_files(self.path)
        if self.path.exists():  # a partial older than the file was superseded by a run that completed
            finished = self.path.stat().st_mtime_ns
            partials = [p for p in partials if p.stat().st_mtime_ns >= finished]
        if len(partials) > 1:
            raise UserError(f"{self.flag} {self.path}: --resume found {len(partials)} interrupted runs' results "
                            f"beside it ({', '.join(p.name for p in partials)}); delete the ones not to continue")
        if partials:
            self.target = partials[0]
            fd = os.open(self.target, os.O_RDWR | os.O_NOFOLLOW)
        elif self.existed:
            self.target = self.path
            fd = os.open(self.target, os.O_RDWR)
        else:  # nothing to continue: a fresh file
            self._open_new()
            return
        self.file = open(fd, "r+b")  # noqa: SIM115 - closed in close()
        self._truncate_to_complete_items()

    def _truncate_to_complete_items(self) -> None:
        data = self.file.read()
        if data.lstrip().startswith(b"["):
            self.file.close()
            raise UserError(f"{self.flag} {self.target} is one JSON list; --resume continues JSON Lines (the default "
                            f"without --json-array)")
        offsets, keys, position = [], [], 0
        for line in data.splitlines(keepends=True):
            try:
                record = json.loads(line)
                keys.append(record[self.key])
            except (ValueError, KeyError, TypeError):
                if line.endswith(b"\n"):
                    self.file.close()
                    raise UserError(f"{self.flag} {self.target}: not a JSON Lines file of {self.key!r} records "
                                    f"(line {len(offsets) + 1}); --resume continues only what this command "
                                    f"wrote") from None
                break  # a torn last line: the item is done again
            offsets.append(position)
            position += len(line)
        end = position
        if keys:  # the last item's records may be incomplete (stopped mid-item): it is done again
            last = keys[-1]
            while keys and keys[-1] == last:
                keys.pop()
                end = offsets.pop()
        self.file.seek(end)
        self.file.truncate(end)
        self.done = set(keys)

    def kept_records(self):
        """The records a resumed file kept (those of `done`), read back in order (for `--track`)."""
        if self.file is None or self.stream is not None:
            return
        self.file.flush()
        end = self.file.tell()
        self.file.seek(0)
        try:
            for line in self.file.read(end).splitlines():
                if line.strip():
                    yield json.loads(line)
        finally:
            self.file.seek(end)

    def _failed_write(self, error: OSError):
        self.failed = True
        kept = (f"the results so far are in {self.target}; continue with --resume once there is space"
                if self.stream is None and not self.array else "nothing was replaced")
        return write_error(error, self.target, self.flag, kept=kept)

    # --- the writer protocol: begin(unit), add(records) as often as the unit has items, end()

    def begin(self, unit) -> None:
        """A unit of work starts (an image, a frame, a video segment)."""
        self.unit = unit

    def add(self, records: list[dict], nonfinite: int = 0) -> None:
        """Records of the open unit, written and flushed together (a killed run keeps them whole)."""
        self.count += len(records)
        self.nonfinite += nonfinite
        if self.array:
            self.records += records
        elif records:
            self._write_text("".join(self._line(r) for r in records))

    def end(self) -> None:
        """The open unit is complete."""
        self.unit = None

    def write(self, records: list[dict], nonfinite: int = 0, unit=None) -> None:
        """One unit's records at once (`begin(unit)`, `add`, `end`): an image's."""
        self.begin(unit)
        self.add(records, nonfinite)
        self.end()

    def _line(self, record: dict) -> str:
        return json.dumps(record, allow_nan=False) + "\n"

    def _write_text(self, text: str) -> None:
        """Written and flushed at once: a killed run keeps every unit it finished; a full disk is
        one line (`OutputWriteError`) naming the file and what was kept."""
        try:
            self.file.write(text.encode())
            self.file.flush()
        except OSError as e:
            converted = self._failed_write(e)
            if converted is None:
                raise
            raise converted from e

    def close(self, completed: bool) -> Path:
        """Finish the file; returns where the results are (the `.partial` file if not replaced)."""
        if self.array:
            return self._close_array(completed)
        if self.failed:  # the disk refused a write: keep what is there, report the first error only
            with contextlib.suppress(OSError):
                self.file.close()
            return self.target
        try:
            self.file.flush()
            if self.stream is None:
                os.fsync(self.file.fileno())
            self.file.close()
        except OSError as e:
            converted = self._failed_write(e)
            with contextlib.suppress(OSError):
                self.file.close()
            if converted is None:
                raise
            raise converted from e
        if completed and self.target != self.path:
            os.replace(self.target, self.path)
            fsync_dir(self.path.parent)
            return self.path
        return self.target

    def _close_array(self, completed: bool) -> Path:
        text = self.render(self.records) if self.render else json.dumps(self.records, allow_nan=False)
        if self.stream is not None or completed or not self.existed:
            write_atomic(self.path, text)  # a device or pipe: written directly
            return self.path
        # interrupted, with an earlier file in the way: the records so far beside it
        fd, self.target = create_exclusive(self.path, PARTIAL_SUFFIX)
        try:
            with open(fd, "wb") as f:
                f.write(text.encode())
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(self.target)
            converted = write_error(e, self.target, self.flag)
            if converted is None:
                raise
            raise converted from e
        return self.target
