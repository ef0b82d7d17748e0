"""Files that a crash or a power cut leaves old or new, never half written.

``write_json`` writes a temporary file in the same directory, fsyncs it, ``os.replace``s it over
the target and fsyncs the directory (the rename itself is durable only then). Used for the
deployment phase, the trust calibrations and the model registry's active pointer.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, doc: Any, *, indent: int = 2, mode: int | None = None) -> Path:
    """Write ``doc`` as JSON to ``path`` atomically; ``mode``: the file's permissions (mkstemp's
    are 0600). An exception leaves the old file and no temporary one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if mode is not None:
            os.chmod(tmp, mode)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=indent)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:
        fsync_dir(path.parent)
    except OSError:  # a file system without directory fsync: the rename is still atomic
        pass
    return path
