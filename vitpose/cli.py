"""The `vitpose` console script: one subcommand per module, each module owns its arguments.

`vitpose predict ...` -> `vitpose.predict_cli`, `vitpose export ...` -> `vitpose.export`. Each has
`add_parser(subparsers)` (which sets `run` as the parser's default) and `run(args) -> exit status`.
"""

from __future__ import annotations

import argparse


def build_parser() -> argparse.ArgumentParser:
    from vitpose import export, predict_cli

    parser = argparse.ArgumentParser(prog="vitpose", description="ViTPose in plain PyTorch.", allow_abbrev=False)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    predict_cli.add_parser(subparsers)
    export.add_parser(subparsers)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
