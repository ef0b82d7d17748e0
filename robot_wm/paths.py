"""Where the package's data files (config/, urdf/, launch/, models/) live, in every install layout.

Three layouts are supported, tried in order:
  1. ``ROBOT_WM_SHARE`` names a directory explicitly (tests, unusual installs);
  2. the source tree (editable pip install, pytest from the repo): the directory above this package;
  3. a colcon/ament install: ``share/robot_wm`` found through the ament index;
  4. a plain (non-editable) pip install: ``<sys.prefix>/share/robot_wm`` from setup.py's data_files.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

_MARKER = "package.xml"


class DataFileError(FileNotFoundError):
    """A data file robot_wm needs is not where the install layout says it should be."""


def share_dir() -> Path:
    """Return the directory holding config/, urdf/, launch/ and models/."""
    env = os.environ.get("ROBOT_WM_SHARE")
    if env:
        path = Path(env)
        if not (path / _MARKER).is_file():
            raise DataFileError(f"ROBOT_WM_SHARE={env!r} has no {_MARKER}; expected the robot_wm share directory")
        return path
    source = Path(__file__).resolve().parent.parent
    if (source / _MARKER).is_file() and (source / "config").is_dir():
        return source
    try:
        from ament_index_python.packages import get_package_share_directory, PackageNotFoundError
    except ImportError:  # no ament index: not a ROS install
        get_package_share_directory = None
    if get_package_share_directory is not None:
        try:
            return Path(get_package_share_directory("robot_wm"))
        except PackageNotFoundError:
            pass
    prefixed = Path(sys.prefix) / "share" / "robot_wm"
    if (prefixed / _MARKER).is_file():
        return prefixed
    raise DataFileError(
        "cannot find robot_wm's data files (config/, urdf/): not in the source tree next to "
        f"{Path(__file__).parent}, not in the ament index; set ROBOT_WM_SHARE to the directory holding package.xml"
    )


def data_path(*parts: str, must_exist: bool = True) -> Path:
    """Return ``share_dir()/parts...``, raising DataFileError naming the file when it is missing."""
    path = share_dir().joinpath(*parts)
    if must_exist and not path.exists():
        raise DataFileError(f"robot_wm data file missing: {path}")
    return path


def config_path(name: str) -> Path:
    """Return the path of ``config/<name>``."""
    return data_path("config", name)


def state_dir() -> Path:
    """Where robot_wm keeps state that must survive restarts (the deployment phase, the intervention
    log): ``$ROBOT_WM_STATE_DIR``, else ``$XDG_STATE_HOME/robot_wm``, else ``~/.local/state/robot_wm``."""
    env = os.environ.get("ROBOT_WM_STATE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "robot_wm"
