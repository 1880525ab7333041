"""Keeping a long run alive: signals, detaching from the terminal, output that survives it.

- SIGHUP (the terminal or ssh session went away) is ignored.
- SIGTERM / SIGINT set a flag: the loop finishes the current step, saves a checkpoint and exits
  with status 0 (`--resume auto` continues exactly). A second Ctrl-C stops at once. A signal to
  the whole process group (Ctrl-C, `timeout`, `kill -- -PGID`, a scheduler's stop) reaches the
  loader workers too; they ignore both (`vitpose.data.loaders`), so only this flag acts on it.
- `detach` restarts the same command in a new session (no controlling terminal, stdin closed,
  output appended to WORK_DIR/train.log) and returns, printing the PID and the log path.
- `run_guard` installs a `RunOutput` as stdout/stderr for the run. It is the one owner of
  WORK_DIR/train.log: every line the process prints goes to the terminal and, once, timestamped,
  to train.log; a traceback that ends the run lands there too. When stdout already is train.log
  (a detached run) there is no terminal side, so nothing is written twice.
- `Terminal` is the one place that handles a terminal that went away (ssh dropped: EIO; a closed
  pipe: EPIPE; a closed stream): the failed write is dropped, the terminal is no longer used, a
  note goes to train.log and the run carries on.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import logging
import os
import re
import shlex
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from vitpose.run.stop import StopOnSignal

_DEAD_TERMINAL = {errno.EIO, errno.EPIPE, errno.ENXIO, errno.EBADF}
_LINE_ENDS = re.compile(r"(?<=\n)")  # split after each newline, keeping it


class StopFlag(StopOnSignal):
    """Training's stop (`vitpose.run.stop.StopOnSignal`): SIGTERM/SIGINT finish the current step and
    save a checkpoint; a second Ctrl-C stops at once, a repeated SIGTERM does not (a scheduler may
    repeat it while the checkpoint is written); SIGHUP is ignored (an ssh drop must not end a run).
    The training loop polls `requested` after each step; the ranks agree on it (`any_rank`)."""

    def __init__(self):
        super().__init__(on_signal=_announce_stop, hard=("SIGINT",), ignore_hangup=True)


def _announce_stop(name: str) -> None:
    _say(f"\n{name} received: finishing the current step, saving a checkpoint, then exiting "
         "(Ctrl-C again to stop at once)")


@contextlib.contextmanager
def run_guard(log_path: str | Path) -> Iterator[StopFlag]:
    """Signal handlers and the run's output (see RunOutput) for the duration of a run.

    Yields the StopFlag. An exception that ends the run is written to train.log before it
    propagates (the interpreter then prints it on the terminal as usual). The previous handlers
    and streams come back afterwards, so a run started in-process (tests, notebooks) leaves the
    interpreter as it found it.

    Args:
        log_path: the run's train.log (appended to; created with its folder when missing).
    """
    old_streams = sys.stdout, sys.stderr
    output = RunOutput(sys.stdout, log_path, stderr=sys.stderr)
    sys.stdout, sys.stderr = output.stdout, output.stderr
    # The library's warnings (e.g. a skipped unreadable image, logged in a loader worker) go to
    # the run's stderr, and so into train.log, whatever the root logger is set up to do.
    warnings_handler = _StderrAtEmit()
    warnings_handler.setLevel(logging.WARNING)
    warnings_handler.setFormatter(logging.Formatter("warning: %(message)s"))
    library_log = logging.getLogger("vitpose")
    library_log.addHandler(warnings_handler)
    try:
        with StopFlag() as stop:
            yield stop
    except BaseException as e:
        if not isinstance(e, SystemExit):
            output.log_exception(e)
        raise
    finally:
        library_log.removeHandler(warnings_handler)
        sys.stdout, sys.stderr = old_streams
        output.close()


class _StderrAtEmit(logging.StreamHandler):
    """A logging handler writing to whatever `sys.stderr` is when a record comes (a forked loader
    worker has the run's stderr too)."""

    def __init__(self):
        super().__init__()

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ assigns it; the current stderr always wins
        pass


def _say(text: str) -> None:
    # Called from the signal handler, which may interrupt a write to the same stream
    # (RuntimeError: reentrant call): the message is then lost, the stop request is not.
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        print(text, file=sys.stderr, flush=True)


class Terminal:
    """A terminal stream (the real stdout or stderr) that may go away while the run goes on.

    A write or flush that fails because the terminal is gone (EIO, EPIPE, ENXIO, EBADF, or a
    closed stream) is dropped; from then on `alive` is False, nothing more is sent to it, and
    `on_lost` is told once (it writes the note into train.log). Other errors (a full disk behind a
    redirected stdout, say) are raised: they are not a terminal going away.

    Args:
        stream: the stream to write to.
        name: "stdout" or "stderr", for the note.
        on_lost: called once with a sentence saying what failed.
    """

    def __init__(self, stream: TextIO, name: str = "stdout", on_lost=None):
        self.stream = stream
        self.name = name
        self.on_lost = on_lost
        self.alive = True

    def _guard(self, fn, fallback):
        if not self.alive:
            return fallback
        try:
            return fn()
        except OSError as e:
            if e.errno not in _DEAD_TERMINAL:
                raise
            self._lose(e)
        except ValueError as e:  # "I/O operation on closed file"; other ValueErrors are bugs
            if not getattr(self.stream, "closed", False):
                raise
            self._lose(e)
        return fallback

    def _lose(self, error: BaseException) -> None:
        self.alive = False
        if self.on_lost is not None:
            self.on_lost(f"terminal output stopped ({self.name}: {type(error).__name__}: {error}); "
                         "the run continues, writing to train.log")

    def write(self, text: str) -> int:
        return self._guard(lambda: self.stream.write(text), len(text))

    def flush(self) -> None:
        self._guard(self.stream.flush, None)

    def isatty(self) -> bool:
        if not self.alive:
            return False
        try:
            return bool(self.stream.isatty())
        except (AttributeError, OSError, ValueError):
            return False

    def fileno(self) -> int:
        return self.stream.fileno()


class RunLog:
    """train.log, opened once per process for appending; every line starts with its time.

    Line buffered, so `tail -f` follows it and each line reaches the file in one write (several
    processes of a torchrun job append to the same file without cutting each other's lines).

    Args:
        path: the log file.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._at_line_start = True
        self._held: list[str] = []  # whole lines that arrived in the middle of another line

    def write(self, text: str) -> int:
        for piece in _LINE_ENDS.split(text):
            if not piece:
                continue
            if self._at_line_start and piece != "\n":
                self.file.write(datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S  "))
            self.file.write(piece)
            self._at_line_start = piece.endswith("\n")
            if self._at_line_start and self._held:
                held, self._held = self._held, []
                self.write("".join(held))
        return len(text)

    def write_line(self, text: str) -> None:
        """A whole line; one that comes while another is half written waits for its end."""
        if self._at_line_start:
            self.write(text + "\n")
        else:
            self._held.append(text + "\n")

    def flush(self) -> None:
        self.file.flush()

    def fileno(self) -> int:
        return self.file.fileno()

    def close(self) -> None:
        if not self._at_line_start:
            self.write("\n")
        self.file.close()

    @property
    def closed(self) -> bool:
        return self.file.closed


class _Tee:
    """What sys.stdout / sys.stderr become during a run: the terminal (if any) and train.log."""

    def __init__(self, terminal: Terminal | None, log: RunLog, owner: RunOutput):
        self.terminal = terminal
        self.log = log
        self.owner = owner

    def write(self, text: str) -> int:
        self.log.write(text)  # the log first: it must have the text even if the terminal raises
        if self.terminal is not None:
            self.terminal.write(text)
            if "\n" in text:
                # Line by line, as on a terminal: a pipe that closed is noticed now, not by a
                # failing flush at interpreter exit (which would turn a finished run's status into 120).
                self.terminal.flush()
        return len(text)

    def flush(self) -> None:
        if not self.log.closed:
            self.log.flush()
        if self.terminal is not None:
            self.terminal.flush()

    def isatty(self) -> bool:
        return self.terminal is not None and self.terminal.isatty()

    def fileno(self) -> int:
        if self.terminal is not None and self.terminal.alive:
            return self.terminal.fileno()
        return self.log.fileno()

    @property
    def encoding(self) -> str:
        return "utf-8"

    @property
    def errors(self) -> str:
        return "strict"

    @property
    def closed(self) -> bool:
        return self.log.closed

    def writable(self) -> bool:
        return True

    def __getattr__(self, name):  # anything else (newlines, buffer, ...) from the stream in use
        if name.startswith("__") or name in ("terminal", "log", "owner"):  # e.g. during copy/pickle
            raise AttributeError(name)
        stream = self.terminal.stream if self.terminal is not None and self.terminal.alive else self.log.file
        return getattr(stream, name)


class RunOutput:
    """Where a run's text goes: the terminal while it lasts, and train.log (the one owner).

    `say` puts a line on both, `note` in train.log only; `terminal` is the terminal side alone
    (for a progress bar, which must not fill the log); `stdout` and `stderr` are the streams that
    `run_guard` installs. When a stream already is the log file (`--detach` starts the run with
    its output appended to train.log), that stream has no terminal side: its text is written to
    train.log once, through this object.

    Args:
        stdout: the process's stdout (a terminal, a pipe, a file, or train.log itself).
        log_path: train.log; None for no log at all (a Telemetry in a notebook or a test).
        stderr: the process's stderr; None to leave stderr alone.
    """

    def __init__(self, stdout: TextIO, log_path: str | Path | None = None, stderr: TextIO | None = None):
        self.log = RunLog(log_path) if log_path is not None else None
        self.terminal = self._terminal(stdout, "stdout")
        self._stderr_terminal = self._terminal(stderr, "stderr") if stderr is not None else None
        self.stdout = _Tee(self.terminal, self.log, self) if self.log is not None else self.terminal
        self.stderr = _Tee(self._stderr_terminal, self.log, self) if self.log is not None else self._stderr_terminal

    def _terminal(self, stream: TextIO, name: str) -> Terminal | None:
        if self.log is not None and _same_file(stream, self.log.path):
            return None  # detached: this stream is train.log; writing to it too would double every line
        return Terminal(stream, name, on_lost=self.note)

    @property
    def interactive(self) -> bool:
        """True while the terminal side is a live terminal (a progress bar makes sense)."""
        return self.terminal is not None and self.terminal.isatty()

    def say(self, text: str) -> None:
        """One line to the terminal (while it lasts) and to train.log."""
        if self.stdout is not None:
            self.stdout.write(text + "\n")
            self.stdout.flush()

    def note(self, text: str) -> None:
        """One line to train.log only (nothing when there is no log)."""
        if self.log is not None and not self.log.closed:
            self.log.write_line(text)

    def log_exception(self, error: BaseException) -> None:
        """The traceback of an exception that ends the run, into train.log.

        Skipped when stderr is train.log itself: the interpreter prints it there anyway.
        """
        if self.log is not None and self.stderr is not None and self._stderr_terminal is not None:
            self.note("".join(traceback.format_exception(type(error), error, error.__traceback__)).rstrip("\n"))

    def close(self) -> None:
        if self.log is not None and not self.log.closed:
            self.log.close()


def current_output() -> RunOutput:
    """The RunOutput that `run_guard` installed, or one over sys.stdout with no log outside a run."""
    owner = getattr(sys.stdout, "owner", None)
    return owner if isinstance(owner, RunOutput) else RunOutput(sys.stdout)


def _same_file(stream, path: Path) -> bool:
    """Whether `stream` writes to the file at `path` (same device and inode)."""
    try:
        mine, theirs = os.fstat(stream.fileno()), os.stat(path)
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return False
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


def strip_flags(argv: list[str], flags: dict[str, int]) -> list[str]:
    """argv without the given flags; `flags` maps a flag to the number of values it takes."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        name = arg.split("=", 1)[0]
        if name in flags:
            i += 1 if "=" in arg else 1 + flags[name]
            continue
        out.append(arg)
        i += 1
    return out


def detach(command: list[str], log_path: str | Path, env: dict[str, str] | None = None) -> int:
    """Start `command` in its own session with output appended to `log_path`; returns its PID.

    A new session (setsid) has no controlling terminal, so closing the terminal or dropping the
    ssh connection sends it no SIGHUP. That matters for torchrun in particular: it installs its
    own SIGHUP handler that tears the workers down, so `nohup torchrun ...` still dies on an
    ssh drop, while a torchrun started here does not. The child's `run_guard` sees that its
    stdout is the log and writes each line there once. `env`: the child's environment (default: ours).
    """
    log = RunLog(log_path)
    log.write_line(f"detached start: {shlex.join(command)}")
    log.close()
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    with open(log.path, "ab") as out:
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, env=env, close_fds=True,
        )
    return proc.pid
