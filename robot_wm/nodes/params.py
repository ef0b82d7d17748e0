"""Typed, documented ROS parameters: every parameter has a type, unit, range and read-only flag."""
from __future__ import annotations

from typing import Any

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.node import Node

from robot_wm.nodes.runner import NodeConfigError


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
    Raises:
        NodeConfigError: the value set from outside has the wrong type or lies outside the range
            (the process then exits 2 with that message instead of a traceback).
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
    where = f"{node.get_name()}: parameter {name!r}"
    try:
        value = node.declare_parameter(name, default, desc).value
    except InvalidParameterValueException as exc:
        bounds = f" outside [{range_[0]}, {range_[1]}]" if range_ is not None else ""
        raise NodeConfigError(f"{where}{bounds}: {description}; ROS said: {exc}") from exc
    except InvalidParameterTypeException as exc:
        raise NodeConfigError(f"{where}: expected a {type(default).__name__} ({description}): {exc}") from exc
    if range_ is not None and not (range_[0] <= value <= range_[1]):
        raise NodeConfigError(f"{where}={value!r} outside [{range_[0]}, {range_[1]}]: {description}")
    return value
