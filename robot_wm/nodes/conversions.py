"""Message <-> array conversions shared by the nodes, with the checks every input needs."""
from __future__ import annotations

import struct

import numpy as np
from sensor_msgs.msg import JointState


class InputError(ValueError):
    """A message cannot be used (unknown joints, wrong length, NaN/Inf); the text says which."""


#: encapsulation ids of plain (final) CDR, where the first member starts right after the 4-byte
#: encapsulation header: CDR_BE, CDR_LE (XCDR1), CDR2_BE, CDR2_LE (XCDR2); the low bit: little-endian
_PLAIN_CDR = (0, 1, 6, 7)


def cdr_stamp_ns(data: bytes) -> int | None:
    """The header stamp (ns) of a serialized message whose first field is a std_msgs/Header, read
    without deserializing it (int32 sec, uint32 nanosec after the encapsulation header); None when
    the bytes are too short or use an encapsulation whose first member is elsewhere (a parameter
    list, a delimited XCDR2 type): the caller then falls back to another clock."""
    if len(data) < 12 or data[0] != 0 or data[1] not in _PLAIN_CDR:
        return None
    sec, nanosec = struct.unpack_from("<iI" if data[1] & 1 else ">iI", data, 4)
    return sec * 1_000_000_000 + nanosec


def stamp_to_s(stamp) -> float:
    """builtin_interfaces/Time -> seconds."""
    return stamp.sec + 1e-9 * stamp.nanosec


def joint_state_arrays(msg: JointState, joint_names: list[str] | tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Return (q_rad, qdot_radps) in ``joint_names`` order from a JointState in any order.

    Raises:
        InputError: a joint is missing or unknown, lengths differ, or a value is not finite.
    """
    names = list(msg.name)
    if len(msg.position) != len(names) or len(msg.velocity) != len(names):
        raise InputError(f"joint_states: {len(names)} names, {len(msg.position)} positions, {len(msg.velocity)} velocities")
    unknown = sorted(set(names) - set(joint_names))
    if unknown:
        raise InputError(f"joint_states: unknown joints {unknown}; expected {list(joint_names)}")
    try:
        order = [names.index(n) for n in joint_names]
    except ValueError as exc:
        missing = [n for n in joint_names if n not in names]
        raise InputError(f"joint_states: missing joints {missing}") from exc
    q = np.asarray(msg.position, dtype=float)[order]
    qdot = np.asarray(msg.velocity, dtype=float)[order]
    if not (np.all(np.isfinite(q)) and np.all(np.isfinite(qdot))):
        raise InputError(f"joint_states: non-finite values (q={q.tolist()}, qdot={qdot.tolist()})")
    return q, qdot


def vector(data, n: int, what: str) -> np.ndarray:
    """A finite float vector of length ``n`` from a message array, or InputError naming ``what``."""
    v = np.asarray(data, dtype=float)
    if v.shape != (n,):
        raise InputError(f"{what}: {v.size} values, expected {n}")
    if not np.all(np.isfinite(v)):
        raise InputError(f"{what}: non-finite values {v.tolist()}")
    return v
