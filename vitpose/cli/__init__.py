"""The `vitpose` console script: one subcommand per module, each module owns its arguments.

`vitpose predict ...` -> `vitpose.cli.predict`, `vitpose export ...` -> `vitpose.inference.export`. Each has
`add_parser(subparsers)` (which sets `run` as the parser's default) and `run(args) -> exit status`.
`vitpose tune | plot | check-data | build-crop-cache ...` hand their arguments to the module's `main(argv)`.
"""

from __future__ import annotations

import argparse
import sys


def _standalone():
    from vitpose.cli import build_crop_cache, check_data, plot, tune

    return {"tune": tune, "plot": plot, "check-data": check_data, "build-crop-cache": build_crop_cache}


def build_parser() -> argparse.ArgumentParser:
    from vitpose.cli import import_annotations
    from vitpose.cli import predict as predict_cli
    from vitpose.inference import export

    parser = argparse.ArgumentParser(prog="vitpose", description="ViTPose in plain PyTorch.", allow_abbrev=False)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    predict_cli.add_parser(subparsers)
    export.add_parser(subparsers)
    import_annotations.add_parser(subparsers)
    for name in _standalone():
        subparsers.add_parser(name, add_help=False)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    for stream in (sys.stdout, sys.stderr):  # a file name that is not UTF-8 prints as \xNN, never crashes
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    commands = _standalone()
    if argv and argv[0] in commands:
        result = commands[argv[0]].main(argv[1:])
        return result if isinstance(result, int) else 0
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
