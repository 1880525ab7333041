"""The rendezvous of a multi-process training run: every rank meets the others at MASTER_ADDR:MASTER_PORT.

torch's own env:// rendezvous waits up to 30 minutes for ranks that never come (a task of an
`salloc` shell started alone, a peer that died) without a line, inside a C++ call that SIGTERM and
SIGINT cannot interrupt: only SIGKILL ends it, and the allocation is lost meanwhile. `join` does
the waiting itself, in short steps, and hands torch a store where every rank has arrived:

- rank 0 hosts the store (torchrun's agent hosts it when torchrun says so); the other ranks try
  the address once a second until it answers;
- each rank announces itself and waits until all `world_size` have, for at most the rendezvous
  timeout (`train.rendezvous_timeout`, else the environment variable VITPOSE_RENDEZVOUS_TIMEOUT,
  else 600 s: torchrun's own rendezvous join timeout). Rank 0 prints the timeout when it starts
  waiting, the others when they have waited 5 s;
- SIGTERM / SIGINT (the run's `StopOnSignal`) stop the wait within a second, with one line naming
  what it waited for (the ranks missing, or rank 0's address), exit 143 / 130; a timeout is one
  line too (exit 2).

`LaunchError`: a launcher's variable that cannot be used (`SLURM_PROCID=x`, `RANK=3 WORLD_SIZE=2`,
no MASTER_ADDR): one line naming it.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
from collections.abc import Mapping
from datetime import timedelta

from vitpose.errors import EXIT_USAGE, UserError, signal_exit_status

__all__ = ["DEFAULT_TIMEOUT_S", "TIMEOUT_ENV", "LaunchError", "RendezvousError", "join", "master_address",
           "rendezvous_timeout"]

DEFAULT_TIMEOUT_S = 600.0
TIMEOUT_ENV = "VITPOSE_RENDEZVOUS_TIMEOUT"
POLL_S = 0.5  # how often a waiting rank looks again (and notices a stop)
QUIET_S = 5.0  # ranks other than 0 say they wait only after this long
ARRIVALS = "vitpose/arrivals"
ARRIVED = "vitpose/arrived"


class LaunchError(UserError, ValueError):
    """A launcher's variable (torchrun's, SLURM's, MASTER_ADDR / MASTER_PORT) that cannot be used:
    one line naming it (a ValueError too, as before)."""


class RendezvousError(UserError):
    """The ranks did not all arrive in time, or a signal stopped the wait: one line naming the ranks
    missing (or rank 0's address). `exit_status`: 2, or 128 + the signal's number."""

    def __init__(self, message: str, exit_status: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_status = exit_status


def rendezvous_timeout(configured: float | None = None, environ: Mapping[str, str] = os.environ) -> float:
    """Seconds to wait for every rank: the config's value, else $VITPOSE_RENDEZVOUS_TIMEOUT, else 600."""
    if configured is not None:
        return float(configured)
    text = environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise LaunchError(f"environment variable {TIMEOUT_ENV}={text!r} is not a number of seconds > 0")
    return value


def master_address(environ: Mapping[str, str] = os.environ) -> tuple[str, int]:
    """(MASTER_ADDR, MASTER_PORT), each checked: one line naming the variable."""
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not environ.get(name, "").strip():
            raise LaunchError(f"environment variable {name} is not set: a run of several processes meets at "
                              f"MASTER_ADDR:MASTER_PORT (torchrun sets both; under srun set them, or leave RANK and "
                              f"WORLD_SIZE unset)")
    text = environ["MASTER_PORT"].strip()
    if not text.isascii() or not text.isdigit() or not 0 < int(text) < 65536:
        raise LaunchError(f"environment variable MASTER_PORT={text!r} is not a port number (1-65535)")
    return environ["MASTER_ADDR"].strip(), int(text)


def _answers(addr: str, port: int) -> bool:
    """Whether something accepts connections at addr:port (tried for at most a second)."""
    try:
        socket.create_connection((addr, port), timeout=1.0).close()
        return True
    except OSError:
        return False


class _Wait:
    """One rank's wait: says so (with the timeout), and stops on a signal or at the deadline."""

    def __init__(self, rank: int, world_size: int, where: str, timeout: float, stop):
        self.rank, self.world_size, self.where, self.timeout, self.stop = rank, world_size, where, timeout, stop
        self.started = time.monotonic()
        self.said = False

    def say(self) -> None:
        self.said = True
        print(f"rank {self.rank} of {self.world_size}: waiting for the other ranks at {self.where} (rendezvous "
              f"timeout {self.timeout:g} s: train.rendezvous_timeout or ${TIMEOUT_ENV})", file=sys.stderr, flush=True)

    def left(self) -> float:
        return self.timeout - (time.monotonic() - self.started)

    def step(self, waiting_for) -> None:
        """Between two looks: a stop or the deadline raise RendezvousError naming `waiting_for()`."""
        if not self.said and time.monotonic() - self.started >= QUIET_S:
            self.say()
        who = f"rank {self.rank} of {self.world_size}"
        if self.stop is not None and self.stop.requested:
            name = self.stop.signal_name
            raise RendezvousError(f"{who}: stopped by {name or 'a stop request'} while waiting for {waiting_for()}; "
                                  f"nothing was trained", signal_exit_status(name))
        if self.left() <= 0:
            raise RendezvousError(f"{who}: gave up after {self.timeout:g} s waiting for {waiting_for()}; check "
                                  f"that every task started and reaches {self.where}, or raise "
                                  f"train.rendezvous_timeout (or ${TIMEOUT_ENV})")
        event = getattr(self.stop, "event", None)
        if event is not None:
            event.wait(min(POLL_S, max(self.left(), 0)))
        else:
            time.sleep(min(POLL_S, max(self.left(), 0)))


def _missing(store, world_size: int) -> list[int]:
    return [r for r in range(world_size) if not store.check([f"{ARRIVED}/{r}"])]


def _ranks(ranks: list[int]) -> str:
    listed = ", ".join(map(str, ranks[:10])) + (f" and {len(ranks) - 10} more" if len(ranks) > 10 else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {listed}"


def join(rank: int, world_size: int, timeout: float, stop=None, store=None, environ: Mapping[str, str] = os.environ):
    """The store of a rendezvous where all `world_size` ranks arrived (for `init_process_group(store=)`).

    store: a store already there (torchrun's agent store); else rank 0 hosts one at MASTER_ADDR:
    MASTER_PORT and the others connect to it. stop: the run's `StopOnSignal` (its `requested`,
    `signal_name` and `event`). Raises `RendezvousError` on a stop or at the timeout, `LaunchError`
    for the address variables."""
    addr, port = master_address(environ)
    announce = getattr(stop, "on_signal", None)
    if announce is not None:  # the stop's own line ("finishing the current step") would be wrong here
        stop.on_signal = None
    try:
        return _join(rank, world_size, timeout, stop, store, addr, port)
    finally:
        if announce is not None:
            stop.on_signal = announce


def _join(rank: int, world_size: int, timeout: float, stop, store, addr: str, port: int):
    import torch.distributed as dist
    from torch.distributed.constants import default_pg_timeout

    where = f"{addr}:{port}"
    wait = _Wait(rank, world_size, where, timeout, stop)
    if rank == 0:
        wait.say()
    if store is None and rank == 0:
        try:  # listening at once; the workers are counted below, where a signal can stop the wait
            store = dist.TCPStore(addr, port, world_size, is_master=True, wait_for_workers=False, multi_tenant=True,
                                  timeout=default_pg_timeout)
        except RuntimeError as e:
            raise LaunchError(f"MASTER_PORT={port}: rank 0 cannot listen at {where} ({str(e).splitlines()[0]}); "
                              f"choose a free port") from None
    elif store is None:
        while not _answers(addr, port):  # torch's client would retry for minutes inside C++, deaf to signals
            wait.step(lambda: f"rank 0's rendezvous at {where} (nothing answers there yet)")
        store = dist.TCPStore(addr, port, world_size, is_master=False,
                              timeout=timedelta(seconds=max(wait.left(), 10.0)))
    store.set(f"{ARRIVED}/{rank}", "1")
    store.add(ARRIVALS, 1)
    while store.add(ARRIVALS, 0) < world_size:
        wait.step(lambda: f"{_ranks(_missing(store, world_size))} of {world_size} at {where}")
    return store
