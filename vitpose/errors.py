"""The one base class of errors that are the user's to fix.

A `UserError` carries one line that names the file, record, field or flag at fault and the fix.
Every command (`vitpose ...`, `train.py`, `evaluate.py`) prints that line and exits with status 2;
`--debug` shows the traceback instead. Errors of this project's own code stay ordinary exceptions,
so they are never dressed up as the user's mistake.
"""


class UserError(Exception):
    """A problem with the user's input, files, flags or environment, explained in one line."""

    exit_status = 2
