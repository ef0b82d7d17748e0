"""Online adaptation of the world model while the arm runs: a buffer of real transitions, candidates
fine-tuned from the active model, a validation gate, and the registry as the only way in.

What the learner sees is what the world_model node pairs: each command the safety filter sends,
with the newest joint state at that moment (``RealBuffer.add``), so the training data has exactly
the live prediction's timing. The buffer keeps the last ``buffer_s`` seconds (its memory is fixed at
construction) and a reservoir of older windows (reservoir sampling): recent data says what the arm
is now, the reservoir keeps what it was across the operating range.

A candidate (``OnlineLearner.attempt``) is the active world model (rebuilt from its ONNX graph,
checked: ``world_model_from_onnx``) fine-tuned on the recent windows and a share of the reservoir
and of simulator replay (against forgetting), early-stopped on windows it does not train on, its
variance recalibrated (``robot_wm.learning.adapt``), exported, and judged by ``ValidationGate`` on
the most recent ``validation_s`` seconds, which nothing was fit or tuned on
(``robot_wm.learning.online_gate``):

* it must beat the active model there: its velocity RMSE lower by ``min_improvement`` (relative)
  and its NLL lower by ``min_nll_gain`` nats per state component;
* its 90 % intervals must cover between ``coverage_band`` of the held-out errors (calibrated);
* on a fixed simulator reference set its error may grow by at most ``max_sim_regression``;
* linearized at each held-out and reference state about the command sent there, as the safety
  filter linearizes it every period, the filter's own check (``check_model``) may refuse it at no
  more of them than the active model (a slope of the wrong sign would stop the arm:
  ``robot_wm.learning.online_gate``);
* its exported ONNX must equal the torch model it came from (``parity_tol``).

A candidate that fails is recorded with the reasons and dropped. One that passes becomes a model set
in the registry (the active set's policy and trust calibrations, the calibrations re-issued for the
new world model: the gate requires calibrated intervals, so the thresholds of the normalized
prediction error carry over), with its lineage (parent, data window, metrics), and is activated;
the node announces it on ``/robot_wm/model_update``. The policy is not refreshed online: its
fine-tune in imagination takes minutes of CPU (``robot-wm adapt``), and the residual policy already
corrects for what a world model update tells the filter.
"""
from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robot_wm.learning.online_gate import (  # noqa: F401 (GateResult, HeldOut: re-exported)
    GateResult,
    HeldOut,
    SlopeCheck,
    ValidationGate,
    held_out_samples,
)


@dataclass(frozen=True)
class LearnerConfig:
    """Settings of the online learner (config/adaptation.yaml; the node's parameters)."""

    buffer_s: float = 90.0  # recent real data kept (s of control periods)
    train_s: float = 30.0  # of it, the newest this many seconds are trained on (older: the reservoir's share)
    window_s: float = 2.0  # training windows (episodes of the training format), s
    max_gap_periods: float = 10.0  # samples further apart than this many periods start a new segment (a stop)
    reservoir_windows: int = 60  # older windows kept by reservoir sampling
    validation_s: float = 6.0  # the newest data, held out for the gate
    min_new_s: float = 12.0  # new data since the last attempt before the next one, s
    min_train_s: float = 12.0  # recent data an attempt needs besides the held-out window, s
    epochs: int = 8
    lr: float = 5e-4
    batch: int = 128  # per member
    real_share: float = 0.8  # share of each batch from real data (rest: simulator replay)
    reservoir_share: float = 0.25  # of the real windows, at most this share from the reservoir
    replay_transitions: int = 6400  # simulator replay collected once (0: none)
    reference_transitions: int = 3200  # fixed simulator reference set of the gate
    max_train_s: float = 30.0  # wall-clock budget of one fine-tune (the gate runs after it)
    cpu_fraction: float = 0.5  # the training loop sleeps so that it uses at most this share of a core
    threads: int = 1
    min_improvement: float = 0.05  # the candidate's held-out qdot RMSE <= (1 - this) x the active's
    min_nll_gain: float = 0.02  # ... and its held-out NLL (nats per state component) lower by at least this
    coverage_band: tuple[float, float] = (0.80, 0.98)  # its 90 % intervals' held-out coverage
    max_sim_regression: float = 0.25  # its simulator-reference RMSE <= (1 + this) x the active's
    parity_tol: float = 1e-4  # max relative |ONNX - torch| of the exported candidate
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("buffer_s", "train_s", "window_s", "max_gap_periods", "validation_s", "min_new_s", "min_train_s", "lr", "max_train_s",
                     "cpu_fraction", "parity_tol"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"online.{name}={value!r}: expected a positive number")
        for name in ("reservoir_windows", "epochs", "batch", "threads", "replay_transitions",
                     "reference_transitions", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name in (
                    "reservoir_windows", "replay_transitions", "seed") else 1):
                raise ValueError(f"online.{name}={value!r}: expected a non-negative integer")
        for name in ("real_share", "reservoir_share", "max_sim_regression"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"online.{name}={value!r}: expected a number in [0, 1]")
        # the margins may be negative (accept a candidate a little worse there), never absurd
        if isinstance(self.min_improvement, bool) or not -1.0 <= float(self.min_improvement) < 1.0:
            raise ValueError(f"online.min_improvement={self.min_improvement!r}: expected a share in [-1, 1)")
        if isinstance(self.min_nll_gain, bool) or not math.isfinite(float(self.min_nll_gain)):
            raise ValueError(f"online.min_nll_gain={self.min_nll_gain!r}: expected a finite number of nats")
        lo, hi = self.coverage_band
        if not 0.0 < lo < hi <= 1.0:
            raise ValueError(f"online.coverage_band={self.coverage_band!r}: expected 0 < low < high <= 1")
        if self.cpu_fraction > 1.0:
            raise ValueError(f"online.cpu_fraction={self.cpu_fraction!r}: expected a share of one core in (0, 1]")
        if self.window_s * 3 > self.buffer_s:
            raise ValueError(f"online.buffer_s={self.buffer_s} must hold at least three windows of {self.window_s} s")


# ------------------------------------------------------------------------------------------ the data
class RealBuffer:
    """The last ``buffer_s`` of (stamp, q, qdot, command) samples and a reservoir of older windows.

    Memory is fixed at construction: ``capacity`` samples in ring arrays plus ``reservoir_windows``
    windows. A gap in the stamps (a missed or stopped period) ends a segment: windows never span one.
    """

    def __init__(self, n_joints: int, dt_s: float, cfg: LearnerConfig, seed: int = 0) -> None:
        self.n, self.dt_s, self.cfg = n_joints, float(dt_s), cfg
        self.capacity = int(round(cfg.buffer_s / dt_s))
        self.window = int(round(cfg.window_s / dt_s))
        self._t = np.full(self.capacity, np.nan)
        self._x = np.zeros((self.capacity, 3, n_joints))  # q, qdot, command
        self._head = 0  # next write index
        self.count = 0  # samples written in total
        self.reservoir: list[np.ndarray] = []  # (window + 1, 3, n) each
        self._reservoir_seen = 0
        self._rng = np.random.default_rng(seed)
        self._last_t: float | None = None
        self._segment_len = 0  # contiguous samples ending at the newest

    @property
    def memory_bytes(self) -> int:
        """What the buffer holds at most (the ring arrays and a full reservoir)."""
        return self._t.nbytes + self._x.nbytes + self.cfg.reservoir_windows * (self.window + 1) * 3 * self.n * 8

    def __len__(self) -> int:
        return min(self.count, self.capacity)

    def add(self, t_s: float, q_rad, qdot_radps, command_radps) -> bool:
        """Append one period's sample (the newest joint state and the command sent). Returns False
        (nothing stored) for a non-finite or misshapen sample or one not later than the previous."""
        try:
            row = np.array([q_rad, qdot_radps, command_radps], dtype=float)
        except (TypeError, ValueError):  # ragged or not numbers
            return False
        if row.shape != (3, self.n) or not np.isfinite(row).all() or not math.isfinite(t_s):
            return False
        if self._last_t is not None and t_s <= self._last_t:
            return False
        contiguous = self._last_t is not None and t_s - self._last_t <= self.cfg.max_gap_periods * self.dt_s
        self._segment_len = self._segment_len + 1 if contiguous else 1
        if self.count >= self.capacity:  # the oldest sample leaves the ring: offer its window to the reservoir
            self._retire(self._head)
        self._t[self._head] = t_s
        self._x[self._head] = row
        self._head = (self._head + 1) % self.capacity
        self.count += 1
        self._last_t = t_s
        return True

    def _retire(self, index: int) -> None:
        """Every ``window``-th retiring sample starts a reservoir candidate (if the window is contiguous)."""
        if (self.count - self.capacity) % self.window or self.cfg.reservoir_windows == 0:
            return
        idx = (index + np.arange(self.window + 1)) % self.capacity
        t = self._t[idx]
        if not (np.isfinite(t).all() and np.all(np.diff(t) > 0)
                and np.all(np.diff(t) <= self.cfg.max_gap_periods * self.dt_s)):
            return
        self._reservoir_seen += 1
        window = self._x[idx].copy()
        if len(self.reservoir) < self.cfg.reservoir_windows:
            self.reservoir.append(window)
        else:  # reservoir sampling: every window seen so far is kept with the same probability
            j = int(self._rng.integers(0, self._reservoir_seen))
            if j < self.cfg.reservoir_windows:
                self.reservoir[j] = window

    def ordered(self) -> tuple[np.ndarray, np.ndarray]:
        """The buffered samples oldest first: stamps (T,) and (T, 3, n)."""
        n = len(self)
        idx = (self._head - n + np.arange(n)) % self.capacity
        return self._t[idx], self._x[idx]

    def contiguous_tail(self) -> tuple[np.ndarray, np.ndarray]:
        """The newest contiguous run of samples (no gap), oldest first."""
        t, x = self.ordered()
        k = min(self._segment_len, len(t))
        return t[len(t) - k:], x[len(t) - k:]


def windows_dataset(samples: np.ndarray, window: int, dt_s: float, joint_names, kinematics, label: str):
    """Cut (T, 3, n) contiguous samples into episodes of ``window`` transitions (the training format)."""
    count = (len(samples) - 1) // window
    if count < 1:
        return None
    eps = np.stack([samples[i * window:(i + 1) * window + 1] for i in range(count)])
    return _dataset(eps, dt_s, joint_names, kinematics, label)


def _dataset(eps: np.ndarray, dt_s: float, joint_names, kinematics, label: str):
    """(E, W+1, 3, n) windows -> Dataset (the command of the last sample is not used)."""
    from robot_wm.learning.data import Dataset

    q, qd, u = eps[:, :, 0], eps[:, :, 1], eps[:, :-1, 2]
    tool = np.array([[kinematics.tool_position_m(qi) for qi in ep] for ep in q])
    return Dataset(q, qd, u, tool, tuple(joint_names), dt_s, (label,) * len(eps), {"source": label})


# ------------------------------------------------------------------------------------------ the learner
@dataclass
class Attempt:
    """One candidate: what was tried and what became of it."""

    started_unix_s: float
    verdict: GateResult | None = None
    error: str = ""  # why no candidate could be judged (too little data, a failed fine-tune)
    set_version: str = ""  # the registered set, when accepted
    previous_set_version: str = ""
    world_model_version: str = ""
    seconds: float = 0.0
    cpu_s: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def accepted(self) -> bool:
        """Passed the gate and registered as the task's active set."""
        return self.verdict is not None and self.verdict.accepted and bool(self.set_version)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["accepted"] = self.accepted
        return out


class OnlineLearner:
    """Buffer, fine-tune, gate, register: the learner of the ``adaptation`` node, without ROS.

    Args:
        task: the task whose active set it adapts.
        cfg: settings.
        registry: ``robot_wm.registry.Registry`` (the active set is read from it, candidates go into it).
        kinematics: the arm's ``Kinematics`` (the training format carries the tool position).
        dt_s: the control period.
        log_path: JSON-lines log of every attempt (accepted or not), or None.
        sim_profile: the simulator profile of the replay and reference data.
    """

    def __init__(self, task: str, cfg: LearnerConfig, registry, kinematics, dt_s: float, *,
                 log_path: Path | None = None, sim_profile: str | None = None,
                 pause: Callable[[float], None] = time.sleep) -> None:
        self.task, self.cfg, self.registry, self.kin, self.dt_s = task, cfg, registry, kinematics, float(dt_s)
        self.names = tuple(kinematics.joint_names)
        self.buffer = RealBuffer(len(self.names), dt_s, cfg, seed=cfg.seed)
        self.log_path = Path(log_path) if log_path else None
        self.attempts: list[Attempt] = []
        self._last_attempt_count = 0
        self._replay = None
        self._reference_dataset = None
        self._sim_ready = False
        self._sim_profile = sim_profile
        self._pause = pause

    # ---------------------------------------------------------------------------- data
    def add(self, t_s: float, q_rad, qdot_radps, command_radps) -> bool:
        """One period's sample (see ``RealBuffer.add``)."""
        return self.buffer.add(t_s, q_rad, qdot_radps, command_radps)

    def ready(self, urgent: bool = False) -> tuple[bool, str]:
        """Whether an attempt is due: enough new data since the last one and enough data in all.

        ``urgent`` (the trust monitor sees the prediction error rising): half the new data will do."""
        new_s = (self.buffer.count - self._last_attempt_count) * self.dt_s
        need_new = self.cfg.min_new_s * (0.5 if urgent else 1.0)
        if new_s < need_new:
            return False, f"{new_s:.1f} of {need_new:g} s of new data"
        tail_s = len(self.buffer.contiguous_tail()[0]) * self.dt_s
        need = self.cfg.validation_s + self.cfg.min_train_s
        if tail_s < need:
            return False, f"{tail_s:.1f} of {need:g} s of contiguous data"
        return True, ""

    def prepare_simulator_data(self) -> None:
        """The simulator replay and the gate's fixed reference set (collected once, seconds)."""
        if self._sim_ready:
            return
        from robot_wm.core.task import load_task
        from robot_wm.learning.data import CollectConfig, collect

        task = load_task()
        if self.cfg.replay_transitions:
            self._replay = collect(CollectConfig(transitions=self.cfg.replay_transitions, n_envs=16, episode_steps=100,
                                                 seed=self.cfg.seed + 7), task, progress=False)
        if self.cfg.reference_transitions:
            self._reference_dataset = collect(CollectConfig(transitions=self.cfg.reference_transitions, n_envs=16,
                                                            episode_steps=100, seed=self.cfg.seed + 9001),
                                              task, progress=False)
        self._sim_ready = True

    def _sim_reference(self, history: int) -> HeldOut | None:
        ref = self._reference_dataset
        if ref is None:
            return None
        t = ref.n_steps
        rows = []
        for e in range(ref.n_episodes):
            samples = np.stack([ref.q_rad[e, :t + 1], ref.qdot_radps[e, :t + 1],
                                np.vstack([ref.action_radps[e], np.zeros((1, ref.action_radps.shape[2]))])], 1)
            rows.append(held_out_samples(samples, history))
        return HeldOut(*(np.concatenate([getattr(r, f) for r in rows]) for f in ("q", "qd", "actions", "next_state")))

    # ---------------------------------------------------------------------------- one candidate
    def attempt(self, out_root: Path | None = None) -> Attempt:
        """Fine-tune a candidate from the active set on the buffer, judge it, register it if it passes."""
        import torch

        from robot_wm.core.world_model_runner import WorldModelRunner
        from robot_wm.learning.adapt import AdaptConfig, finetune_world_model
        from robot_wm.learning.onnx_import import world_model_from_onnx

        started, cpu0 = time.time(), time.process_time()
        att = Attempt(started)
        self._last_attempt_count = self.buffer.count
        try:
            active = self.registry.active(self.task)
            if active is None:
                raise RuntimeError(f"the registry has no active {self.task} set (robot-wm models list)")
            att.previous_set_version = active.version
            t, samples = self.buffer.contiguous_tail()
            hold_n = int(round(self.cfg.validation_s / self.dt_s))
            keep = hold_n + int(round(self.cfg.train_s / self.dt_s))
            t, samples = t[-keep:], samples[-keep:]
            if len(samples) < hold_n + self.buffer.window * 3:
                raise RuntimeError(f"too little contiguous data: {len(samples) * self.dt_s:.1f} s")
            train_samples, hold_samples = samples[:-hold_n], samples[-hold_n - 1:]
            recent = windows_dataset(train_samples, self.buffer.window, self.dt_s, self.names, self.kin, "real")
            self.prepare_simulator_data()
            torch.set_num_threads(self.cfg.threads)
            base = world_model_from_onnx(active.world_model_path)
            h = base.action_history
            held = held_out_samples(hold_samples, h)
            # early stopping on the newest training windows (the gate's window stays unseen)
            n_stop = max(1, recent.n_episodes // 5)
            stop = recent.subset(np.arange(recent.n_episodes - n_stop, recent.n_episodes))
            train = recent.subset(np.arange(recent.n_episodes - n_stop))
            res = self._reservoir_dataset(train.n_episodes)
            if res is not None:
                from robot_wm.learning.data import Dataset

                train = Dataset.concatenate([train, res])
            att.data = {"recent_s": round(len(samples) * self.dt_s, 2), "train_windows": int(train.n_episodes),
                        "reservoir_windows": 0 if res is None else int(res.n_episodes),
                        "validation_s": self.cfg.validation_s, "window_end_unix_s": float(t[-1])}
            budget = time.monotonic() + self.cfg.max_train_s
            duty = self.cfg.cpu_fraction

            def on_batch(busy_s: float) -> bool:
                if duty < 1.0:
                    self._pause(busy_s * (1.0 - duty) / duty)
                return time.monotonic() < budget

            cfg = AdaptConfig(wm_epochs=self.cfg.epochs, wm_lr=self.cfg.lr, wm_batch=self.cfg.batch,
                              wm_patience=max(2, self.cfg.epochs // 3), demo_share=self.cfg.real_share,
                              replay_transitions=0, threads=self.cfg.threads, seed=self.cfg.seed + len(self.attempts))
            model, report = finetune_world_model(base, train, stop, self._replay, cfg, progress=False, on_batch=on_batch)
            att.data["epochs"] = report.epochs_run
            work = Path(tempfile.mkdtemp(prefix="robot_wm_online_", dir=out_root))
            try:
                parent = json.loads(active.world_model_path.with_suffix(".json").read_text())["version"]
                set_dir = export_candidate_set(
                    model, active, work / "set",
                    f"wm-online-{parent.split('-')[-1][:8]}-{len(self.attempts) + 1}-{{onnx_sha8}}", {"online": att.data})
                candidate = WorldModelRunner(set_dir / "world_model.onnx", self.names, self.dt_s, analytic=False)
                current = WorldModelRunner(active.world_model_path, self.names, self.dt_s, analytic=False)
                parity = _parity(model, candidate)
                gate = ValidationGate(self.cfg, self._sim_reference(h),
                                      SlopeCheck(self.kin.velocity_limits_radps, self.dt_s, self.names))
                att.verdict = gate.judge(candidate, current, held, parity)
                att.world_model_version = candidate.version
                if att.verdict.accepted:
                    info = self.registry.add(set_dir, self.task, parent=active.version, activate=True, lineage={
                        "command": "online adaptation (robot_wm adaptation node)",
                        "metrics": {k: round(v, 6) for k, v in att.verdict.metrics.items()},
                        "online": {"data": att.data, "gate": att.verdict.reasons,
                                   "real_window": {"start_s": float(t[0]), "end_s": float(t[-1]),
                                                   "samples": int(len(samples))}}})
                    att.set_version = info.version
            finally:
                shutil.rmtree(work, ignore_errors=True)
        except Exception as exc:  # noqa: BLE001 (an attempt that fails is recorded, never raised into the node)
            att.error = f"{type(exc).__name__}: {exc}"
        att.seconds = round(time.time() - started, 2)
        att.cpu_s = round(time.process_time() - cpu0, 2)
        self.attempts.append(att)
        self._log(att)
        return att

    def _reservoir_dataset(self, n_recent: int):
        """At most ``reservoir_share`` of the real windows from the reservoir."""
        res = self.buffer.reservoir
        share = self.cfg.reservoir_share
        if not res or share <= 0.0:
            return None
        k = min(len(res), int(math.floor(share / max(1.0 - share, 1e-9) * n_recent)))
        if k < 1:
            return None
        pick = np.random.default_rng(self.cfg.seed + len(self.attempts)).choice(len(res), k, replace=False)
        return _dataset(np.stack([res[i] for i in pick]), self.dt_s, self.names, self.kin, "real_reservoir")

    def _log(self, att: Attempt) -> None:
        if self.log_path is None:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as fh:
            fh.write(json.dumps(att.as_json(), default=float) + "\n")


#: the re-issued calibration's source; the trust monitor refreshes such a calibration on the new model's
#: own normal operation (robot_wm.core.trust.refresh, whose INHERITED_PREFIX it starts with)
INHERITED_SOURCE = ("inherited from {parent} ({source}) by online adaptation: the candidate passed the gate with "
                    "calibrated intervals, so the normalized signals' thresholds carry over until the trust monitor "
                    "refreshes them on the new model's normal operation")


def export_candidate_set(model, active, set_dir: Path, version: str, lineage: dict[str, Any]) -> Path:
    """A model set to register: ``model`` (a torch ``WorldModel``) exported as its world model (``version``
    may hold ``{onnx_sha8}``), the ``active`` set's policy, and the active set's trust calibrations
    re-issued for the new world model (the gate requires calibrated intervals: the thresholds of the
    normalized signals carry over). Returns ``set_dir``."""
    from robot_wm.learning.world_model import export_world_model

    set_dir = Path(set_dir)
    set_dir.mkdir(parents=True)
    parent = json.loads(active.world_model_path.with_suffix(".json").read_text())
    path = export_world_model(model, set_dir / "world_model.onnx",
                              dataset_sha256=str(parent.get("training_data_sha256", "")), metrics=lineage,
                              version=version, training_command="online adaptation (robot_wm adaptation node)")
    side = json.loads(path.with_suffix(".json").read_text())
    side["lineage"] = {"parent_version": parent["version"], **lineage}
    path.with_suffix(".json").write_text(json.dumps(side, indent=2) + "\n")
    for name in ("policy.onnx", "policy.json"):
        shutil.copyfile(active.path / name, set_dir / name)
    for cal in active.calibrations:
        doc = json.loads(active.calibration_path(cal).read_text())
        doc["source"] = INHERITED_SOURCE.format(parent=doc.get("model_version"), source=doc.get("source"))
        doc["model_version"] = side["version"]
        (set_dir / "trust").mkdir(exist_ok=True)
        (set_dir / "trust" / f"{cal}.json").write_text(json.dumps(doc, indent=2) + "\n")
    return set_dir


def _parity(model, runner) -> float:
    """max |ONNX - torch| / (|torch| + 1e-3) of the exported candidate on random inputs."""
    import torch

    rng = np.random.default_rng(0)
    b, h, n = 16, runner.action_history_length, len(runner.joint_names)
    q, qd = rng.uniform(-1, 1, (b, n)), rng.uniform(-1, 1, (b, n))
    a = rng.uniform(-1, 1, (b, h, n))
    got = runner.predict_batch(q, qd, a)
    t = lambda x: torch.as_tensor(x, dtype=torch.float32)  # noqa: E731
    with torch.no_grad():
        want = model.predict(t(q), t(qd), t(a))
    pairs = ((got.next_state, torch.cat([want.next_q_rad, want.next_qdot_radps], -1).numpy()),
             (got.epistemic_var, want.epistemic_var.numpy()), (got.aleatoric_var, want.aleatoric_var.numpy()))
    return float(max(np.max(np.abs(g - w) / (np.abs(w) + 1e-3)) for g, w in pairs))
