"""`vitpose`, the console script: one subcommand per module, each module owns its arguments.

`vitpose export ...` -> `vitpose.export` (`add_parser`, `run`).
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from vitpose import export

    parser = argparse.ArgumentParser(prog="vitpose", description="ViTPose in plain PyTorch")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    export.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
