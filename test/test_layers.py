"""Layering: robot_wm.core imports with rclpy and torch unavailable; robot_wm.sim without rclpy."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

BLOCKER = textwrap.dedent(
    """
    import importlib, importlib.abc, pkgutil, sys

    BLOCKED = set(sys.argv[2].split(","))

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, Block())
    package = importlib.import_module(sys.argv[1])
    names = [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
    for name in names:
        importlib.import_module(name)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not leaked, leaked
    print("imported", len(names), "modules:", ", ".join(names))
    """
)


@pytest.mark.parametrize("package,blocked", [
    ("robot_wm.core", "rclpy,torch"),
    ("robot_wm.sim", "rclpy,torch"),
])
def test_layer_imports_without_forbidden_dependencies(package, blocked):
    result = subprocess.run([sys.executable, "-c", BLOCKER, package, blocked], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "imported" in result.stdout
    if package == "robot_wm.core":
        for module in ("kinematics", "task", "onnx_model", "reacher", "policy_runner", "world_model_runner"):
            assert f"robot_wm.core.{module}" in result.stdout
