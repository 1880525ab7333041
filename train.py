"""`python train.py ...` is `vitpose train ...`: the same flags, the same run (vitpose/cli/train.py).

    python train.py --demo                                  # synthetic set, small ViT, CPU-friendly
    python train.py --config configs/vitpose-b_coco_256x192.yaml --amp --data-root /data/coco
    torchrun --nproc_per_node 8 train.py --amp              # several GPUs (NCCL) or processes (gloo)
"""

import sys

from vitpose.cli import command_parser, run_standalone
from vitpose.cli import train as command
from vitpose.cli.train import DEFAULT_CONFIG, DEMO_CONFIG, EXIT_NONFINITE, EXIT_OK, EXIT_USAGE, flag_overrides

__all__ = ["DEFAULT_CONFIG", "DEMO_CONFIG", "EXIT_NONFINITE", "EXIT_OK", "EXIT_USAGE", "flag_overrides", "main",
           "parse_args"]


def parse_args(argv=None):
    return command_parser(command, "train.py").parse_args(argv)


def main(argv=None) -> int:
    return run_standalone(command, argv, "train.py")


if __name__ == "__main__":
    sys.exit(main())
