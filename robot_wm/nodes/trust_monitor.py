"""trust_monitor: how far the world model can be trusted right now, as a TrustState for the filter.

Each control period it pairs the world model's prediction (/robot_wm/prediction, stamped with the
joint state it started from, for one period later) with the joint state measured then
(/joint_states: positions, velocities, efforts), adds the safety filter's verdict
(/robot_wm/safety_status: FILTERING = an intervention; a MODEL_IMPLAUSIBLE fault after a world-model
swap counts toward its rollback) and runs ``robot_wm.core.trust``'s
``TrustTracker``: calibrated signals, two-signal anomalies, levels that step down at once and up
after a clean hold. Output: ``TrustState`` on /robot_wm/trust every period, a DiagnosticStatus on
/diagnostics each second and on every level change, and ``~/acknowledge`` (std_srvs/Trigger) for
an operator to release HUMAN.

Deployment phases (``robot_wm.core.trust.phase``): the phase is persisted in ``phase_file`` (atomic
JSON with its history; SIM when there is none) and published in every TrustState, so the filter
applies its limits. The node gathers the phase's evidence (minutes operated under the policy, the
episodes on /robot_wm/episodes, the trust score, anomalies), grants /robot_wm/phase/promote
(robot_wm/srv/PhaseChange) only when config/trust.yaml's criteria are met (refused with the unmet
ones listed), /robot_wm/phase/demote always, and demotes by itself: an anomaly in REAL -> MIXED, in
MIXED -> HUMAN (the operator standing by), an operator's take-over in REAL -> MIXED. On a real arm
(``simulated_arm`` false) a policy still in SIM is held at STOP. When it holds the arm for a human it
says so on /robot_wm/intervention/requests (robot_wm/msg/InterventionRequest); while an operator
has taken over (/robot_wm/intervention/state) it publishes SLOW: teleoperation at reduced limits.
A payload the operator tares (the filter's /robot_wm/payload) is taken off the efforts the effort
model judges (``trust_payload``): a declared payload does not hold the arm at SLOW.

Fail-safe: without a usable calibration for the running world model (missing file, another model's
calibration), without predictions or without joint states it publishes STOP with the reason, so
the filter holds the arm; a callback error is logged and the last level is kept (never raised).
"""
from __future__ import annotations

import collections
import math
import time
import traceback

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.context import Context
from rclpy.lifecycle import State, TransitionCallbackReturn
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from std_srvs.srv import Trigger

from robot_wm.core.safety.limits import Phase, TrustLevel
from robot_wm.core.trust.calibration import with_floors
from robot_wm.msg import (EpisodeResult, InterventionRequest, InterventionState, SafetyStatus, TrustState,
                          WorldModelPrediction)
from robot_wm.nodes.control_node import ControlNode
from robot_wm.nodes.conversions import stamp_to_s
from robot_wm.nodes.params import declare
from robot_wm.nodes.runner import main_for
from robot_wm.nodes.trust_diagnostics import diagnostic_values
from robot_wm.nodes.trust_live_calibration import LiveCalibration
from robot_wm.nodes.trust_payload import DeclaredPayload
from robot_wm.nodes.trust_phases import STATUS_FRESH_S, PhaseOperations
from robot_wm.nodes.trust_swap import CalibrationPrefetch, RollbackGuard, calibration_for, declare_rollback

_FILTERING = 1  # SafetyStatus.STATE_FILTERING
_FAULT = 5  # SafetyStatus.FAULT
_REFUSED_MODEL = "model_implausible"  # FaultKind.MODEL_IMPLAUSIBLE: the filter refused the model here
_DIAG_LEVELS = {0: DiagnosticStatus.OK, 1: DiagnosticStatus.WARN, 2: DiagnosticStatus.WARN,
                3: DiagnosticStatus.ERROR, 4: DiagnosticStatus.ERROR}


class TrustMonitorNode(LiveCalibration, PhaseOperations, ControlNode):
    """See the module docstring."""

    SUBSCRIBES_JOINT_STATES = False  # every joint state is kept (``_on_joint_state_full``), not only the latest

    def __init__(self, context: Context | None = None, node_name: str = "trust_monitor") -> None:
        super().__init__(node_name, context=context)
        from robot_wm.core.trust.monitor import TrustConfig

        d = TrustConfig()
        self.params = {
            "tau_s": list(declare(self, "tau_s", list(d.tau_s), "EWMA time constants (s) of prediction_error, "
                                  "disagreement, intervention, effort_error, response_lag", read_only=True)),
            **{name: declare(self, name, float(getattr(d, name)), doc, read_only=True) for name, doc in (
                ("effort_tau_s", "per-joint smoothing of the signed effort z-scores (s), for the next calibration"),
                ("effort_clip_z", "clip on each joint's effort z-score before that smoothing, for the next calibration"),
                ("lag_tau_s", "window of the response lag's slope (s): calibrate again after changing it"),
                ("min_duration_s", "a signal over its threshold this long counts (s)"),
                ("slow_ratio", "one signal at this multiple of its threshold -> SLOW"),
                ("clean_hold_s", "better evidence this long -> one level up (s)"),
                ("human_after_s", "STOP longer than this -> HUMAN (s)"),
                ("stale_s", "no prediction this long -> SLOW (s)"),
                ("stop_stale_s", "no prediction this long -> STOP (s)"),
                ("clip_ratio", "samples enter their EWMA clipped to this multiple of the threshold"),
                ("anomaly_window_s", "two signals over are an anomaly when they went over within this long of each "
                 "other, or have both been over this long (s)"))},
        }
        defaults = {"calibration_exceedance": 1e-4, "calibration_seconds": 600.0, "refresh_seconds": 600.0,
                    "refresh_max_factor": 1.5}
        for name in ("calibration_exceedance", "calibration_seconds", "floor_prediction_error", "floor_disagreement",
                     "floor_intervention", "floor_effort_error", "floor_response_lag", "refresh_seconds", "refresh_max_factor",
                     "false_alarms_per_hour"):
            self.params[name] = declare(self, name, defaults.get(name, 0.0), "calibration (config/trust.yaml)",
                                        read_only=True)
        self.calibrate_s = declare(self, "calibrate_s", 0.0, "record this many seconds of normal operation, then "
                                   "write the calibration and judge with it (0: judge with the calibration file)",
                                   range_=(0.0, 36000.0), read_only=True)
        self.calibration_file = declare(self, "calibration_file", "", "trust calibration JSON (empty: "
                                        "trust/<profile>.json of the task's active model set, "
                                        "robot_wm.registry.resolve; with none, models/trust/[<task>/]<profile>.json "
                                        "of the package, where calibrate_s also writes)", read_only=True)
        self.hardware_command_timeout_s = declare(
            self, "hardware_command_timeout_s", 0.05, "the hardware's command timeout (s; arm_sim.yaml "
            "command_timeout_s, command_watchdog.yaml timeout_s): a period with no command sent for longer (the "
            "filter's SafetyStatus goes with each) is not judged, the driver stops the arm by itself (0: judge all)",
            range_=(0.0, 10.0), read_only=True)
        self.profile = declare(self, "profile", "nominal", "the arm profile whose calibration is the default",
                               read_only=True)
        self.task = declare(self, "task", "reach", "the task whose calibration is the default (reach, track)",
                            read_only=True)
        from robot_wm.core.trust.phase import PromotionCriteria
        from robot_wm.core.trust.settings import PHASE_KEYS

        self.simulated_arm = declare(self, "simulated_arm", True, "the arm is a simulator (robot_wm.graph.plan: the "
                                     "embedded arm); on a real arm a policy in phase SIM is held at STOP",
                                     read_only=True)
        self.phase_file = declare(self, "phase_file", "", "the persisted deployment phase (empty: "
                                  "$ROBOT_WM_STATE_DIR/phase/<task>.json)", read_only=True)
        crit = PromotionCriteria()
        for step in ("to_mixed", "to_real"):
            for key in PHASE_KEYS:
                self.params[f"phase_{step}_{key}"] = declare(self, f"phase_{step}_{key}", getattr(crit, key),
                                                             "promotion criterion (config/trust.yaml)", read_only=True)
        self.phases = None  # robot_wm.core.trust.phase.PhaseMachine (configured)
        self._rollback_config = declare_rollback(self)
        self._payload = DeclaredPayload(self)  # the filter's tares, for the effort model (trust_payload)
        self._rollback = None  # trust_swap.RollbackGuard (configured)
        # the calibration of an announced world model, looked up off the period thread (registry-managed only)
        self._prefetch = CalibrationPrefetch(self, self.task, self.profile,
                                             enabled=not (self.calibration_file or self.calibrate_s > 0))
        self._lookup_failed: tuple[str, float] | None = None  # (world model version, monotonic s) of a failed lookup
        self._intervention = False
        self._episodes = self._episodes_ignored = 0
        self._anomalies_seen = 0
        from robot_wm.core.trust.phase import DemotionEvent

        self._demotion = DemotionEvent()  # the anomaly that demoted REAL -> MIXED does not also call a human
        self._phase_saved_t = time.monotonic()
        self._operate_t: float | None = None
        self._request_pub = None
        self._phase_problem = None  # the phase file could not be read or written: STOP with this reason
        # (cpu, wall) µs per period: the measurement and the prediction(s) handed to the tracker since the last one
        self._compute_us: collections.deque = collections.deque(maxlen=2000)
        self._prediction_us = (0.0, 0.0)
        self.tracker = None
        self.calibration = None
        self._recording = None  # calibrate_s > 0: what normal operation looked like (trust_eval.RunRecorder)
        self._fitting = None  # trust_live_calibration.BackgroundFit: the recording's calibration being fitted
        self._refresh = None  # core.trust.refresh.CalibrationRefresh: an inherited calibration being refreshed live
        self.problem = "not configured"  # why the monitor says STOP on its own (None: it judges)
        self._js: collections.deque = collections.deque(maxlen=64)  # (stamp_s, q, qd, effort or None)
        self._measured_stamp = -math.inf
        self._status: tuple[float, int] | None = None
        self._model_version: str | None = None
        self._out = None
        self._unjudged_seen = 0
        self._last_published: tuple | None = None
        self._last_level = None
        self._reported: set[str] = set()
        self.callback_errors = 0
        self._trust_pub = self._diag_pub = None
        self.create_subscription(WorldModelPrediction, "/robot_wm/prediction", self._guard(self._on_prediction), 10)
        self.create_subscription(WorldModelPrediction, "/robot_wm/prediction_shadow", self._guard(self._on_shadow), 10)
        self.create_subscription(SafetyStatus, "/robot_wm/safety_status", self._guard(self._on_status), 10)
        self.create_subscription(JointState, self.joint_states_topic, self._guard(self._on_joint_state_full),
                                 QoSProfile(depth=20, reliability=ReliabilityPolicy.RELIABLE))
        self.create_service(Trigger, "~/acknowledge", self._on_acknowledge)
        from rclpy.qos import DurabilityPolicy

        from robot_wm.srv import PhaseChange

        self.create_subscription(InterventionState, "/robot_wm/intervention/state",
                                 self._guard(self._on_intervention_state),
                                 QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL))
        self.create_subscription(EpisodeResult, "/robot_wm/episodes", self._guard(self._on_episode), 10)
        self.create_service(PhaseChange, "/robot_wm/phase/promote", self._on_promote)
        self.create_service(PhaseChange, "/robot_wm/phase/demote", self._on_demote)

    @property
    def phase(self) -> int:
        """The phase in force (SIM while the phase file could not be read: the arm is held anyway)."""
        return 0 if self.phases is None else int(self.phases.phase)

    # ------------------------------------------------------------------ lifecycle
    def on_configure(self, state: State) -> TransitionCallbackReturn:
        from robot_wm import description
        from robot_wm.core.kinematics import Kinematics
        from robot_wm.core.task import load_task
        from robot_wm.core.trust import CalibrationError, EffortModelError, TrustMonitor
        from robot_wm.core.trust import calibration as calib_io
        from robot_wm.core.trust.settings import config_from_params
        from robot_wm.core.trust.tracker import TrustTracker
        from robot_wm.learning.trust_eval import default_calibration_path

        self._trust_pub = self.create_lifecycle_publisher(TrustState, "/robot_wm/trust", 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._recording = self._fitting = None  # a recording (or its fit) of an earlier configuration is dropped
        try:
            config, _ = config_from_params(self.params)
            urdf = description.expand()
            if self.joint_names == [""]:
                self.joint_names = list(description.joint_limits(urdf).names)
            kin = Kinematics(urdf, self.joint_names)
            self.dt_s = load_task().control_dt_s
        except (ValueError, OSError) as exc:
            self.get_logger().error(f"configure failed: {exc}")
            return TransitionCallbackReturn.FAILURE
        registry_problem = None  # the active model set is refused: STOP with the reason, never another calibration
        if self.calibration_file or self.calibrate_s > 0:  # a recording goes where `trust calibrate` waits for it
            path = self.calibration_file or str(default_calibration_path(self.profile, self.task))
        else:
            from robot_wm.core.onnx_model import ModelError
            from robot_wm.registry import resolve

            try:
                path = str(resolve(self.task, "calibration", profile=self.profile, warn=self.get_logger().warning))
            except (ModelError, OSError) as exc:
                path, registry_problem = "", f"no usable trust calibration: {exc}"
        self._config, self._kin, self._path = config, kin, path
        self._request_pub = self.create_publisher(InterventionRequest, "/robot_wm/intervention/requests", 10)
        if self._rollback is None and not (self.calibration_file or self.calibrate_s > 0):  # registry-managed models
            self._rollback = RollbackGuard(self, self.task, self._rollback_config[0], self.dt_s, self._rollback_config[1])
        from robot_wm.core.trust.phase import PhaseFileError, PhaseMachine, PhaseStore
        from robot_wm.core.trust.settings import phase_config_from_params
        from robot_wm.paths import state_dir

        phase_path = self.phase_file or str(state_dir() / "phase" / f"{self.task}.json")
        self._phase_path = phase_path
        try:
            phase_config = phase_config_from_params(self.params)
        except ValueError as exc:
            self.get_logger().error(f"configure failed: phase criteria: {exc}")
            return TransitionCallbackReturn.FAILURE
        try:
            self.phases = PhaseMachine(phase_config, PhaseStore(phase_path))
        except (PhaseFileError, OSError) as exc:
            # never a silent reset to SIM (or a guess): STOP with the reason until an operator fixes the file
            why = str(exc) if isinstance(exc, PhaseFileError) else f"phase file {phase_path}: cannot write it: {exc}"
            self._phase_problem = f"{why}: fix or remove it (a removed file starts again in SIM)"
            self.get_logger().error(f"{self._phase_problem}; publishing STOP")
        if self.phases is not None:
            self.get_logger().info(f"deployment phase {self.phases.phase.name} (since "
                                   f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(self.phases.state.since_unix))}"
                                   f", {phase_path})")
        if self.calibrate_s > 0:
            from robot_wm.learning.trust_eval import RunRecorder, _recording_calibration

            self._recording = RunRecorder(len(self.joint_names))
            self.calibration = _recording_calibration("any")
            self.tracker = TrustTracker(TrustMonitor(config, self.calibration), kin, self.dt_s,
                                        command_timeout_s=self.hardware_command_timeout_s or None)
            self.problem = None
            self.get_logger().warning(
                f"calibrating: recording {self.calibrate_s:g} s of normal operation, then writing {path}; until then "
                f"the monitor does not judge (level {'FULL on the simulator' if self.simulated_arm else 'CAUTIOUS'})")
            return TransitionCallbackReturn.SUCCESS
        if registry_problem is not None:
            self.problem = registry_problem
            self.get_logger().error(f"{self.problem}; publishing STOP")
            return TransitionCallbackReturn.SUCCESS
        try:
            self.calibration = with_floors(calib_io.load(path), config_from_params(self.params)[1].floor_map())
            self.tracker = TrustTracker(TrustMonitor(config, self.calibration), kin, self.dt_s,
                                        command_timeout_s=self.hardware_command_timeout_s or None)
            self.problem = None
            self.get_logger().info(f"trust calibration {path} (world model {self.calibration.model_version}, "
                                   f"{self.calibration.source}): thresholds "
                                   + ", ".join(f"{k} {v:.3g}" for k, v in self.calibration.thresholds.items()))
            self._start_refresh()
        except (CalibrationError, EffortModelError) as exc:
            # still configured: it publishes STOP with this reason, so the filter holds the arm
            self.problem = f"no usable trust calibration: {exc}"
            self.get_logger().error(f"{self.problem}; publishing STOP (run `robot-wm trust calibrate`)")
        return TransitionCallbackReturn.SUCCESS

    # ------------------------------------------------------------------ inputs
    def _guard(self, fn):
        def run(*args):
            try:
                return fn(*args)
            except Exception:  # noqa: BLE001 - the monitor outlives its own bugs; the last level is kept
                self.callback_errors += 1
                name = fn.__name__
                if name not in self._reported:
                    self._reported.add(name)
                    self.get_logger().error(f"callback {name} raised (further errors only counted):\n"
                                            f"{traceback.format_exc()}")
                return None
        return run

    def _on_joint_state_full(self, msg: JointState) -> None:
        if self.joint_names == [""] or not msg.name:
            return
        try:
            index = [list(msg.name).index(n) for n in self.joint_names]
        except ValueError:
            return  # another arm's or a malformed message: the filter latches on it; here it is skipped
        q = np.array([msg.position[i] for i in index], dtype=float) if len(msg.position) == len(msg.name) else None
        qd = np.array([msg.velocity[i] for i in index], dtype=float) if len(msg.velocity) == len(msg.name) else None
        if q is None or qd is None:
            return
        effort = np.array([msg.effort[i] for i in index], dtype=float) if len(msg.effort) == len(msg.name) else None
        self._js.append((stamp_to_s(msg.header.stamp), q, qd, effort, time.monotonic()))

    def _on_prediction(self, msg: WorldModelPrediction) -> None:
        if self.tracker is None or msg.horizon_steps < 1 or list(msg.joint_names) != self.joint_names:
            return
        n = len(self.joint_names)
        arrays = [np.asarray(a, dtype=float)[:n] for a in (
            msg.position_rad, msg.velocity_radps, msg.position_std_epistemic_rad, msg.velocity_std_epistemic_radps,
            msg.position_std_aleatoric_rad, msg.velocity_std_aleatoric_radps)]
        if any(a.shape != (n,) for a in arrays):
            return
        self._model_version = msg.model_version
        if self.phases is not None and self.phases.state.model_version != msg.model_version:
            self.phases.set_model(msg.model_version)
            self.phases.save()
        if self._recording is not None:
            self.calibration = type(self.calibration)(self.calibration.thresholds, 0.5, msg.model_version, "recording", 0)
        if msg.model_version != self.calibration.model_version and not self._swap_calibration(msg.model_version):
            self.problem = (f"trust calibration is for world model {self.calibration.model_version!r}, the running "
                            f"one is {msg.model_version!r}: run `robot-wm trust calibrate` again")
            return
        if self.problem and self.problem.startswith("trust calibration is for"):
            self.problem = None
        started, cpu = time.perf_counter(), time.thread_time()
        mean = np.concatenate(arrays[:2])
        self.tracker.prediction(stamp_to_s(msg.header.stamp), mean, np.concatenate(arrays[2:4]),
                                np.concatenate(arrays[4:6]))
        # counted with the next period's measurement: a prediction a period is the monitor's work too
        self._prediction_us = (self._prediction_us[0] + (time.thread_time() - cpu) * 1e6,
                               self._prediction_us[1] + (time.perf_counter() - started) * 1e6)

    def _on_shadow(self, msg: WorldModelPrediction) -> None:
        """The replaced world model's prediction for the same period (after a swap): the rollback's reference."""
        if self._rollback is not None and len(msg.velocity_radps) == len(self.joint_names):
            self._rollback.shadow.add(stamp_to_s(msg.header.stamp), msg.model_version, list(msg.velocity_radps))

    def _swap_calibration(self, version: str) -> bool:
        """A new world model (online update, rollback): its set's calibration from the registry, if it has one."""
        if self.calibration_file or self._recording is not None or self.tracker is None:
            return False
        from robot_wm.core.trust.settings import config_from_params

        self._refresh = None  # a refresh is for the model it began with
        found = self._prefetch.take(version)
        if found is None:  # not announced, or not looked up yet: here, at most once a second per model
            failed = self._lookup_failed
            if failed is not None and failed[0] == version and time.monotonic() - failed[1] < 1.0:
                return False
            found = calibration_for(self.task, self.profile, version)
        cal, where = found
        if cal is None:
            self._lookup_failed = (version, time.monotonic())
            return False
        self._lookup_failed = None
        self.calibration = with_floors(cal, config_from_params(self.params)[1].floor_map())
        self.tracker.monitor.set_calibration(self.calibration)
        self.get_logger().warning(f"world model {version}: trust calibration {where} ({cal.source})")
        self._start_refresh()
        return True

    def _start_refresh(self) -> None:
        """An inherited calibration (the parent's thresholds re-issued by the online learner) is
        refreshed on the new model's own normal operation (core.trust.refresh)."""
        from robot_wm.core.trust.refresh import CalibrationRefresh, is_inherited
        from robot_wm.core.trust.settings import config_from_params

        self._refresh = None
        settings = config_from_params(self.params)[1]
        if not is_inherited(self.calibration) or settings.refresh_seconds <= 0:
            return
        try:
            self._refresh = CalibrationRefresh(self.calibration, settings.floor_map(), self.dt_s,
                                               settings.refresh_seconds, settings.refresh_max_factor,
                                               self._config.min_duration_s)
        except ValueError as exc:
            self.get_logger().error(f"calibration refresh off: {exc}; the inherited thresholds stay in force")
            return
        self.get_logger().info(f"world model {self.calibration.model_version}: inherited trust calibration; refreshing "
                               f"it on {settings.refresh_seconds:g} s of normal operation (effort and interventions "
                               f"under their thresholds; a threshold at most {self._refresh.max_factor:g} x the "
                               "inherited one)")

    def _refresh_step(self, intervened: bool | None) -> None:
        if self._model_version != self.calibration.model_version:
            return
        fresh = self.tracker.raw.get("prediction_error") is not None
        refreshed = self._refresh.update(self.tracker.monitor, fresh_prediction=fresh, intervened=intervened)
        if refreshed is None:
            return
        before = self.calibration.thresholds
        self.calibration, self._refresh = refreshed, None
        self.tracker.monitor.set_calibration(refreshed)
        self.get_logger().warning(
            f"world model {refreshed.model_version}: trust calibration refreshed on {refreshed.periods} live periods: "
            + ", ".join(f"{k} {before[k]:.3g} -> {v:.3g}" for k, v in refreshed.thresholds.items() if v != before[k]))

    def _on_status(self, msg: SafetyStatus) -> None:
        self._status = (time.monotonic(), int(msg.state))
        if self._rollback is not None and msg.fault_kind == _REFUSED_MODEL and int(msg.state) == _FAULT:
            # the filter refused the running world model's linearization this period: counts toward a rollback after a swap
            self._rollback.refused(stamp_to_s(msg.header.stamp), self._model_version, msg.fault_reason)
        if self.tracker is not None and (msg.header.stamp.sec or msg.header.stamp.nanosec):
            # the filter publishes it with each command, stamped when both are sent: when the driver's
            # command timeout may have run (the tracker's rule), on the joint states' clock
            self.tracker.command(stamp_to_s(msg.header.stamp))

    def _on_acknowledge(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        try:
            if self.tracker is None:
                response.success, response.message = False, self.problem or "not configured"
            else:
                response.success, response.message = self.tracker.monitor.acknowledge()
            self.get_logger().warning(f"operator acknowledge: {'accepted' if response.success else 'refused'}: "
                                      f"{response.message}")
        except Exception as exc:  # noqa: BLE001
            response.success, response.message = False, f"acknowledge failed inside the monitor: {exc!r}"
        return response

    def _on_intervention_state(self, msg: InterventionState) -> None:
        active = bool(msg.active)
        if active == self._intervention:
            return
        self._intervention = active
        if self.tracker is not None:
            self.tracker.monitor.set_operator(active)
        if active and self.phases is not None:
            before = self.phases.phase
            if self.phases.intervention(msg.reason):
                self.get_logger().warning(f"phase {before.name} -> {self.phases.phase.name}: automatic demotion on "
                                          f"an intervention ({msg.reason})")
        self.get_logger().warning(f"intervention {'taken' if active else 'released'}: {msg.reason}")

    def on_shutdown(self, state: State) -> TransitionCallbackReturn:
        if self.phases is not None:
            try:
                self.phases.save()
            except OSError:
                pass
        return TransitionCallbackReturn.SUCCESS

    # ------------------------------------------------------------------ the period
    def control_step(self) -> None:
        try:
            self._step()
        except Exception:  # noqa: BLE001
            self.callback_errors += 1
            if "step" not in self._reported:
                self._reported.add("step")
                self.get_logger().error(f"trust step raised (the last level is kept):\n{traceback.format_exc()}")

    def _step(self) -> None:
        now = time.monotonic()
        fresh = [s for s in self._js if now - s[4] <= self.stale_s]
        if self.problem or self.tracker is None or self._phase_problem:
            self._publish(3, 0.0, math.nan, math.nan, self._phase_problem or self.problem or "not configured")
            return
        if not fresh:
            # a gap in the joint states (a loaded machine stalls 50 ms and more now and then) is judged
            # like a gap in the predictions: the last verdict, SLOW after stale_s, STOP after stop_stale_s
            # (the filter stops the arm on stale joint states by itself, without a latch)
            gap = now - self._js[-1][4] if self._js else math.inf
            if gap <= self.params["stale_s"] and self._last_published is not None:
                self._publish(*self._last_published)
            elif gap <= self.params["stop_stale_s"]:
                self._publish(max(2, self._last_published[0] if self._last_published else 2), 0.0, math.nan, math.nan,
                              f"no fresh joint state for {gap:.2f} s", remember=False)
            else:
                self._publish(3, 0.0, math.nan, math.nan, "no fresh joint state" if not self._js
                              else f"no fresh joint state for {gap:.2f} s")
            return
        sample = self._pick(fresh)
        if sample is None:
            if self._last_published is not None:  # nothing to measure this period: repeat the verdict
                self._publish(*self._last_published)
            return
        efforts = [s[3] for s in self._js if self._measured_stamp < s[0] <= sample[0] and s[3] is not None]
        effort = np.mean(efforts, axis=0) if efforts else sample[3]
        self._measured_stamp = sample[0]
        intervened = None
        if self._status is not None and now - self._status[0] <= STATUS_FRESH_S:
            intervened = self._status[1] == _FILTERING
        if self.phases is not None:  # MIXED: the operator standing by decides (config's flag: every phase),
            # on an anomaly that began in MIXED: the one that just demoted REAL -> MIXED is one event, one step
            mon = self.tracker.monitor
            mon.human_on_anomaly = self._config.human_on_anomaly or self._demotion.human_on_anomaly(
                Phase(self.phases.phase), mon.level)
        started, cpu = time.perf_counter(), time.thread_time()
        self._payload.apply(self.tracker)
        self._out = self.tracker.measurement(sample[0], sample[1], sample[2], effort, intervened)
        if self.tracker.unjudged > self._unjudged_seen:  # (the filter's process stalled, or the stream broke)
            self._unjudged_seen = self.tracker.unjudged
            self.get_logger().warning(
                f"periods not judged: {self.tracker.unjudged} so far with no command sent (SafetyStatus) for over "
                f"{self.hardware_command_timeout_s * 1e3:.0f} ms (the driver's command timeout stops the arm then, "
                "not the world model)", throttle_duration_sec=1.0)
        if self._rollback is not None:  # a swapped-in world model that does worse on the arm is rolled back
            self._rollback.update(sample[0], self._model_version, self.tracker.last_velocity_error, sample[2])
        # the monitor's own work per period: CPU time of this thread (what the period costs the machine),
        # and wall time (with whatever preempted it on a loaded machine)
        pred_cpu, pred_wall = self._prediction_us
        self._prediction_us = (0.0, 0.0)
        self._compute_us.append(((time.thread_time() - cpu) * 1e6 + pred_cpu, (time.perf_counter() - started) * 1e6 + pred_wall))
        if self._recording is not None:
            self._record(sample[0], effort)
            return
        if self._refresh is not None:
            self._refresh_step(intervened)
        if self.phases is not None:
            self._phase_bookkeeping(self._out)
            if self.phase == 0 and not self.simulated_arm:
                self._publish(3, self._out.score, self._out.normalized_error, self._out.threshold,
                              "phase SIM on a real arm: the policy has not been promoted to the real arm "
                              "(`robot-wm trust promote` on the simulator's evidence)", self._out.ratios)
                return
        self._publish_out(self._out)

    def _pick(self, fresh: list):
        """The joint state to judge this period: the one a pending prediction is for (nearest to its
        stamp, within half a period), else the newest once a period has passed (no prediction for
        it: the monitor's staleness rule decides), else None (wait for the predicted stamp)."""
        half = 0.5 * self.dt_s
        new = [s for s in fresh if s[0] - self._measured_stamp >= half]
        if not new:
            return None
        target = self.tracker.next_target_s()
        while target is not None and target < new[0][0] - half:
            self.tracker.drop_through(target)  # its state is gone (or was judged): it pairs with nothing
            target = self.tracker.next_target_s()
        if target is not None:
            near = min(new, key=lambda s: abs(s[0] - target))
            if abs(near[0] - target) <= half and new[-1][0] >= target - 1e-3:
                return near
            if target > new[-1][0]:
                return None if new[-1][0] - self._measured_stamp < 2.0 * self.dt_s else new[-1]
        return new[-1] if new[-1][0] - self._measured_stamp >= self.dt_s else None

    # ------------------------------------------------------------------ output
    def _publish_out(self, out) -> None:
        self._publish(int(out.level), out.score, out.normalized_error, out.threshold, out.reason, out.ratios)

    def _publish(self, level: int, score: float, error: float, threshold: float, reason: str,
                 ratios: dict | None = None, remember: bool = True) -> None:
        if remember:
            self._last_published = (level, score, error, threshold, reason, ratios)
        msg = TrustState(score=float(score), level=int(level), phase=int(self.phase),
                         normalized_error=float(error), threshold=float(threshold), reason=reason)
        msg.header.stamp = self.get_clock().now().to_msg()
        if self._trust_pub is not None:
            self._trust_pub.publish(msg)
        changed = level != self._last_level
        if changed and level == 4:
            anomaly = "anomaly" in reason
            self._request(InterventionRequest.SEVERITY_CRITICAL if anomaly else InterventionRequest.SEVERITY_WARNING,
                          reason)
        if changed:
            if level == 0:
                self.get_logger().info(f"trust level FULL: {reason}")
            else:
                self.get_logger().warning(f"trust level {TrustLevel(level).name}: {reason}")
            self._last_level = level
        if changed or not hasattr(self, "_diag_t") or time.monotonic() - self._diag_t >= 1.0:
            self._diag_t = time.monotonic()
            status = DiagnosticStatus(name="robot_wm/trust_monitor", hardware_id="world_model",
                                      level=_DIAG_LEVELS[level], message=reason[:200])
            values = diagnostic_values(self, level, score, ratios)
            status.values = [KeyValue(key=k, value=v) for k, v in values.items()]
            if self._diag_pub is not None:
                self._diag_pub.publish(DiagnosticArray(status=[status]))


main = main_for(TrustMonitorNode)

if __name__ == "__main__":
    main()
