"""Where the benchmarks find the MMPose 1.3.2 reference venv (tools/reference/README.md).

`VITPOSE_MMPOSE_PYTHON` names its interpreter; without it, the default location that
tools/reference/setup_venv.sh builds, ~/.cache/mmpose-ref-venv/bin/python. The subprocesses put
tools/reference on their path and import its `mmcompat` shim before anything from MMPose.
"""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PYTHON = Path("~/.cache/mmpose-ref-venv/bin/python")
MMCOMPAT_DIR = REPO / "tools" / "reference"
SETUP_GUIDE = "tools/reference/README.md"


def mmpose_python() -> Path:
    """The reference venv's interpreter: $VITPOSE_MMPOSE_PYTHON, else the default location."""
    return Path(os.environ.get("VITPOSE_MMPOSE_PYTHON") or DEFAULT_PYTHON).expanduser()


def missing_message(python: Path) -> str:
    """What to tell the user when the interpreter does not exist."""
    return (f"MMPose reference venv not found: {python} does not exist (build it as {SETUP_GUIDE} says, "
            "or point VITPOSE_MMPOSE_PYTHON at its python)")
