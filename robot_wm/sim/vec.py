"""VecArmSim: many simulated arms stepped together for data collection, much faster than real time.

Each environment is the arm of :class:`robot_wm.sim.ArmSim` (same model, same drive, same sensor
model) driven at a fixed control period: ``step(actions)`` is, per environment, exactly
``ArmSim.set_command(action); ArmSim.step(control_steps); ArmSim.joint_state()`` — bit for bit,
for the same profile and seed (environment ``i`` uses seed ``seed + i``). The physics runs in
``mujoco.batch.Batch`` (a C thread pool over per-environment states and models); the Python work
per control step is a handful of numpy operations over all environments.

Not modeled here (ArmSim has them): the command watchdog (an action arrives every control period),
rejected-command stops (a non-finite action raises before anything is stepped), and faults.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import mujoco
import numpy as np
from mujoco import batch as mjbatch

from robot_wm import description
from robot_wm.sim.arm import EFFORT_WINDOW_STEPS, CommandRejected, applied_torque, check_q0
from robot_wm.sim.model import ArmModel, build_model
from robot_wm.sim.profiles import DynamicsProfile, load_profile

ProfileLike = str | Path | DynamicsProfile


@dataclass(frozen=True)
class VecObservation:
    """Measured state of every environment (row i = environment i), as ArmSim.joint_state gives it.

    ``tool_position_m`` is the true tool0 position in the base frame (no sensor model).
    """

    time_s: np.ndarray  # (n_envs,)
    q_rad: np.ndarray  # (n_envs, 6)
    qdot_radps: np.ndarray  # (n_envs, 6)
    effort_nm: np.ndarray  # (n_envs, 6)
    tool_position_m: np.ndarray  # (n_envs, 3)


class VecArmSim:
    """``n_envs`` ArmSim arms stepped in a MuJoCo batch at a fixed control period."""

    def __init__(
        self,
        n_envs: int,
        profiles: ProfileLike | Sequence[ProfileLike] = "nominal",
        seed: int = 0,
        control_dt_s: float = 0.01,
        q0_rad: np.ndarray | None = None,
        n_threads: int | None = None,
    ) -> None:
        """Build the environments.

        Args:
            n_envs: number of environments (>= 1).
            profiles: one profile for all, or one per environment (names, paths or profiles).
            seed: environment i draws its sensor noise from ``np.random.default_rng(seed + i)``.
            control_dt_s: control period, s: a positive multiple of the 1 ms physics step.
            q0_rad: default start configuration; default config/initial_positions.yaml.
            n_threads: batch threads (default: min(n_envs, CPU count)).
        """
        if isinstance(n_envs, bool) or not isinstance(n_envs, (int, np.integer)) or n_envs < 1:
            raise ValueError(f"n_envs = {n_envs!r}: expected an integer >= 1")
        self.n_envs = int(n_envs)
        if isinstance(profiles, (str, Path, DynamicsProfile)):
            profile_list = [load_profile(profiles)] * self.n_envs
        else:
            profile_list = [load_profile(p) for p in profiles]
            if len(profile_list) != self.n_envs:
                raise ValueError(f"profiles has {len(profile_list)} entries: expected one or n_envs = {self.n_envs}")
        self.profiles = tuple(profile_list)
        arms: dict[DynamicsProfile, ArmModel] = {}
        for p in self.profiles:
            if p not in arms:
                arms[p] = build_model(p)
        self._arms = [arms[p] for p in self.profiles]
        arm = self._arms[0]
        self._arm = arm
        self.joint_names = arm.joint_names
        self.dt_s = float(arm.model.opt.timestep)
        steps = float(control_dt_s) / self.dt_s
        if not np.isfinite(steps) or steps < 0.5 or abs(steps - round(steps)) > 1e-6:
            raise ValueError(f"control_dt_s = {control_dt_s!r}: expected a positive multiple of {self.dt_s} s")
        self.control_steps = int(round(steps))
        self.control_dt_s = self.control_steps * self.dt_s
        self._default_q0 = check_q0(
            description.initial_positions(self.joint_names) if q0_rad is None else q0_rad, arm
        )

        threads = min(self.n_envs, os.cpu_count() or 1) if n_threads is None else int(n_threads)
        self._batch = mjbatch.Batch(arm.model, nsim=self.n_envs, nthread=threads)
        if len(arms) > 1:
            self._batch.set_models([a.model for a in self._arms])
        b = self._batch
        self._qpos, self._qvel, self._act, self._ctrl = b.bind("qpos"), b.bind("qvel"), b.bind("act"), b.bind("ctrl")
        self._qfrc_actuator, self._site_xpos = b.bind("qfrc_actuator"), b.bind("site_xpos")
        self._xpos, self._xmat = b.bind("xpos"), b.bind("xmat")
        self._actuator_force = b.bind("actuator_force")

        def per_env(values: Sequence[Sequence[float]]) -> np.ndarray:
            return np.array(values, dtype=float)

        self._offset = per_env([p.encoder_offset_rad for p in self.profiles])
        self._pos_std = per_env([[p.position_noise_std_rad] for p in self.profiles])
        self._vel_std = per_env([[p.velocity_noise_std_radps] for p in self.profiles])
        self._eff_std = per_env([[p.effort_noise_std_nm] for p in self.profiles])
        self._window = per_env([a.integral_window_rad for a in self._arms])
        # the drive's reported torque: its applied torque over the last EFFORT_WINDOW_STEPS (arm.applied_torque)
        self._kv = per_env([p.velocity_gain_nms for p in self.profiles])
        self._vel_force_max = per_env([a.model.actuator_forcerange[a.vel_actuators, 1] for a in self._arms])
        self._joint_force_max = per_env([a.model.jnt_actfrcrange[[a.model.joint(n).id for n in a.joint_names], 1]
                                         for a in self._arms])
        self._effort_window = np.zeros((self.n_envs, EFFORT_WINDOW_STEPS, len(self.joint_names)))
        self._effort_steps = np.zeros(self.n_envs, dtype=np.int64)
        self._rngs = [np.random.default_rng(seed + i) for i in range(self.n_envs)]
        self._steps = np.zeros(self.n_envs, dtype=np.int64)
        self._reset(np.arange(self.n_envs), None)  # no observation: the noise streams start at reset()

    def reset(
        self, env_ids: Sequence[int] | np.ndarray | None = None, q0_rad: np.ndarray | None = None
    ) -> VecObservation:
        """Reset some (default: all) environments to rest at ``q0_rad``; return every environment's observation.

        Args:
            env_ids: environments to reset (default all).
            q0_rad: (6,) for all of them or (len(env_ids), 6); default the constructor's q0.
        Returns:
            The observation of all environments (one noise draw each, as ArmSim.joint_state).
        """
        ids = np.arange(self.n_envs) if env_ids is None else np.asarray(env_ids, dtype=np.int64).reshape(-1)
        self._reset(ids, q0_rad)
        return self._observe()

    def _reset(self, ids: np.ndarray, q0_rad: np.ndarray | None) -> None:
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_envs):
            raise ValueError(f"env_ids = {ids.tolist()}: expected indices in [0, {self.n_envs})")
        if q0_rad is None:
            q0 = np.tile(self._default_q0, (ids.size, 1))
        else:
            q0 = np.asarray(q0_rad, dtype=float)
            q0 = np.tile(q0, (ids.size, 1)) if q0.ndim == 1 else q0
            if q0.shape != (ids.size, len(self.joint_names)):
                n = len(self.joint_names)
                raise ValueError(f"q0_rad has shape {q0.shape}: expected ({n},) or ({ids.size}, {n})")
            for row in q0:
                check_q0(row, self._arm)
        a = self._arm
        self._batch.reset(ids, stage=mujoco.mjtStage.mjSTAGE_NONE.value)
        for k, i in enumerate(ids):
            self._qpos[i, a.qpos_adr] = q0[k]
            self._act[i, a.int_act_adr] = q0[k]
        self._steps[ids] = 0
        self._effort_steps[ids] = 0
        self._batch.forward(ids)

    def step(self, actions: np.ndarray) -> VecObservation:
        """Command one velocity vector per environment and simulate one control period.

        Args:
            actions: (n_envs, 6) joint velocities, rad/s; clamped to the URDF velocity limits.
        Returns:
            The observation of all environments after the control period.
        Raises:
            CommandRejected: wrong shape or non-finite values (nothing is stepped).
        """
        v = np.asarray(actions, dtype=float)
        shape = (self.n_envs, len(self.joint_names))
        if v.shape != shape:
            raise CommandRejected(f"actions have shape {v.shape}: expected {shape} joint velocities in rad/s")
        bad = np.flatnonzero(~np.all(np.isfinite(v), axis=1))
        if bad.size:
            raise CommandRejected(f"actions of environments {bad.tolist()} have non-finite values; nothing stepped")
        a = self._arm
        v = np.clip(v, -a.velocity_limit_radps, a.velocity_limit_radps)
        self._ctrl[:, a.vel_actuators] = v
        self._ctrl[:, a.int_actuators] = v
        stage = mujoco.mjtStage.mjSTAGE_POS.value
        if self.control_steps > EFFORT_WINDOW_STEPS:
            self._batch.step(nstep=self.control_steps - EFFORT_WINDOW_STEPS, stage=stage)
        rows = np.arange(self.n_envs)
        for _ in range(min(self.control_steps, EFFORT_WINDOW_STEPS)):  # the steps the reported effort averages over
            v0 = self._qvel[:, a.dof_adr].copy()
            self._batch.step(nstep=1, stage=stage)
            self._effort_window[rows, self._effort_steps % EFFORT_WINDOW_STEPS] = applied_torque(
                self._qfrc_actuator[:, a.dof_adr], self._actuator_force[:, a.vel_actuators],
                self._qvel[:, a.dof_adr] - v0, self._kv, self._vel_force_max, self._joint_force_max)
            self._effort_steps += 1
        self._steps += self.control_steps
        # anti-windup, as ArmSim does at the end of every step() call
        q = self._qpos[:, a.qpos_adr]
        self._act[:, a.int_act_adr] = np.clip(self._act[:, a.int_act_adr], q - self._window, q + self._window)
        return self._observe()

    @property
    def time_s(self) -> np.ndarray:
        """Simulated time of each environment since its last reset, s."""
        return self._steps * self.dt_s

    def true_state(self) -> tuple[np.ndarray, np.ndarray]:
        """Return the true ``(q_rad, qdot_radps)`` of every environment, (n_envs, 6) each."""
        a = self._arm
        return self._qpos[:, a.qpos_adr].copy(), self._qvel[:, a.dof_adr].copy()

    def _observe(self) -> VecObservation:
        a = self._arm
        n = len(self.joint_names)
        noise = np.stack([rng.standard_normal((3, n)) for rng in self._rngs])  # (n_envs, 3, 6)
        q = self._qpos[:, a.qpos_adr] + self._offset + self._pos_std * noise[:, 0]
        qd = self._qvel[:, a.dof_adr] + self._vel_std * noise[:, 1]
        tau = self._qfrc_actuator[:, a.dof_adr].copy()  # before an environment's first step: the drive's torque
        full = self._effort_steps >= EFFORT_WINDOW_STEPS
        tau[full] = self._effort_window[full].mean(axis=1)
        for i in np.flatnonzero((self._effort_steps > 0) & ~full):  # after fewer steps than the window
            tau[i] = self._effort_window[i, : self._effort_steps[i]].mean(axis=0)
        tau += self._eff_std * noise[:, 2]
        r_base = self._xmat[:, a.base_body].reshape(-1, 3, 3)
        rel = self._site_xpos[:, a.tool_site] - self._xpos[:, a.base_body]
        tool = np.einsum("nji,nj->ni", r_base, rel)
        return VecObservation(self.time_s, q, qd, tau, tool)
