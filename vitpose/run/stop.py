"""The one stop-on-signal primitive of every long job (predict, select, audit, train, the shard
launcher): SIGINT / SIGTERM ask the job to stop after the item in hand, so what it finished is
kept and `--resume` continues; a second signal stops at once.

Launchers stop a job by signalling it (`timeout`, SLURM, Kubernetes and a terminal's Ctrl-C send
SIGTERM or SIGINT, often to the whole process group), so a job that only died on them would lose
the item in flight and leave torn files. The handlers are installed only in the main thread (where
Python delivers signals) and the previous ones come back on exit, so a job run in-process (tests,
notebooks, the server) leaves the interpreter as it found it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Sequence

__all__ = ["StopOnSignal", "stopped_by_signal"]


class StopOnSignal:
    """A context manager: inside it, SIGINT / SIGTERM set `event` (and `requested`, `signal_name`).

    Args:
        on_signal: called with the signal's name on each signal that sets the stop (a message, or
            the launcher's forwarding of it to its children).
        hard: the names of the signals that, arriving a second time, raise KeyboardInterrupt (stop
            at once). Default both; training keeps SIGTERM soft (a scheduler may repeat it while
            the checkpoint is being written); a launcher that forwards signals passes ().
        ignore_hangup: ignore SIGHUP meanwhile (a run that outlives its terminal: ssh drops).
    Outside the main thread nothing is installed: `request()` still stops the job.
    """

    def __init__(self, on_signal: Callable[[str], None] | None = None, hard: Sequence[str] = ("SIGINT", "SIGTERM"),
                 ignore_hangup: bool = False):
        self.event = threading.Event()
        self.signal_name: str | None = None
        self.on_signal = on_signal
        self.hard = tuple(hard)
        self.ignore_hangup = ignore_hangup
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    def request(self, name: str = "request") -> None:
        """Stop the job as a signal would (another thread, a test, a peer rank's signal)."""
        self.signal_name = self.signal_name or name
        self.event.set()

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.event.is_set() and name in self.hard:
            raise KeyboardInterrupt  # a second signal: the user does not want to wait
        self.signal_name = self.signal_name or name
        self.event.set()
        if self.on_signal is not None:
            self.on_signal(name)

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
            if self.ignore_hangup and hasattr(signal, "SIGHUP"):
                self._previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, signal.SIG_IGN)
        return self

    def __exit__(self, *exc) -> bool:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        return False


@contextlib.contextmanager
def stopped_by_signal(**options) -> Iterator[StopOnSignal]:
    """`with stopped_by_signal() as stop:` is `with StopOnSignal(**options) as stop:`."""
    with StopOnSignal(**options) as stop:
        yield stop
