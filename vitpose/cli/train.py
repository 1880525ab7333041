"""`vitpose train`: train ViTPose on COCO keypoints (top-down, 256x192) -- or on a synthetic set with --demo.

    vitpose train --amp                                     # ViTPose-S, classic decoder, COCO
    vitpose train --config vitpose-b_coco_256x192 --amp --data-root /data/coco
    vitpose train --demo                                    # synthetic set, small ViT, CPU-friendly
    vitpose train --resume auto                             # continue from the newest valid checkpoint
    torchrun --nproc_per_node 8 -m vitpose train --amp      # several GPUs (NCCL) or processes (gloo)
    vitpose train --detach --nproc-per-node 8 --amp         # the same, surviving a closed terminal

The recipe is MMPose's ViTPose recipe (docs/recipe.md): AdamW with layer-wise LR decay, linear warmup
over 500 iterations, x0.1 after epochs 170 and 200, gradient clipping at 1.0, MSE heatmap loss on
UDP targets. `train()` (`vitpose.engine.loop`, importable from here) is the whole run; setup and the
epoch end are `vitpose.engine.session`, one epoch `vitpose.engine.trainer.train_one_epoch`.

Stopping: SIGTERM or Ctrl-C finishes the current step, saves WORK_DIR/last.pth and exits with
status 0; `--resume auto` then continues exactly (bit-identical on CPU) where it stopped. SIGHUP is
ignored. A non-finite loss skips its step; `train.max_nonfinite` in a row save and exit with status 3.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import vitpose
from vitpose.cli.options import add_training_arguments
from vitpose.config import find_config, load_config
from vitpose.engine import runtime, session
from vitpose.engine.loop import EXIT_NONFINITE, train
from vitpose.engine.workdir import check_fresh_start
from vitpose.errors import EXIT_OK, EXIT_USAGE

DEFAULT_CONFIG = "vitpose-s_coco_256x192"  # shipped configs, found by name (vitpose.config.find_config)
DEMO_CONFIG = "demo"

EPILOG = """\
The flags above override the config file; --set overrides any config field, e.g.
  --set optim.lr=1e-3 --set train.val_every=5 --set model.drop_path_rate=0.2
Unknown keys fail before any work starts, naming the closest valid key.

Detaching: --detach restarts this command in its own session (setsid), stdin closed,
output appended to WORK_DIR/train.log, and prints the PID. With --nproc-per-node N it
starts torchrun the same way. Use this rather than `nohup torchrun ...`: torchrun
installs its own SIGHUP handler that stops the workers, so nohup does not protect it
from an ssh drop, while a new session never receives that SIGHUP."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("train", help="train a model (COCO, another dataset, or the synthetic demo)",
                              description=__doc__.split("\n\n")[0], epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, metavar="FILE|NAME",
                   help=f"run config: a YAML file or a shipped config's name (default {DEFAULT_CONFIG}; "
                        f"{DEMO_CONFIG} with --demo)")
    p.add_argument("--demo", action="store_true",
                   help="train a small ViT on a synthetic COCO-layout set (written once to work_dirs/demo/synthetic_coco); minutes on a CPU")
    add_training_arguments(p)
    p.add_argument("--amp-dtype", choices=["float16", "bfloat16"], default=None,
                   help="autocast dtype with --amp (bfloat16 needs no scaler)")
    p.add_argument("--data-root", default=None, help="COCO root holding annotations/, train2017/, val2017/")
    p.add_argument("--init", default=None, metavar="SOURCE",
                   help="fine-tune from a pose model (model.init): a published name (vitpose-b), an HF repo id, a "
                        "weights or checkpoint file; the backbone whole, the head by keypoint name")
    p.add_argument("--init-expert", default=None, metavar="NAME",
                   help="the expert (dataset) of a ViTPose+ --init source: coco, aic, mpii, ap10k, apt36k, "
                        "coco_wholebody (model.init_expert)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--detach", action="store_true",
                   help="run in the background in a new session; output to WORK_DIR/train.log")
    p.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                   help="start N processes through torchrun (with --detach: detached torchrun)")
    p.set_defaults(run=run)
    return p


def flag_overrides(args) -> list[str]:
    """The command-line flags as `--set` entries, applied after the config file and --set."""
    pairs = [("train.amp", True if args.amp else None), ("train.amp_dtype", args.amp_dtype),
             ("loader.batch_size", args.batch_size), ("loader.num_workers", args.workers),
             ("schedule.epochs", args.epochs), ("data.root", args.data_root),
             ("train.work_dir", args.work_dir), ("train.seed", args.seed), ("train.device", args.device),
             ("train.compile", True if args.compile else None), ("model.init", args.init),
             ("model.init_expert", args.init_expert)]
    return [f"{key}={json.dumps(value)}" for key, value in pairs if value is not None]


def run(args) -> int:
    """`vitpose train`: the config (file, then --set, then flags), the work-dir check, then the run
    here, detached, or under torchrun. User errors raise (one line from the command's handler)."""
    config_path = find_config(args.config or (DEMO_CONFIG if args.demo else DEFAULT_CONFIG))
    cfg = load_config(config_path, args.overrides + flag_overrides(args))
    check_fresh_start(Path(cfg.train.work_dir), args.resume, args.overwrite)  # before detaching: on the terminal
    if args.detach or args.nproc_per_node:
        return relaunch(args, Path(cfg.train.work_dir))
    # Missing COCO is the most common first failure: say so before any process group or worker starts.
    missing = session.missing_data_files(cfg) if cfg.data.synthetic_train_images == 0 else {}
    if missing:
        if session.is_main_process():
            print(session.missing_data_message(cfg, missing, config_path), file=sys.stderr)
        return EXIT_USAGE
    with runtime.run_guard(Path(cfg.train.work_dir) / "train.log") as stop:
        return train(cfg, config_path, args.resume, stop, overwrite=args.overwrite)


def relaunch(args, work_dir: Path) -> int:
    """This command again, without --detach/--nproc-per-node: under torchrun, in a new session, or both."""
    rest = runtime.strip_flags(args.argv, {"--detach": 0, "--nproc-per-node": 1})
    command = [sys.executable, "-m", "vitpose", "train", *rest]
    if args.nproc_per_node:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.nproc_per_node),
                   "-m", "vitpose", "train", *rest]
    # The child imports this same vitpose, wherever the parent found it (a checkout or an install).
    package_parent = str(Path(vitpose.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p))
    if not args.detach:
        return subprocess.call(command, env=env)
    log_path = work_dir / "train.log"
    pid = runtime.detach(command, log_path, env=env)
    print(f"detached: PID {pid}; log {log_path.resolve()}\n  follow: tail -f {shlex.quote(str(log_path))}"
          f"\n  stop (saves a checkpoint first): kill -TERM {pid}")
    return EXIT_OK


__all__ = ["EXIT_NONFINITE", "add_parser", "flag_overrides", "relaunch", "run", "train"]
