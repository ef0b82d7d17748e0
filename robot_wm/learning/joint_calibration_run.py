"""``robot-wm calibrate joints``: measure rest poses against an outside reference, fit the
encoder offsets (``robot_wm.core.joint_calibration``), write the calibration file.

Two sources of measurements:

* ``--library --profile P``: the embedded arm in library mode, driven through the safety filter
  (the objects the nodes run, SIM-phase limits) by a slow joint-space move to each of N random
  poses inside the limits; at rest, the measured joint angles and a simulated tool tracker (the
  true tool0 position plus Gaussian noise of ``--tracker-noise-mm`` per axis) are averaged over
  ``SAMPLE_S``. A pose the arm cannot come to rest at (a worn wrist sagging under a heavy tool)
  is skipped, named, and a spare pose taken instead.
* ``--measurements CSV``: an integrator's own data, one rest pose per row: the joint angles as
  ``/joint_states`` reported them (columns named by joint, rad, *uncalibrated*) and the reference's
  tool0 position in base_link (columns ``x, y, z``, m) — a laser tracker, motion capture, a touch
  probe on a known fixture. The library mode writes the same CSV with ``--save-measurements``.

The file is applied by the driver (its ``joint_calibration_file`` parameter) and, in library
mode, by ``--joint-calibration`` of ``eval --stack``, ``demos record``, ``adapt`` and
``train mixed``.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MOVE_GAIN = 1.5  # 1/s: the joint-space move's proportional gain ...
MOVE_SPEED_RADPS = 0.3  # ... and its speed cap per joint: a slow commissioning move
MOVE_TIMEOUT_S = 12.0
SETTLE_S = 1.0  # zero command this long after the move ...
SAMPLE_S = 0.3  # ... then average the joints and the tracker this long
SAMPLES = 30  # (SAMPLE_S at the 100 Hz control period)
REST_SPEED_RADPS = 2e-3  # every joint drifts slower than this while sampling, or the pose is skipped
POSE_SPAN_RAD = 0.7  # poses: home ± this per joint, inside 85 % of the joint range
TABLE_MARGIN_M = 0.10


@dataclass
class Measurements:
    joint_names: tuple[str, ...]
    q_rad: np.ndarray  # (N, n) measured, uncalibrated
    p_m: np.ndarray  # (N, 3) the reference's tool0 positions, base frame
    skipped: list[str] = field(default_factory=list)
    source: str = ""


def sample_poses(kin, limits, q_home: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` joint configurations around ``q_home`` that breach no limit, with the tool well above
    the table (the stack's own plant checks)."""
    from robot_wm.learning.stack_eval import PlantCheck

    rng = np.random.default_rng(seed)
    check = PlantCheck(kin, limits)
    lo, hi = np.asarray(limits.lower_rad), np.asarray(limits.upper_rad)
    mid, half = (lo + hi) / 2, 0.85 * (hi - lo) / 2
    out = []
    for _ in range(200 * n):
        q = np.clip(q_home + rng.uniform(-POSE_SPAN_RAD, POSE_SPAN_RAD, len(q_home)), mid - half, mid + half)
        if any(check(q, 0.0).values()) or kin.tool_position_m(q)[2] < limits.table_z_m + TABLE_MARGIN_M:
            continue
        out.append(q)
        if len(out) == n:
            return np.array(out)
    raise RuntimeError(f"found only {len(out)} of {n} calibration poses inside the limits")


def measure_library(profile, poses: int = 24, seed: int = 0, tracker_std_m: float = 5e-5,
                    models_dir: Path | None = None, progress: bool = True) -> Measurements:
    """Drive the library-mode arm through the filter to ``poses`` rest poses and measure each."""
    from tqdm import tqdm

    from robot_wm import description
    from robot_wm.core.safety import JointSample, NominalSample, SafetyController, WrenchSample
    from robot_wm.core.tasks import get_task
    from robot_wm.core.world_model_runner import WorldModelRunner
    from robot_wm.learning.stack_eval import START_SETTLE_S, build_stack
    from robot_wm.sim import ArmSim, load_profile

    prof = load_profile(profile)
    dt = get_task("track").control_dt_s
    built = build_stack(dt, models_dir)
    kin, cfg = built.kinematics, built.config
    names = tuple(kin.joint_names)
    q_home = description.initial_positions(names)
    targets = sample_poses(kin, built.limits, q_home, 2 * poses, seed)  # spares for poses the arm cannot hold
    sim = ArmSim(prof, seed=seed, q0_rad=q_home)
    rng = np.random.default_rng(seed + 1)
    ctrl = SafetyController(built.limits, kin, cfg, model=WorldModelRunner(built.world_model_path, names, dt))
    sim_steps = int(round(dt / sim.dt_s))
    t = 0.0

    def period(nominal: np.ndarray):
        """One filter period; returns the joint state it ran on and the tool's true position then
        (read together: what the encoders and the tracker saw at the same instant)."""
        nonlocal t
        js, tool = sim.joint_state(), sim.tool_position_m()
        force, _ = sim.wrench()
        res = ctrl.step(t, joint=JointSample(js.position_rad, js.velocity_radps, t),
                        nominal=NominalSample(nominal, t), wrench=WrenchSample(force, t, cfg.ft_frame))
        sim.set_command(res.u_safe_radps)
        sim.step(sim_steps)
        t += dt
        return js, tool

    zero = np.zeros(len(names))
    for _ in range(int(round((cfg.tare_window_s + START_SETTLE_S) / dt)) + 5):  # latched at start: tare, enable
        period(zero)
        if ctrl.reset()[0]:
            break
    else:
        raise RuntimeError(f"the safety filter could not be enabled: {ctrl.summary()}")
    qs, ps, skipped = [], [], []
    with tqdm(total=poses, desc=f"calibrate joints [{prof.name}]", unit="pose", file=sys.stderr,
              disable=not progress) as bar:
        for k, target in enumerate(targets):
            if len(qs) == poses:
                break
            for _ in range(int(MOVE_TIMEOUT_S / dt)):
                err = target - sim.joint_state().position_rad
                if np.max(np.abs(err)) < 2e-3:
                    break
                period(np.clip(MOVE_GAIN * err, -MOVE_SPEED_RADPS, MOVE_SPEED_RADPS))
            for _ in range(int(SETTLE_S / dt)):
                period(zero)
            q_acc, p_acc = [], []
            for _ in range(SAMPLES):
                js, tool = period(zero)
                q_acc.append(js.position_rad)
                p_acc.append(tool + rng.normal(0.0, tracker_std_m, 3))
            # at rest: the drift between the window's halves (their means: free of the encoders' noise)
            half = len(q_acc) // 2
            fast = float(np.max(np.abs(np.mean(q_acc[half:], axis=0) - np.mean(q_acc[:half], axis=0)))) / (half * dt)
            latched = ctrl.supervisor.latched
            if latched or fast > REST_SPEED_RADPS:
                skipped.append(f"pose {k}: " + (f"filter latched ({ctrl.summary()['latches']})" if latched
                                                 else f"not at rest ({fast:.4f} rad/s)"))
                if latched:
                    break
                continue
            qs.append(np.mean(q_acc, axis=0))
            ps.append(np.mean(p_acc, axis=0))
            bar.update()
    return Measurements(names, np.array(qs).reshape(-1, len(names)), np.array(ps).reshape(-1, 3), skipped,
                        f"library {prof.name}, simulated tracker σ {tracker_std_m * 1e3:g} mm, seed {seed}")


def write_csv(m: Measurements, path: Path) -> Path:
    path = Path(path)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*m.joint_names, "x", "y", "z"])
        for q, p in zip(m.q_rad, m.p_m):
            w.writerow([f"{v:.9f}" for v in (*q, *p)])
    return path


def read_csv(path: Path, joint_names) -> Measurements:
    """An integrator's measurements; every problem names the file and the row."""
    from robot_wm.core.joint_calibration import JointCalibrationError

    path = Path(path)
    names = tuple(joint_names)
    try:
        with path.open(newline="") as f:
            rows = list(csv.reader(f))
    except OSError as exc:
        raise JointCalibrationError(f"measurements {path}: {exc.strerror or exc}") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise JointCalibrationError(f"measurements {path}: not a CSV text file ({exc})") from None
    if not rows:
        raise JointCalibrationError(f"measurements {path}: empty file")
    header = [h.strip() for h in rows[0]]
    missing = [c for c in (*names, "x", "y", "z") if c not in header]
    if missing:
        raise JointCalibrationError(f"measurements {path}: header lacks columns {missing} (expected the joint names "
                                    f"{list(names)} and x, y, z)")
    cols = [header.index(c) for c in (*names, "x", "y", "z")]
    data = []
    for i, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        try:
            values = [float(row[c]) for c in cols]
        except (ValueError, IndexError):
            raise JointCalibrationError(f"measurements {path}, line {i}: expected {len(cols)} numbers, got {row}") from None
        if not all(np.isfinite(values)):
            raise JointCalibrationError(f"measurements {path}, line {i}: non-finite value in {row}")
        data.append(values)
    a = np.array(data, dtype=float).reshape(-1, len(cols))
    return Measurements(names, a[:, :len(names)], a[:, len(names):], [], f"measurements {path.name}")


def run(args) -> int:
    """The ``calibrate joints`` verb."""
    from robot_wm import description
    from robot_wm.core.joint_calibration import JointCalibrationError, fit_joint_offsets, save
    from robot_wm.core.kinematics import Kinematics
    from robot_wm.sim import ProfileError, load_profile

    urdf = description.expand()
    kin = Kinematics(urdf, description.joint_limits(urdf).names)
    truth = None
    try:
        if args.library:
            prof = load_profile(args.profile)
            m = measure_library(prof, args.poses, args.seed, args.tracker_noise_mm * 1e-3, progress=not args.json)
            if len(m.q_rad) < args.poses:
                raise RuntimeError(f"measured {len(m.q_rad)} of {args.poses} poses ({'; '.join(m.skipped)}): not "
                                   "calibrating on fewer than asked")
            truth, robot = np.asarray(prof.encoder_offset_rad, dtype=float), prof.name
            ref_std = args.tracker_noise_mm * 1e-3 / math.sqrt(SAMPLES)  # each pose: the mean of SAMPLES readings
        else:
            m = read_csv(args.measurements, kin.joint_names)
            robot, ref_std = args.robot, args.tracker_noise_mm * 1e-3
        if args.save_measurements:
            write_csv(m, args.save_measurements)
        cal = fit_joint_offsets(kin, m.q_rad, m.p_m, reference_std_m=ref_std, robot=robot, source=m.source)
    except (JointCalibrationError, ProfileError, RuntimeError, OSError) as exc:
        print(f"calibrate joints: {exc}", file=sys.stderr)
        return 2
    extra = {"skipped": m.skipped}
    if truth is not None:  # library mode knows what the arm's encoders really do
        left = cal.offset_rad - truth
        tool = [float(np.linalg.norm(kin.tool_position_m(q - cal.offset_rad) - kin.tool_position_m(q - truth)))
                for q in m.q_rad]
        extra.update({"true_offset_rad": truth.round(7).tolist(), "error_rad": left.round(7).tolist(),
                      "tool_error_left_m_max": round(max(tool), 7),
                      "tool_error_uncalibrated_m_median": round(float(np.median(
                          [np.linalg.norm(kin.tool_position_m(q) - kin.tool_position_m(q - truth)) for q in m.q_rad])), 7)})
    cal = dataclasses.replace(cal, extra=extra)
    try:
        out = save(cal, args.out)
    except OSError as exc:
        print(f"calibrate joints: --out {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    doc = {"out": str(out), **cal.to_dict()}
    if not args.json:
        for j, o, s, ob in zip(cal.joint_names, cal.offset_rad, cal.std_rad, cal.observable):
            print(f"  {j}: {o * 1e3:+.3f} mrad ± {s * 1e3:.3f}" + ("" if ob else "  (not observable: does not move "
                                                                      "the tool; left at 0)"))
        print(f"{cal.poses} poses, residual {cal.residual_rms_m_before * 1e3:.3f} mm → "
              f"{cal.residual_rms_m_after * 1e3:.3f} mm RMS" + (f"; skipped: {m.skipped}" if m.skipped else ""))
        if truth is not None:
            print(f"library truth: the tool error left by the fit ≤ {extra['tool_error_left_m_max'] * 1e3:.3f} mm "
                  f"(uncalibrated {extra['tool_error_uncalibrated_m_median'] * 1e3:.2f} mm)")
        print(f"wrote {out}")
    else:
        print(json.dumps(doc))
    return 0


def _at_least_3(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 3:
        raise argparse.ArgumentTypeError(f"{text}: expected an integer >= 3 (better 12 or more)")
    return value


def _positive(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text}: expected a noise > 0 mm")
    return value


def add_parser(verbs) -> None:
    p = verbs.add_parser("calibrate", help="calibrations of the arm itself against an outside reference")
    sub = p.add_subparsers(dest="what", required=True)
    q = sub.add_parser("joints", help="fit the encoder zero offsets from rest poses and a tool tracker's positions")
    src = q.add_mutually_exclusive_group(required=True)
    src.add_argument("--library", action="store_true", help="measure on the library-mode arm with a simulated tracker")
    src.add_argument("--measurements", type=Path, help="CSV of rest poses: joint-name columns (rad) and x, y, z (m)")
    q.add_argument("--profile", default="real_twin", help="library mode: the arm's dynamics profile (name or YAML)")
    q.add_argument("--poses", type=_at_least_3, default=24, help="library mode: rest poses to measure (default 24)")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--tracker-noise-mm", type=_positive, default=0.05,
                   help="the reference's noise per axis and sample, mm (library: simulated; CSV: per row)")
    q.add_argument("--robot", default="", help="CSV: the arm's name recorded in the file")
    q.add_argument("--save-measurements", type=Path, help="also write the measurements as CSV")
    q.add_argument("--out", type=Path, required=True, help="the calibration file to write (JSON)")
    q.add_argument("--json", action="store_true", help="only the JSON object on stdout")
    q.set_defaults(func=run)
