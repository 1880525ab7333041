"""The `vitpose` command: one console script, one subcommand per module, one error handler.

    vitpose train | evaluate | predict | export | tune | check-data | build-crop-cache | plot | import-annotations
            | merge | convert | serve | select | audit | calibrate | triangulate | distill

Each command module has `add_parser(subparsers)` (which sets `run` as its parser's default) and
`run(args) -> exit status`. Adding a command is one line in `COMMANDS`. Every subcommand's parser
is a `CommandParser`: it starts with the shared options (`--config`, `--set`, `--device`,
`--debug`; a command takes a subset with `shared=`), rejects abbreviated flags, and `main` runs
it under the one error handler (`run_command`; no command has its own):
- a `vitpose.errors.UserError` is printed as one line and exits with its status (2; an export
  whose gate failed 1), `--debug` raises it with its traceback instead;
- any other exception is a bug, whatever its class (a `ValueError` too): its traceback is printed,
  then one line saying so, exit status 70 (`--debug` lets it propagate as Python would);
- Ctrl-C exits with 130.
The statuses are one table, `vitpose.errors.EXIT_STATUSES`, printed by `vitpose --help`.
`python train.py` and `python evaluate.py` are this handler around one command (`run_standalone`).

`--config` means one thing in every command: the run config, a YAML file or the name of a shipped
config, the file `vitpose train --config` takes. `predict` and `export` read its model section and
skeleton (what the weights were trained as); `evaluate` its model, data and eval sections.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Sequence

from vitpose.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_STATUSES, UserError

# The subcommands (modules of this package), in the order `vitpose --help` lists them. Each is
# imported only when its command runs (or for the full --help): `vitpose merge` never loads torch.
COMMANDS = ("train", "evaluate", "predict", "export", "tune", "check_data", "build_crop_cache", "plot",
            "import_annotations", "merge", "convert", "serve", "select", "audit", "calibrate", "triangulate", "distill")


def command_module(name: str):
    """The module of the command `name` ("check-data" or "check_data")."""
    return importlib.import_module(f"vitpose.cli.{name.replace('-', '_')}")


SHARED = ("--config", "--set", "--device", "--debug")
CONFIG_HELP = ("run config: a YAML file or the name of a shipped config (e.g. vitpose-s_coco_256x192, demo; "
               "see configs/), the file vitpose train --config takes")


def shared_options(names: Sequence[str] = SHARED) -> argparse.ArgumentParser:
    """The parent parser of the options every command shares (those in `names`)."""
    parent = argparse.ArgumentParser(add_help=False)
    if "--config" in names:
        parent.add_argument("--config", default=None, metavar="FILE|NAME", help=CONFIG_HELP)
    if "--set" in names:
        parent.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                            help="override a config field, e.g. --set optim.lr=1e-3 (repeatable)")
    if "--device" in names:
        parent.add_argument("--device", default=None, help="auto | cpu | cuda | cuda:N")
    if "--debug" in names:
        parent.add_argument("--debug", action="store_true",
                            help="show the traceback of an error that is yours to fix instead of one line")
    return parent


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: the shared options first, no abbreviated flags (`--lr` must not
    silently mean something else). A command's own definition of a shared option wins."""

    def __init__(self, *args, shared: Sequence[str] = SHARED, parents: Sequence[argparse.ArgumentParser] = (),
                 **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("conflict_handler", "resolve")
        super().__init__(*args, parents=[shared_options(shared), *parents], **kwargs)


def exit_status_table() -> str:
    """The exit statuses of every command, as `vitpose --help` prints them."""
    import textwrap

    return "exit status:\n" + "\n".join(
        textwrap.fill(meaning, 100, initial_indent=f"  {status:>3}  ", subsequent_indent=" " * 7)
        for status, meaning in EXIT_STATUSES)


def build_parser(prog: str = "vitpose", only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of the command `only` (the one a command line names)."""
    parser = argparse.ArgumentParser(prog=prog, description="ViTPose in plain PyTorch.", allow_abbrev=False,
                                     epilog=exit_status_table(), formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CommandParser)
    for name in COMMANDS if only is None else (only,):
        command_module(name).add_parser(subparsers)
    return parser


def command_parser(command, prog: str) -> argparse.ArgumentParser:
    """The parser of one command module on its own (`python train.py`: the flags of `vitpose train`)."""
    holder = argparse.ArgumentParser(prog=prog, add_help=False)
    parser = command.add_parser(holder.add_subparsers(parser_class=CommandParser))
    parser.prog = prog
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    named = argv[0].replace("-", "_") if argv and isinstance(argv[0], str) else None
    args = build_parser(only=named if named in COMMANDS else None).parse_args(argv)
    args.argv = argv[1:]  # the command's own arguments, for a command that starts itself again (--detach)
    return run_command(args, f"vitpose {args.command}")


def run_standalone(command, argv: Sequence[str] | None, prog: str) -> int:
    """`prog ARGS` as `vitpose COMMAND ARGS`, with the same parser and error handler."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = command_parser(command, prog).parse_args(argv)
    args.argv = argv
    return run_command(args, prog)


def run_command(args: argparse.Namespace, prog: str) -> int:
    """The one error handler: `args.run(args)`'s exit status; a UserError is one line on stderr,
    any other exception a bug (traceback, EXIT_INTERNAL)."""
    for stream in (sys.stdout, sys.stderr):  # a file name that is not UTF-8 prints as \xNN, never crashes
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    debug = getattr(args, "debug", False)
    try:
        status = args.run(args)
    except UserError as e:
        if debug:
            raise
        print(f"{prog}: error: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:  # noqa: BLE001 - not the user's to fix: shown whole, never as a one-line "error"
        if debug:
            raise
        traceback.print_exc()
        print(f"{prog}: internal error (the traceback is above): a bug in vitpose, not in your input, unless "
              f"the traceback names a failure of the system (disk, memory, device); please report it",
              file=sys.stderr)
        return EXIT_INTERNAL
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())
