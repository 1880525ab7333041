"""Keeping a long run alive: signals, detaching from the terminal, output that survives it.

- SIGHUP (the terminal or ssh session went away) is ignored.
- SIGTERM / SIGINT set a flag: the loop finishes the current step, saves a checkpoint and exits
  with status 0 (`--resume auto` continues exactly). A second Ctrl-C stops at once.
- `detach` restarts the same command in a new session (no controlling terminal, stdin closed,
  output appended to WORK_DIR/train.log) and returns, printing the PID and the log path.
- `SafeStream` wraps stdout/stderr: when a write to a terminal that has gone away fails (EIO,
  EPIPE), output continues into the log file instead of killing the run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

DETACHED_ENV = "VITPOSE_DETACHED"
_DEAD_TERMINAL = {errno.EIO, errno.EPIPE, errno.ENXIO, errno.EBADF}


class StopFlag:
    """Set by SIGTERM/SIGINT; the training loop polls `requested` after each step."""

    def __init__(self):
        self.signal_name: str | None = None

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def request(self, name: str = "request") -> None:
        self.signal_name = name

    def _handler(self, signum, frame):
        name = signal.Signals(signum).name
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: the user does not want to wait
        self.signal_name = name
        _say(f"\n{name} received: finishing the current step, saving a checkpoint, then exiting "
             "(Ctrl-C again to stop at once)")


def install_signal_handlers() -> StopFlag:
    """Ignore SIGHUP, turn SIGTERM/SIGINT into a graceful stop. Main thread only."""
    flag = StopFlag()
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, flag._handler)
    signal.signal(signal.SIGINT, flag._handler)
    return flag


@contextlib.contextmanager
def run_guard(log_path: str | Path):
    """Signal handlers and vanished-terminal-proof output for the duration of a run.

    Yields the StopFlag; the previous handlers and streams come back afterwards, so a run
    started in-process (tests, notebooks) leaves the interpreter as it found it.
    """
    names = [n for n in ("SIGHUP", "SIGTERM", "SIGINT") if hasattr(signal, n)]
    old_handlers = {n: signal.getsignal(getattr(signal, n)) for n in names}
    old_streams = sys.stdout, sys.stderr
    protect_output(log_path)
    try:
        yield install_signal_handlers()
    finally:
        for n, handler in old_handlers.items():
            signal.signal(getattr(signal, n), handler)
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, SafeStream) and stream._fallback is not None:
                stream._fallback.close()
        sys.stdout, sys.stderr = old_streams


def _say(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class SafeStream:
    """A text stream that falls back to appending to `log_path` once the primary stream fails."""

    def __init__(self, primary, log_path: str | Path):
        self.primary = primary
        self.log_path = Path(log_path)
        self._fallback = None

    def _switch(self, error: BaseException):
        if self._fallback is None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._fallback = open(self.log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
            self._fallback.write(f"[vitpose] terminal output failed ({error!r}); continuing in this log\n")
        self.primary = None

    def write(self, text: str) -> int:
        if self.primary is not None:
            try:
                return self.primary.write(text)
            except (OSError, ValueError) as e:  # ValueError: the stream was closed under us
                if isinstance(e, OSError) and e.errno not in _DEAD_TERMINAL:
                    raise
                self._switch(e)
        return self._fallback.write(text)

    def flush(self) -> None:
        stream = self.primary if self.primary is not None else self._fallback
        try:
            stream.flush()
        except (OSError, ValueError) as e:
            if self.primary is not None and (not isinstance(e, OSError) or e.errno in _DEAD_TERMINAL):
                self._switch(e)
            elif self.primary is not None:
                raise

    def isatty(self) -> bool:
        try:
            return self.primary is not None and self.primary.isatty()
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        return (self.primary if self.primary is not None else self._fallback).fileno()

    def __getattr__(self, name):  # encoding, errors, ... of whichever stream is in use
        return getattr(self.primary if self.primary is not None else self._fallback, name)


def protect_output(log_path: str | Path) -> None:
    """Make stdout and stderr survive a vanished terminal (see SafeStream)."""
    if not isinstance(sys.stdout, SafeStream):
        sys.stdout = SafeStream(sys.stdout, log_path)
    if not isinstance(sys.stderr, SafeStream):
        sys.stderr = SafeStream(sys.stderr, log_path)


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


def detach(command: list[str], log_path: str | Path) -> int:
    """Start `command` in its own session with output appended to `log_path`; returns its PID.

    A new session (setsid) has no controlling terminal, so closing the terminal or dropping the
    ssh connection sends it no SIGHUP. That matters for torchrun in particular: it installs its
    own SIGHUP handler that tears the workers down, so `nohup torchrun ...` still dies on an
    ssh drop, while a torchrun started here does not.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **{DETACHED_ENV: "1", "PYTHONUNBUFFERED": "1"})
    with open(log_path, "ab") as log:
        log.write(f"\n[vitpose] detached start: {shlex.join(command)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env=env, close_fds=True,
        )
    return proc.pid


def is_detached() -> bool:
    return os.environ.get(DETACHED_ENV) == "1"
