"""The policy slot's output stage (robot_wm.core.slew): the nominal's change per period is bounded
by the safety filter's acceleration box, by property over random and adversarial commands."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robot_wm.contracts import N_JOINTS
from robot_wm.core.safety import Phase, load_safety_limits
from robot_wm.core.slew import REANCHOR_STEPS, SlewLimiter, load_slew_fraction, slew_delta

DT = 0.01
LIMITS = load_safety_limits()
DELTA = slew_delta(LIMITS, DT, 0.95, Phase.SIM)
vectors = st.lists(st.floats(-3.0, 3.0), min_size=N_JOINTS, max_size=N_JOINTS).map(np.array)


def test_the_delta_is_a_fraction_of_the_filters_acceleration_box_for_the_phase():
    box = np.asarray(LIMITS.accel_max_radps2) * DT
    assert np.allclose(DELTA, 0.95 * box)
    real = slew_delta(LIMITS, DT, 0.95, Phase.REAL)
    assert np.allclose(real, 0.95 * box * LIMITS.phase_accel_scale[Phase.REAL])  # the phase scales the box
    mixed = slew_delta(LIMITS, DT, 0.95, Phase.MIXED)
    assert np.all(mixed < DELTA)  # MIXED: the smaller box
    assert 0.0 <= load_slew_fraction() <= 1.0


@settings(max_examples=300, deadline=None)
@given(commands=st.lists(vectors, min_size=1, max_size=30), qdot=vectors)
def test_every_step_stays_within_delta_of_the_previous_output(commands, qdot):
    """Hostile command sequences (jumps of up to 6 rad/s): each output is within delta of the one
    before (the base), the first within delta of the measured velocity, unless the base was
    re-anchored because the arm (qdot) was left more than REANCHOR_STEPS steps behind."""
    slew = SlewLimiter(DELTA)
    prev = qdot
    for u in commands:
        out = slew.limit(u, qdot)
        lost = np.any(np.abs(prev - qdot) > REANCHOR_STEPS * DELTA)
        base = qdot if lost else prev
        assert np.all(np.abs(out - base) <= DELTA + 1e-12)
        # the closest command to u in the box: unchanged where u was reachable
        reachable = np.abs(u - base) <= DELTA - 1e-9  # (at the edge itself the clip may round)
        assert np.array_equal(out[reachable], u[reachable])
        prev = out


def test_a_jump_from_rest_ramps_at_delta_per_period_and_a_held_arm_reanchors():
    slew = SlewLimiter(DELTA)
    target = np.full(N_JOINTS, 1.0)
    qdot = np.zeros(N_JOINTS)
    outs = [slew.limit(target, qdot + 0.9 * k * DELTA) for k in range(3)]  # the arm follows a period behind
    assert np.allclose(outs[0], DELTA) and np.allclose(outs[1], 2 * DELTA) and np.allclose(outs[2], 3 * DELTA)
    assert slew.limited_count == 3
    for _ in range(10):  # the filter holds the arm (e-stop): the measured velocity stays zero
        out = slew.limit(target, np.zeros(N_JOINTS))
    assert np.all(out <= (REANCHOR_STEPS + 1) * DELTA + 1e-12)  # not ramped on to 1 rad/s meanwhile
    slew.reset()
    assert np.allclose(slew.limit(-target, np.zeros(N_JOINTS)), -DELTA)


def test_a_batch_is_limited_row_by_row():
    slew = SlewLimiter(DELTA)
    out = slew.limit(np.array([np.ones(N_JOINTS), -np.ones(N_JOINTS)]), np.zeros((2, N_JOINTS)))
    assert np.allclose(out[0], DELTA) and np.allclose(out[1], -DELTA)


@pytest.mark.parametrize("delta", [[0.1] * 5 + [0.0], [0.1] * 5 + [float("nan")], [], 0.1])
def test_a_bad_delta_is_refused(delta):
    with pytest.raises(ValueError, match="delta_radps"):
        SlewLimiter(delta)


@pytest.mark.parametrize("fraction", [0.0, 1.5, float("nan")])
def test_a_bad_fraction_is_refused(fraction):
    with pytest.raises(ValueError, match="slew fraction"):
        slew_delta(LIMITS, DT, fraction)


def test_a_bad_config_value_names_the_file_and_field(tmp_path):
    path = tmp_path / "control.yaml"
    path.write_text("policy:\n  ros__parameters:\n    command_slew_fraction: 2.0\n")
    with pytest.raises(ValueError, match="command_slew_fraction=2.0"):
        load_slew_fraction(path)
    path.write_text("policy:\n  ros__parameters: {}\n")
    assert load_slew_fraction(path) == 0.95


def test_the_output_stage_follows_the_trust_levels_scales():
    """At a reduced level the policy slot scales its command and its slew limit like the filter's
    limits; at STOP and HUMAN it commands zero, decelerating at the unscaled slew rate."""
    from robot_wm.core.safety import load_safety_limits
    from robot_wm.core.safety.limits import Phase, TrustLevel
    from robot_wm.core.slew import trust_scales

    limits = load_safety_limits()
    for phase in Phase:
        assert trust_scales(limits, TrustLevel.FULL, phase) == (1.0, 1.0)
        for level in (TrustLevel.CAUTIOUS, TrustLevel.SLOW):
            speed, accel = trust_scales(limits, level, phase)
            assert speed == pytest.approx(limits.level_speed_scale[level])
            assert accel == pytest.approx(limits.level_accel_scale[level])
        assert trust_scales(limits, TrustLevel.STOP, phase) == (0.0, 1.0)
        assert trust_scales(limits, TrustLevel.HUMAN, phase) == (0.0, 1.0)
    slew = SlewLimiter(np.full(6, 0.1))
    out = slew.limit(np.full(6, 1.0), np.zeros(6), 0.5)
    assert np.allclose(out, 0.05)


def test_a_tighter_phase_in_the_trust_state_scales_the_slot_like_the_filter():
    """The slot's own limits are for its base phase (SIM on the embedded arm); a TrustState in MIXED
    (the tightest phase) scales it by MIXED's factors relative to them, as the filter applies the
    tighter of the two; a looser phase than the base changes nothing."""
    from robot_wm.core.safety.limits import Phase, TrustLevel
    from robot_wm.core.slew import trust_scales

    limits = load_safety_limits()
    speed, accel = trust_scales(limits, TrustLevel.FULL, Phase.MIXED, base_phase=Phase.SIM)
    assert speed == pytest.approx(limits.phase_speed_scale[Phase.MIXED] / limits.phase_speed_scale[Phase.SIM])
    assert accel == pytest.approx(limits.phase_accel_scale[Phase.MIXED] / limits.phase_accel_scale[Phase.SIM])
    assert speed < 1.0
    speed, _ = trust_scales(limits, TrustLevel.SLOW, Phase.MIXED, base_phase=Phase.REAL)
    assert speed == pytest.approx(limits.level_speed_scale[TrustLevel.SLOW] * limits.phase_speed_scale[Phase.MIXED]
                                  / limits.phase_speed_scale[Phase.REAL])
    assert trust_scales(limits, TrustLevel.FULL, Phase.REAL, base_phase=Phase.MIXED) == (1.0, 1.0)
