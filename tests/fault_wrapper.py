"""Run train.py with one fault injected from outside: a signal to itself at a chosen moment.

    python tests/fault_wrapper.py '<fault as JSON>' TRAIN_ARGS...

The production code has no hooks for this; the wrapper replaces a few functions train.py looks up
at call time (`torch.save`, `os.replace`, `vitpose.engine.checkpoint.save_checkpoint`,
`vitpose.engine.trainer.train_one_epoch/forward_backward`, `vitpose.engine.evaluate.predict`,
`CocoEvaluator.evaluate`, `Telemetry.step/log_eval`) with
versions that signal the process when the fault's moment comes, then calls `train.main(argv)`.

A fault is a dict:
    event    where to strike (see `EVENTS`)
    signal   "SIGKILL" (default: nothing after it runs) or "SIGTERM" (the graceful stop)
    file     save events: the target's name ("last.pth", "best.pth", "epoch_2.pth", "config.yaml")
    iteration, epoch, batch, pending
             save events (each optional): the `iteration`, `epoch`, `batch` and `epoch_end_pending`
             the checkpoint records (pending: True for the last.pth written before validation)
    steps    "step", "during_step": the optimizer step of the run (1-based global count)
    nth      validation events (and config.yaml): strike at the nth call in this process (default 1)

Before striking, one line `FAULT <event> ...` goes straight to file descriptor 2, so the test can
tell that the fault fired (a run that ends normally never met its moment).
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

EVENTS = {
    "during_step": "in the forward/backward pass of step `steps` (a SIGTERM there stops after that step)",
    "step": "after the update of step `steps` (before its stop check and any save)",
    "save_write": "inside torch.save of a checkpoint: half of its bytes are in the temp file",
    "before_rename": "the temp file is complete and fsynced, not yet renamed over the target",
    "after_rename": "the target was just replaced (the directory not yet fsynced)",
    "validation_start": "at the start of the nth validation (predictions not yet made)",
    "validation_scoring": "inside the nth COCO scoring, after the predictions were made",
    "after_eval_log": "right after the nth eval record reached metrics.jsonl",
}
SAVE_KEYS = ("iteration", "epoch", "batch", "pending")


class FaultInjector:
    """Holds the fault, the save in progress, and the call counters; strikes at the moment."""

    def __init__(self, fault: dict[str, Any]):
        if fault["event"] not in EVENTS:
            raise SystemExit(f"fault_wrapper: unknown event {fault['event']!r}; known: {', '.join(EVENTS)}")
        self.fault = fault
        self.signal = getattr(signal, fault.get("signal", "SIGKILL"))
        self.saving: dict[str, Any] | None = None  # the checkpoint save in progress: file and position
        self.calls: dict[str, int] = {}
        self.state = None  # the run's TrainState, once training starts
        self.fired = False

    def strike(self, event: str, detail: str = "") -> None:
        """Signal this process (once); a SIGTERM returns here and the run goes on to stop."""
        if self.fired:
            return
        self.fired = True
        os.write(2, f"FAULT {event} {self.signal.name} {detail}\n".encode())
        os.kill(os.getpid(), self.signal)

    def count(self, event: str) -> bool:
        """True when this is the nth call of `event` in this process and the fault names it."""
        self.calls[event] = self.calls.get(event, 0) + 1
        return self.fault["event"] == event and self.calls[event] == self.fault.get("nth", 1)

    def matches_save(self, event: str, file: str) -> bool:
        """Whether a save event on `file` (during the save in `self.saving`, if any) is the fault."""
        f = self.fault
        if f["event"] != event or f.get("file") != file:
            return False
        if self.saving is None:  # config.yaml: no checkpoint payload, counted instead
            return self.count(event)
        return all(f[key] == self.saving[key] for key in SAVE_KEYS if key in f)


def install(injector: FaultInjector) -> None:
    """Replace the functions train.py reaches at run time with striking versions."""
    import torch

    import vitpose.engine.checkpoint as checkpoint
    import vitpose.engine.evaluate as evaluate
    import vitpose.engine.trainer as trainer
    from vitpose.engine.telemetry import Telemetry
    from vitpose.evaluation import CocoEvaluator

    real_save_checkpoint, real_torch_save, real_replace = checkpoint.save_checkpoint, torch.save, os.replace
    real_predict, real_score = evaluate.predict, CocoEvaluator.evaluate
    real_step, real_log_eval = Telemetry.step, Telemetry.log_eval
    real_train_one_epoch, real_forward_backward = trainer.train_one_epoch, trainer.forward_backward

    def save_checkpoint(state, path):
        injector.saving = {"file": Path(path).name, **{key: state[key] for key in SAVE_KEYS[:-1]},
                           "pending": bool(state.get("epoch_end_pending"))}
        try:
            return real_save_checkpoint(state, path)
        finally:
            injector.saving = None

    def torch_save(obj, f, *args, **kwargs):
        saving = injector.saving
        if saving is None or not injector.matches_save("save_write", saving["file"]):
            return real_torch_save(obj, f, *args, **kwargs)
        buffer = io.BytesIO()
        real_torch_save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        f.write(data[: len(data) // 2])  # a torn temp file, as a kill in mid-write leaves it
        f.flush()
        os.fsync(f.fileno())
        injector.strike("save_write", f"{saving} after {len(data) // 2} of {len(data)} bytes")

    def replace(src, dst, *args, **kwargs):
        name = Path(dst).name
        if injector.matches_save("before_rename", name):
            injector.strike("before_rename", f"{name} {injector.saving}")
        result = real_replace(src, dst, *args, **kwargs)
        if injector.matches_save("after_rename", name):
            injector.strike("after_rename", f"{name} {injector.saving}")
        return result

    def predict(*args, **kwargs):
        if injector.count("validation_start"):
            injector.strike("validation_start", f"call {injector.calls['validation_start']}")
        return real_predict(*args, **kwargs)

    def score(self, predictions):
        if injector.count("validation_scoring"):
            injector.strike("validation_scoring", f"call {injector.calls['validation_scoring']}")
        return real_score(self, predictions)

    def train_one_epoch(run, *args, **kwargs):
        injector.state = run.state
        return real_train_one_epoch(run, *args, **kwargs)

    def forward_backward(*args, **kwargs):
        step = injector.state.iteration + 1  # the step this pass belongs to (optim.accum_steps 1)
        if injector.fault["event"] == "during_step" and step == injector.fault["steps"]:
            injector.strike("during_step", f"in step {step}")
        return real_forward_backward(*args, **kwargs)

    def step(self, iteration, *args, **kwargs):
        result = real_step(self, iteration, *args, **kwargs)
        if injector.fault["event"] == "step" and iteration + 1 == injector.fault["steps"]:
            injector.strike("step", f"after step {iteration + 1}")
        return result

    def log_eval(self, *args, **kwargs):
        result = real_log_eval(self, *args, **kwargs)
        if injector.count("after_eval_log"):
            injector.strike("after_eval_log", f"call {injector.calls['after_eval_log']}")
        return result

    checkpoint.save_checkpoint, torch.save, os.replace = save_checkpoint, torch_save, replace
    evaluate.predict, CocoEvaluator.evaluate = predict, score
    Telemetry.step, Telemetry.log_eval = step, log_eval
    trainer.train_one_epoch, trainer.forward_backward = train_one_epoch, forward_backward


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    import train

    injector = FaultInjector(json.loads(argv[0]))
    install(injector)
    return train.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
