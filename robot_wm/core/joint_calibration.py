"""Joint zero-offset calibration against an outside reference (no ROS, no torch).

An encoder whose zero is off by ``offset`` reads ``q_measured = q_true + offset``: a constant
error that nothing the stack learns from (joint states, efforts, the wrist F/T) can see, because
the world model, the policy and the trust monitor all live in the measured joint space. The tool
goes where the measured angles say it is, off by the offsets' forward-kinematics error (5 mrad
per joint on a 1 m arm: ~3 mm). Only a reference from outside the arm removes it: a laser
tracker or motion-capture marker on the tool, a touch probe on a known fixture, the maker's
calibration file.

``fit_joint_offsets`` estimates the offsets from N rest poses, each a measured joint vector and
the tool position the reference saw there (in the base frame), by Gauss-Newton on

    min_δ  Σ_i |FK(q_i - δ) - p_i|² / σ_p²  +  |δ|² / σ_δ²

with pinocchio's forward kinematics and Jacobians (``Kinematics``). The prior (σ_δ, default
20 mrad) keeps a direction the data cannot see at zero instead of letting it wander: a joint
whose offset does not move the measured point (the last wrist joint when the point lies on its
axis) is reported ``observable = False`` — it does not matter for positioning the tool either.
The posterior standard deviation of each offset comes from the same normal equations.

What the reference cannot tell apart from an offset: a rotation of its own frame about the base's
z axis is exactly an offset of the first joint, and is absorbed into it. The reference's
registration to base_link must therefore come from outside this arm's encoders (base-mounted
targets, the cell's survey); a translation of it or a marker off the tool point leaves a
residual the fit refuses once it exceeds ``RESIDUAL_FACTOR`` times the reference's noise.

``JointCalibration.correct`` is what the driver applies before it publishes ``/joint_states``
(``robot_wm.driver``'s ``joint_calibration_file``; in ros2_control terms a SimpleTransmission
``joint_offset`` of **minus** ``offset_rad``, since it computes joint = actuator + joint_offset),
so every node downstream sees the calibrated angles; library mode applies it at the same place
(``robot_wm.learning.stack_eval``).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: An offset beyond this is not an encoder zero error but a wrong file or a mechanical fault.
MAX_OFFSET_RAD = 0.1
#: The posterior std must be below this fraction of the prior's for a joint to count as seen.
OBSERVABLE_RATIO = 0.5
#: The fit is refused when its RMS residual exceeds this many times the reference's 3-D noise
#: (and at least RESIDUAL_FLOOR_M): a frame or marker error, another arm, a pose taken moving.
RESIDUAL_FACTOR = 5.0
RESIDUAL_FLOOR_M = 5e-5
FORMAT = "robot_wm/joint_calibration/1"


class JointCalibrationError(ValueError):
    """A calibration file or fit that cannot be used; the message names what was wrong."""


@dataclass(frozen=True)
class JointCalibration:
    """Per-joint encoder offsets (measured minus true, rad) and how well they are known."""

    joint_names: tuple[str, ...]
    offset_rad: np.ndarray
    std_rad: np.ndarray
    observable: tuple[bool, ...]
    robot: str = ""
    frame: str = "tool0"
    poses: int = 0
    residual_rms_m_before: float = math.nan
    residual_rms_m_after: float = math.nan
    source: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.joint_names)
        off = np.asarray(self.offset_rad, dtype=float)
        std = np.asarray(self.std_rad, dtype=float)
        if off.shape != (n,) or std.shape != (n,) or len(self.observable) != n:
            raise JointCalibrationError(f"joint calibration: {n} joints {list(self.joint_names)} but offsets "
                                        f"{off.shape}, std {std.shape}, observable {len(self.observable)}")
        bad = [f"{j}={o!r}" for j, o in zip(self.joint_names, off) if not math.isfinite(o)]
        if bad:
            raise JointCalibrationError(f"joint calibration: non-finite offsets ({', '.join(bad)})")
        big = [f"{j}={o:+.4f} rad" for j, o in zip(self.joint_names, off) if abs(o) > MAX_OFFSET_RAD]
        if big:
            raise JointCalibrationError(
                f"joint calibration: offsets beyond ±{MAX_OFFSET_RAD} rad ({', '.join(big)}): that is not an encoder "
                "zero error but a wrong file or a mechanical fault; refusing it")
        object.__setattr__(self, "offset_rad", off)
        object.__setattr__(self, "std_rad", std)
        object.__setattr__(self, "observable", tuple(bool(x) for x in self.observable))

    def correct(self, q_measured_rad: np.ndarray) -> np.ndarray:
        """The calibrated joint angles: ``q_measured - offset`` (joint order of ``joint_names``)."""
        q = np.asarray(q_measured_rad, dtype=float)
        if q.shape != self.offset_rad.shape:
            raise JointCalibrationError(f"joint calibration: positions of shape {q.shape}, expected "
                                        f"{self.offset_rad.shape} for joints {list(self.joint_names)}")
        return q - self.offset_rad

    def reordered(self, joint_names) -> JointCalibration:
        """The same calibration in another joint order; every joint must be there."""
        names = tuple(joint_names)
        if sorted(names) != sorted(self.joint_names):
            raise JointCalibrationError(f"joint calibration is for joints {list(self.joint_names)}, not {list(names)}")
        idx = [self.joint_names.index(j) for j in names]
        return JointCalibration(names, self.offset_rad[idx], self.std_rad[idx],
                                tuple(self.observable[i] for i in idx), self.robot, self.frame, self.poses,
                                self.residual_rms_m_before, self.residual_rms_m_after, self.source, dict(self.extra))

    def to_dict(self) -> dict:
        return {"format": FORMAT, "robot": self.robot, "frame": self.frame, "poses": self.poses, "source": self.source,
                "residual_rms_m": {"before": _r(self.residual_rms_m_before), "after": _r(self.residual_rms_m_after)},
                "joints": {j: {"offset_rad": _r(o, 7), "std_rad": _r(s, 7), "observable": ob}
                           for j, o, s, ob in zip(self.joint_names, self.offset_rad, self.std_rad, self.observable)},
                **({"extra": self.extra} if self.extra else {})}


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _r(x: float, digits: int = 6) -> float | None:
    return None if not math.isfinite(float(x)) else round(float(x), digits)


def from_dict(doc, joint_names=None, *, where: str = "joint calibration") -> JointCalibration:
    """Parse ``to_dict``'s form; with ``joint_names``, reorder to them (all must be present)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise JointCalibrationError(f"{where}: not a joint calibration (expected a JSON object with "
                                    f"format {FORMAT!r})")
    joints = doc.get("joints")
    if not isinstance(joints, dict) or not joints:
        raise JointCalibrationError(f"{where}: 'joints' must map each joint name to its offset")
    names, off, std, obs = [], [], [], []
    for name, entry in joints.items():
        if not isinstance(entry, dict) or not _is_number(entry.get("offset_rad")):
            raise JointCalibrationError(f"{where}: joint {name!r} has no numeric offset_rad")
        s, ob = entry.get("std_rad"), entry.get("observable", True)
        if s is not None and not (_is_number(s) and (s >= 0 or math.isnan(s))):
            raise JointCalibrationError(f"{where}: joint {name!r}: std_rad {s!r} is not a number >= 0")
        if not isinstance(ob, bool):
            raise JointCalibrationError(f"{where}: joint {name!r}: observable {ob!r} is not true or false")
        names.append(str(name))
        off.append(float(entry["offset_rad"]))
        std.append(math.nan if s is None else float(s))
        obs.append(ob)
    res = doc.get("residual_rms_m", {})
    res = {} if res is None else res
    fields = {"poses": doc.get("poses", 0), "before": res.get("before") if isinstance(res, dict) else res,
              "after": res.get("after") if isinstance(res, dict) else res}
    if not isinstance(res, dict) or not all(v is None or _is_number(v) for v in fields.values()) \
            or not isinstance(doc.get("extra", {}), dict):
        raise JointCalibrationError(f"{where}: poses, residual_rms_m.before/after must be numbers and extra an object "
                                    f"(got poses={fields['poses']!r}, residual_rms_m={res!r})")
    try:
        cal = JointCalibration(tuple(names), np.array(off), np.array(std), tuple(obs), str(doc.get("robot", "")),
                               str(doc.get("frame", "tool0")), int(fields["poses"] or 0),
                               math.nan if fields["before"] is None else float(fields["before"]),
                               math.nan if fields["after"] is None else float(fields["after"]),
                               str(doc.get("source", "")), dict(doc.get("extra") or {}))
    except JointCalibrationError as exc:
        raise JointCalibrationError(f"{where}: {str(exc).removeprefix('joint calibration: ')}") from None
    if joint_names is not None:
        try:
            cal = cal.reordered(joint_names)
        except JointCalibrationError as exc:
            raise JointCalibrationError(f"{where}: {str(exc).removeprefix('joint calibration ')}") from None
    return cal


def load(path, joint_names=None) -> JointCalibration:
    """Read a calibration file; every problem is a ``JointCalibrationError`` naming the file."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise JointCalibrationError(f"joint calibration {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JointCalibrationError(f"joint calibration {path}: unreadable ({exc})") from None
    return from_dict(doc, joint_names, where=f"joint calibration {path}")


def save(cal: JointCalibration, path) -> Path:
    """Write ``cal`` atomically (a crash leaves the old file or the new one)."""
    from robot_wm.core.atomic import write_json

    return write_json(Path(path), cal.to_dict(), mode=0o644)


def fit_joint_offsets(kin, q_measured_rad, p_reference_m, *, reference_std_m: float = 1e-4,
                      prior_std_rad: float = 0.02, iterations: int = 20, robot: str = "",
                      source: str = "") -> JointCalibration:
    """Estimate the encoder offsets from rest poses and the tool positions an outside reference saw.

    Args:
        kin: ``robot_wm.core.kinematics.Kinematics`` of the arm (its tool frame is the measured point).
        q_measured_rad: (N, n) measured joint angles at N rest poses, ``kin.joint_names`` order.
        p_reference_m: (N, 3) the reference's tool positions there, in the base frame, m.
        reference_std_m: the reference's noise per axis (weights the data against the prior).
        prior_std_rad: how large an offset is believed before the data (keeps unseen directions at 0).
    Raises:
        JointCalibrationError: too few poses, wrong shapes, non-finite data, or a fit whose
            residual stays far above the reference's noise (wrong frame, wrong arm, a moving pose).
    """
    q = np.asarray(q_measured_rad, dtype=float)
    p = np.asarray(p_reference_m, dtype=float)
    n = len(kin.joint_names)
    if q.ndim != 2 or q.shape[1] != n or p.shape != (len(q), 3):
        raise JointCalibrationError(f"calibration data: expected joints (N, {n}) and reference points (N, 3), "
                                    f"got {q.shape} and {p.shape}")
    if len(q) < 3:
        raise JointCalibrationError(f"calibration data: {len(q)} poses; at least 3 (better 12 or more) are needed")
    if not (np.all(np.isfinite(q)) and np.all(np.isfinite(p))):
        rows = sorted(set(np.flatnonzero(~np.isfinite(q).all(1) | ~np.isfinite(p).all(1)).tolist()))
        raise JointCalibrationError(f"calibration data: non-finite values in poses {rows}")
    if not (reference_std_m > 0 and prior_std_rad > 0 and iterations >= 1):
        raise JointCalibrationError(f"reference_std_m ({reference_std_m}) and prior_std_rad ({prior_std_rad}) must be "
                                    f"> 0 and iterations ({iterations}) >= 1")

    def residuals(delta):
        return np.concatenate([kin.tool_position_m(qi - delta) - pi for qi, pi in zip(q, p)])

    prior = np.eye(n) / prior_std_rad ** 2
    delta = np.zeros(n)
    before = residuals(delta)
    for _ in range(iterations):
        e = -residuals(delta)  # p - FK(q - δ)
        a = -np.vstack([kin.tool_jacobian(qi - delta)[:3] for qi in q])  # d FK(q - δ) / dδ
        h = a.T @ a / reference_std_m ** 2 + prior
        new = np.linalg.solve(h, a.T @ (e + a @ delta) / reference_std_m ** 2)
        step, delta = np.max(np.abs(new - delta)), new
        if step < 1e-9:
            break
    else:
        raise JointCalibrationError(f"calibration fit did not converge in {iterations} iterations (last step "
                                    f"{step:.2e} rad): the poses are too close together or the data inconsistent")
    after = residuals(delta)
    rms_before = float(np.sqrt(np.mean(before.reshape(-1, 3) ** 2) * 3))
    rms_after = float(np.sqrt(np.mean(after.reshape(-1, 3) ** 2) * 3))
    limit = max(RESIDUAL_FACTOR * reference_std_m * math.sqrt(3), RESIDUAL_FLOOR_M)
    if rms_after > limit:
        raise JointCalibrationError(
            f"calibration fit leaves a {rms_after * 1e3:.3f} mm RMS residual, above {limit * 1e3:.3f} mm ({len(q)} poses, "
            f"reference noise {reference_std_m * 1e3:.3g} mm): the data do not fit joint offsets alone — the reference "
            "registered off base_link or its marker off tool0, another arm, or poses taken while moving")
    # the stated noise may be optimistic: scale the covariance by the reduced chi-square when it is above 1
    dof = max(after.size - int(np.sum(np.linalg.eigvalsh(a.T @ a) > 1e-9 * np.trace(a.T @ a))), 1)
    cov = np.linalg.inv(h) * max(1.0, float(after @ after) / reference_std_m ** 2 / dof)
    std = np.sqrt(np.diag(cov))
    return JointCalibration(tuple(kin.joint_names), delta, std, tuple(std < OBSERVABLE_RATIO * prior_std_rad),
                            robot, kin.model.frames[kin.tool_frame_id].name, len(q), rms_before, rms_after, source)
