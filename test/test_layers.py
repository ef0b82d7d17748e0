"""Layering: the base modules import only numpy/yaml; robot_wm.core without rclpy and torch; robot_wm.sim without rclpy."""
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
    names = []
    for top in sys.argv[1].split(","):  # modules, and every module of a package
        module = importlib.import_module(top)
        names.append(top)
        if hasattr(module, "__path__"):
            names += [m.name for m in pkgutil.walk_packages(module.__path__, module.__name__ + ".")]
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



def test_base_layer_imports_nothing_above_it():
    """paths, description and contracts (the contracts every layer shares) need only numpy and yaml:
    blocking what core (onnxruntime, osqp, pinocchio), sim (mujoco), learning (torch) and the nodes
    (rclpy) need proves that they import none of those layers."""
    result = subprocess.run([sys.executable, "-c", BLOCKER, "robot_wm.paths,robot_wm.description,robot_wm.contracts",
                             "rclpy,torch,onnx,onnxruntime,osqp,pinocchio,mujoco"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
