"""`python evaluate.py ...` is `vitpose evaluate ...`: the same flags, the same run (vitpose/cli/evaluate.py).

    python evaluate.py --checkpoint work_dirs/demo/best.pth            # the config the checkpoint records
    python evaluate.py --config configs/vitpose-b_coco_256x192.yaml --checkpoint ckpt.pth --amp
"""

import sys

from vitpose.cli import command_parser, run_standalone
from vitpose.cli import evaluate as command

__all__ = ["main", "parse_args"]


def parse_args(argv=None):
    return command_parser(command, "evaluate.py").parse_args(argv)


def main(argv=None) -> int:
    return run_standalone(command, argv, "evaluate.py")


if __name__ == "__main__":
    sys.exit(main())
