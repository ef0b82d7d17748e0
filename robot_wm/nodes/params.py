"""Typed, documented ROS parameters: every parameter has a type, unit, range and read-only flag."""
from __future__ import annotations

from typing import Any

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.node import Node


def declare(
    node: Node,
    name: str,
    default: Any,
    description: str,
    *,
    range_: tuple[float, float] | None = None,
    read_only: bool = False,
) -> Any:
    """Declare one parameter with a descriptor and return its value.

    Args:
        node: the node that owns the parameter.
        name: parameter name.
        default: default value; its Python type fixes the parameter type.
        description: what it is, with its unit.
        range_: inclusive (min, max) for numeric parameters; ROS rejects values outside it.
        read_only: True for parameters that may not change after start-up (e.g. anything that
            loosens safety).
    Returns:
        The parameter's value (the default, or what a params file / --ros-args set).
    """
    desc = ParameterDescriptor(description=description, read_only=read_only)
    if range_ is not None:
        lo, hi = range_
        if isinstance(default, bool):
            raise TypeError(f"parameter {name!r}: a range makes no sense for a bool")
        if isinstance(default, int):
            desc.integer_range = [IntegerRange(from_value=int(lo), to_value=int(hi), step=0)]
        else:
            desc.floating_point_range = [FloatingPointRange(from_value=float(lo), to_value=float(hi), step=0.0)]
    value = node.declare_parameter(name, default, desc).value
    if range_ is not None and not (range_[0] <= value <= range_[1]):
        # declare_parameter checks ranges for overrides too, but make the error name the unit and range
        raise ValueError(f"parameter {name!r}={value!r} outside [{range_[0]}, {range_[1]}]: {description}")
    return value
