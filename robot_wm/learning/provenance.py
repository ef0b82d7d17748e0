"""Provenance records: how an artifact was made (kept free of torch so the CLI starts fast)."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path


def command_line() -> str:
    """Return this process's command line as a shell would take it."""
    argv = list(sys.argv)
    if argv and Path(argv[0]).name == "robot-wm":
        argv[0] = "robot-wm"  # not the venv's absolute path
    return " ".join(shlex.quote(a) for a in argv)
