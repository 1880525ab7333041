"""The training run as a story: set up, then epochs and their ends until done, stopped or diverged.

`train(cfg, config_path, resume, stop)` is the one loop of every run that trains a model: `vitpose
train` and `vitpose distill` (a distillation is a config with a `distill.teacher`: the session
adds the teacher's targets to the same steps). Setup and the epoch end are `vitpose.engine.session`,
one epoch `vitpose.engine.trainer.train_one_epoch`.
"""

from __future__ import annotations

import contextlib
import functools

from vitpose.config import Config
from vitpose.engine import distributed as D
from vitpose.engine import runtime, session, trainer
from vitpose.engine.trainer import EpochEnd
from vitpose.errors import EXIT_DIVERGED, EXIT_OK, signal_exit_status

EXIT_NONFINITE = EXIT_DIVERGED  # the name train.py and the tests know


def train(cfg: Config, config_path, resume: str | None, stop: runtime.StopFlag, overwrite: bool = False) -> int:
    """One training run with a resolved config; returns the exit status.

    Every resource the run opens (work-dir lock, process group, worker pool, telemetry files) is
    registered with one ExitStack, so it is released on every exit: a normal end, a stop,
    divergence or an exception.
    """
    with contextlib.ExitStack() as closing:
        job = session.set_up(cfg, config_path, resume, overwrite, stop, closing)
        state, telemetry, last = job.state, job.telemetry, job.work_dir / "last.pth"
        while True:
            if state.epoch_end_pending:  # just trained, or resumed from a stop on an epoch's last step
                session.finish_epoch(job)
                if D.any_rank([stop.requested], job.ctx)[0] and state.epoch < cfg.schedule.epochs:
                    telemetry.message(f"stopped by {stop.signal_name or 'a signal on another rank'} after epoch "
                                      f"{state.epoch}; saved {last}. Continue with --resume auto.")
                    return signal_exit_status(stop.signal_name)
            if state.epoch >= cfg.schedule.epochs:
                break
            session.begin_epoch(job)  # the backbone frozen or not (train.freeze_backbone_epochs)
            end = trainer.train_one_epoch(job.train_run, job.loaders.train(state.epoch, start_batch=state.batch),
                                          state.epoch, cfg, job.batches_per_epoch, job.watch,
                                          save_last=functools.partial(session.save, job, "last.pth"))
            if end is EpochEnd.DIVERGED:
                session.save(job, "last.pth")
                telemetry.message(
                    f"stopping: {state.nonfinite_in_row} non-finite losses in a row (train.max_nonfinite). "
                    f"The weights are unchanged since the last finite step and saved in {last}. "
                    f"Lower optim.lr, keep optim.clip_grad, or try --amp-dtype bfloat16 / no --amp.")
                return EXIT_NONFINITE
            if state.epoch_end_pending:
                D.sync_buffers(job.train_run.model, job.ctx)  # BN statistics agree across ranks before anything is saved
            session.save(job, "last.pth")  # the resume point, before validation can take long or fail
            if end is EpochEnd.STOPPED:
                # A signal (here or on another rank: every rank asks, so all agree) exits 128 + its number,
                # so that a launcher sees an unfinished run; the configured train.stop_at_iteration exits 0.
                signalled = D.any_rank([stop.requested], job.ctx)[0]
                reason = stop.signal_name or ("a signal on another rank" if signalled else "train.stop_at_iteration")
                telemetry.message(f"stopped by {reason} at epoch {state.epoch}, batch {state.batch}, iteration "
                                  f"{state.iteration}; saved {last}. Continue with --resume auto.")
                return signal_exit_status(stop.signal_name) if signalled else EXIT_OK
        telemetry.message(f"done: {state.iteration} iterations; best AP {state.best_ap} at epoch {state.best_epoch}; "
                          f"checkpoints in {job.work_dir}")
        return EXIT_OK
