"""The online learner's validation gate: what a candidate world model must show before it may reach
the control path (``robot_wm.learning.online``, whose module docstring lists the criteria).

Every criterion is judged on data the candidate was not fitted on: the newest real seconds
(``HeldOut``, ``held_out_samples``) and a fixed simulator reference set. Besides the prediction
numbers (velocity RMSE, NLL, interval coverage, the simulator regression, ONNX parity), the gate asks
the safety filter's own question of the candidate (``SlopeCheck``): linearized at each of those
states about the command that was sent there, as the filter linearizes it every period, is it a model
the filter accepts (``robot_wm.core.safety.validate.check_model``)? A fine-tune can leave a slope of
the wrong sign in a corner of the state space while its predictions improve; the filter would stop
the arm there (a MODEL_IMPLAUSIBLE fault). A candidate the filter would refuse at more of these
states than the active model is rejected.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

Z90 = 1.6448536269514722


@dataclass
class HeldOut:
    """One-step samples with their true command histories (the gate's data)."""

    q: np.ndarray  # (B, n)
    qd: np.ndarray  # (B, n)
    actions: np.ndarray  # (B, H, n), oldest first
    next_state: np.ndarray  # (B, 2n)


def held_out_samples(samples: np.ndarray, history: int) -> HeldOut:
    """Every sample of a contiguous run that has ``history - 1`` commands before it and a next state."""
    idx = np.arange(history - 1, len(samples) - 1)
    acts = np.stack([samples[i - history + 1:i + 1, 2] for i in idx])
    nxt = np.concatenate([samples[idx + 1, 0], samples[idx + 1, 1]], -1)
    return HeldOut(samples[idx, 0], samples[idx, 1], acts, nxt)


@dataclass(frozen=True)
class SlopeCheck:
    """What the safety filter checks each linearization against (``check_model``'s arguments).

    Attributes:
        hw_velocity_radps: the URDF's joint velocity limits, joint order (``Kinematics.velocity_limits_radps``).
        dt_s: the control period.
        joint_names: the joint order (for the reason).
    """

    hw_velocity_radps: np.ndarray
    dt_s: float
    joint_names: tuple[str, ...]

    def refusals(self, runner, data: HeldOut, chunk: int = 1024) -> tuple[int, str]:
        """(states at which the filter would refuse ``runner``'s linearization, the first reason)."""
        from robot_wm.core.safety.types import LinearizedModel
        from robot_wm.core.safety.validate import Problem, check_model

        count, first = 0, ""
        for lo in range(0, len(data.q), chunk):
            sl = slice(lo, lo + chunk)
            f0, jac, std = runner.linearize_batch(data.q[sl], data.qd[sl], data.actions[sl])
            for i, q in enumerate(data.q[sl]):
                out = check_model(LinearizedModel(f0[i], jac[i], std[i]), q, self.hw_velocity_radps, self.dt_s,
                                  self.joint_names)
                if isinstance(out, Problem):
                    count += 1
                    first = first or out.reason
        return count, first


# ------------------------------------------------------------------------------------------ the gate
@dataclass
class GateResult:
    """The gate's verdict on a candidate, with the numbers behind it."""

    accepted: bool
    reasons: list[str]
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "accepted: " + "; ".join(self.reasons) if self.accepted else "rejected: " + "; ".join(self.reasons)


def _scores(runner, data: HeldOut) -> dict[str, float]:
    """NLL (mean over components, constant dropped), velocity RMSE and 90 % coverage of a runner on held-out samples."""
    out = runner.predict_batch(data.q, data.qd, data.actions)
    mean = out.next_state.astype(float)
    var = (out.epistemic_var + out.aleatoric_var).astype(float)
    err = data.next_state - mean
    n = data.q.shape[1]
    nll = float(np.mean(err ** 2 / np.maximum(var, 1e-18) + np.log(np.maximum(var, 1e-18))))
    z = np.abs(err) / np.sqrt(np.maximum(var, 1e-18))
    return {"nll": nll, "rmse_qdot_radps": float(np.sqrt(np.mean(err[:, n:] ** 2))),
            "coverage90": float(np.mean(z <= Z90))}


class ValidationGate:
    """Judges a candidate world model against the active one (see the module docstring).

    Args:
        cfg: the learner's settings (``LearnerConfig``): the margins and bands.
        sim_reference: the fixed simulator reference set, or None (not judged).
        slopes: the filter's model check, or None (not judged: tests of the other criteria).
    """

    def __init__(self, cfg, sim_reference: HeldOut | None, slopes: SlopeCheck | None = None) -> None:
        self.cfg = cfg
        self.sim_reference = sim_reference
        self.slopes = slopes

    def judge(self, candidate, active, held: HeldOut, parity_error: float) -> GateResult:
        """``candidate``/``active``: WorldModelRunners; ``parity_error``: exported vs torch (relative)."""
        cfg = self.cfg
        cand, act = _scores(candidate, held), _scores(active, held)
        metrics = {f"candidate_{k}": v for k, v in cand.items()} | {f"active_{k}": v for k, v in act.items()}
        metrics["parity_rel_error"] = float(parity_error)
        metrics["held_out_samples"] = float(len(held.q))
        reasons, ok = [], True
        gain = 1.0 - cand["rmse_qdot_radps"] / max(act["rmse_qdot_radps"], 1e-12)
        metrics["rmse_gain"] = gain
        metrics["nll_gain"] = act["nll"] - cand["nll"]
        text = f"held-out qdot RMSE {cand['rmse_qdot_radps']:.4g} vs {act['rmse_qdot_radps']:.4g} rad/s ({gain:+.1%})"
        if gain < cfg.min_improvement:
            ok = False
            reasons.append(f"{text}: less than {cfg.min_improvement:.0%} better")
        else:
            reasons.append(text)
        text = f"NLL {cand['nll']:.3f} vs {act['nll']:.3f}"
        if metrics["nll_gain"] < cfg.min_nll_gain:
            ok = False
            reasons.append(f"{text}: not {cfg.min_nll_gain:g} lower")
        else:
            reasons.append(text)
        lo, hi = cfg.coverage_band
        if not lo <= cand["coverage90"] <= hi:
            ok = False
            reasons.append(f"90 % intervals cover {cand['coverage90']:.3f} of the held-out errors (expected {lo:g}-{hi:g})")
        if self.sim_reference is not None:
            c_sim, a_sim = _scores(candidate, self.sim_reference), _scores(active, self.sim_reference)
            metrics["candidate_sim_rmse_qdot_radps"] = c_sim["rmse_qdot_radps"]
            metrics["active_sim_rmse_qdot_radps"] = a_sim["rmse_qdot_radps"]
            growth = c_sim["rmse_qdot_radps"] / max(a_sim["rmse_qdot_radps"], 1e-12) - 1.0
            metrics["sim_regression"] = growth
            if growth > cfg.max_sim_regression:
                ok = False
                reasons.append(f"simulator reference error grew by {growth:.0%} (> {cfg.max_sim_regression:.0%})")
        if self.slopes is not None:
            ok = self._judge_slopes(candidate, active, held, metrics, reasons) and ok
        if not parity_error <= cfg.parity_tol:
            ok = False
            reasons.append(f"exported ONNX differs from the trained model by {parity_error:.2e} (> {cfg.parity_tol:g})")
        return GateResult(ok, reasons, metrics)

    def _judge_slopes(self, candidate, active, held: HeldOut, metrics: dict[str, float], reasons: list[str]) -> bool:
        """The filter's check at the held-out states and the simulator reference's: no more refusals
        for the candidate than for the active model."""
        sets = [held] if self.sim_reference is None else [held, self.sim_reference]
        cand = [self.slopes.refusals(candidate, data) for data in sets]
        n_cand, n_act = sum(c for c, _ in cand), sum(self.slopes.refusals(active, data)[0] for data in sets)
        states = sum(len(data.q) for data in sets)
        metrics["candidate_filter_refusals"], metrics["active_filter_refusals"] = float(n_cand), float(n_act)
        metrics["filter_checked_states"] = float(states)
        if n_cand > n_act:
            first = next(why for c, why in cand if c)
            reasons.append(f"the safety filter would refuse its linearization at {n_cand} of {states} held-out and "
                           f"reference states (the active model's: {n_act}), e.g. {first}")
            return False
        return True
