"""The one base class of errors that are the user's to fix, and the exit statuses of every command.

A `UserError` carries one line that names the file, record, field or flag at fault and the fix.
Every command (`vitpose ...`, `train.py`, `evaluate.py`) prints that line and exits with the error's
`exit_status` (2 unless a subclass says otherwise); `--debug` shows the traceback instead; `vitpose
serve` answers it with its `http_status` (422 unless a subclass or the error says otherwise). Errors
of this project's own code stay ordinary exceptions, so they are never dressed up as the user's
mistake: the command prints their traceback and exits with `EXIT_INTERNAL` (see `vitpose.cli`), the
server answers 500 and logs the traceback.
"""

# The exit statuses of every command, one table (`vitpose --help` prints it; README.md "Exit
# statuses" shows it, and tests/test_cli.py checks that they agree).
EXIT_OK = 0
EXIT_FAILED = 1  # the command ran but did not fully succeed (some inputs failed, a gate or a check failed)
EXIT_USAGE = 2  # a UserError (or argparse's refusal of the command line): nothing was done
EXIT_DIVERGED = 3  # vitpose train: stopped on non-finite losses (train.max_nonfinite)
EXIT_INTERNAL = 70  # a bug in vitpose: the traceback is printed (sysexits.h's EX_SOFTWARE)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, what a shell reports)
EXIT_TERMINATED = 143  # vitpose train stopped by SIGTERM (128 + SIGTERM: timeout, kill, SLURM, Kubernetes)

EXIT_STATUSES = (
    (EXIT_OK, "done"),
    (EXIT_FAILED, "ran, but not everything succeeded: predict: some inputs failed, a sharded run's disk filled "
                  "up or a shard died (--resume finishes it); export: the exported file "
                  "differs from PyTorch (nothing written); check-data: errors found"),
    (EXIT_USAGE, "an error that is yours to fix (flag, config, file): one line naming it and the fix; "
                 "nothing was done"),
    (EXIT_DIVERGED, "train: stopped on non-finite losses (last.pth holds the last finite weights)"),
    (EXIT_INTERNAL, "internal error: a bug in vitpose (or a system failure the traceback names); the traceback "
                    "is printed; please report a bug"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C / SIGINT; predict, select and audit also on SIGTERM): what finished "
                       "is kept, --resume continues"),
    (EXIT_TERMINATED, "train: stopped by SIGTERM (timeout, kill, a scheduler); last.pth holds the interrupted "
                      "iteration, --resume auto continues"),
)


def signal_exit_status(signal_name: str | None) -> int:
    """The status of a run that a signal stopped after saving its work: 128 + the signal's number, as a
    shell reports a process the signal killed, so a launcher (a job script, torchrun, SLURM) sees that
    the run did not finish. SIGINT gives 130; SIGTERM, or a signal that reached another rank only, 143."""
    return EXIT_INTERRUPTED if signal_name == "SIGINT" else EXIT_TERMINATED


class UserError(Exception):
    """A problem with the user's input, files, flags or environment, explained in one line."""

    exit_status = EXIT_USAGE
    # `vitpose serve`'s answer to it: a 4xx (a subclass or an instance may name another); any other
    # exception is the server's bug, 500, as it is exit 70 on the command line
    http_status = 422


class UsageError(UserError):
    """A flag, or a combination of flags, that the command cannot run with: one line naming the flag
    and the fix. The one usage-error class of every command (and of the library calls they make)."""


class MissingExtraError(UserError, ImportError):
    """An optional package a feature needs is not installed: one line naming the feature, the
    package and the pip command that brings it (`missing_extra`)."""


def missing_extra(feature: str, package: str, extra: str | None = None) -> MissingExtraError:
    """The one spelling of "install the extra": `raise missing_extra("vitpose serve", "starlette", "serve")`.

    feature: what the user asked for (a command or flag); package: the import that failed; extra:
    the `vitpose[...]` extra that brings it (None: the package alone)."""
    how = f'pip install "vitpose[{extra}]"' if extra else f"pip install {package}"
    error = MissingExtraError(f"{feature} needs {package}, which is not installed: {how}")
    error.name = package
    return error


def require_extra(feature: str, modules: tuple[str, ...] | list[str], extra: str | None = None) -> None:
    """Import each of `modules`; the first that is missing raises `missing_extra` naming it."""
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            raise missing_extra(feature, module.split(".")[0], extra) from None
