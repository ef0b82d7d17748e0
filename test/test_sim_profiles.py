"""Dynamics profiles: shipped files, YAML validation with clear errors, domain randomization."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from robot_wm.paths import data_path
from robot_wm.sim import (
    ArmSim,
    DynamicsProfile,
    ProfileError,
    VecArmSim,
    default_randomization_ranges,
    load_profile,
    profile_names,
    sample_profile,
)
from robot_wm.sim.profiles import SCHEMA


def test_shipped_profiles_load_and_nominal_file_equals_the_defaults():
    assert {"nominal", "real_twin"} <= set(profile_names())
    assert load_profile("nominal") == DynamicsProfile()
    raw = yaml.safe_load(data_path("config", "sim_profiles", "nominal.yaml").read_text())
    assert set(raw) == set(SCHEMA), "nominal.yaml lists every field"


def test_real_twin_differs_like_a_real_arm():
    twin, nominal = load_profile("real_twin"), DynamicsProfile()
    assert twin.name == "real_twin"
    assert min(twin.coulomb_friction_nm) > 0 and min(twin.viscous_damping_nms) > 0
    assert min(twin.link_mass_scale) > 1.0 and twin.payload_kg > 0
    assert twin.actuator_lag_s == pytest.approx(0.008) and twin.command_latency_s == pytest.approx(0.004)
    assert twin.position_noise_std_rad > 0 and twin.velocity_noise_std_radps > 0 and twin.force_noise_std_n > 0
    assert 0 < np.abs(twin.encoder_offset_rad).max() < 0.01
    assert twin.velocity_gain_nms == nominal.velocity_gain_nms, "same drive, same tuning"


def test_load_by_path_partial_file_and_ros_parameter_wrapper(tmp_path):
    path = tmp_path / "light.yaml"
    path.write_text("payload_kg: 1.5\nlink_mass_scale: {forearm_link: 1.2}\nviscous_damping_nms: 0.5\n")
    p = load_profile(path)
    assert p.name == "light" and p.payload_kg == 1.5
    assert p.link_mass_scale == (1.0, 1.0, 1.2, 1.0, 1.0, 1.0)
    assert p.viscous_damping_nms == (0.5,) * 6
    assert p.actuator_lag_s == DynamicsProfile().actuator_lag_s  # omitted → nominal
    wrapped = tmp_path / "wrapped.yaml"
    wrapped.write_text("/**:\n  ros__parameters:\n    name: wrapped\n    command_latency_s: 0.002\n")
    assert load_profile(str(wrapped)).command_latency_s == 0.002


def test_docs_example_is_a_valid_profile(tmp_path):
    text = (Path(__file__).resolve().parent.parent / "docs" / "sim_profiles.md").read_text()
    block = re.search(r"```yaml\n(name: worn_arm_with_gripper.*?)```", text, re.S)
    assert block, "the example profile block is in docs/sim_profiles.md"
    path = tmp_path / "example.yaml"
    path.write_text(block.group(1))
    profile = load_profile(path)
    assert profile.payload_kg == 3.0 and profile.link_mass_scale[1] == 1.15
    ArmSim(profile).step(10)


@pytest.mark.parametrize(
    ("body", "field", "shown", "expected"),
    [
        ("payload: 1.0\n", "payload", "payload", "unknown field"),
        ("coulomb_friction_nm: [1, 2, 3]\n", "coulomb_friction_nm", "[1, 2, 3]", "exactly 6 values"),
        ("position_noise_std_rad: -0.001\n", "position_noise_std_rad", "-0.001", "[0, 1] rad"),
        ("velocity_noise_std_radps: .nan\n", "velocity_noise_std_radps", "nan", "finite"),
        ("payload_kg: heavy\n", "payload_kg", "'heavy'", "a number in kg"),
        ("payload_com_m: [0, 0]\n", "payload_com_m", "[0, 0]", "exactly 3 values"),
        ("link_mass_scale: {elbow_link: 1.1}\n", "link_mass_scale", "elbow_link", "link names from"),
        ("link_mass_scale: 0\n", "link_mass_scale", "0", "(0, 10]"),
        ("command_latency_s: 0.5\n", "command_latency_s", "0.5", "[0, 0.1] s"),
        ("armature_kgm2: [0.1, 0.1, 0.1, 0.1, 0.1, true]\n", "armature_kgm2", "True", "a number"),
        ("encoder_offset_rad: yes\n", "encoder_offset_rad", "True", "a number"),
        ("name: ''\n", "name", "''", "non-empty"),
        ("stop_deceleration_radps2: 0\n", "stop_deceleration_radps2", "0", "(0, 1000]"),
    ],
)
def test_malformed_profile_errors_name_file_field_value_and_expectation(tmp_path, body, field, shown, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    msg = str(err.value)
    assert str(path) in msg and field in msg and shown in msg and expected in msg, msg


def test_unreadable_or_non_mapping_files_and_unknown_names(tmp_path):
    not_mapping = tmp_path / "list.yaml"
    not_mapping.write_text("- 1\n- 2\n")
    with pytest.raises(ProfileError, match=r"list.yaml: expected a mapping"):
        load_profile(not_mapping)
    broken = tmp_path / "broken.yaml"
    broken.write_text("payload_kg: [1, 2\n")
    with pytest.raises(ProfileError, match=r"broken.yaml: not valid YAML"):
        load_profile(broken)
    with pytest.raises(ProfileError, match=r"missing.yaml: cannot read"):
        load_profile(tmp_path / "missing.yaml")
    with pytest.raises(ProfileError, match=r"unknown dynamics profile 'realtwin'.*real_twin"):
        load_profile("realtwin")


def test_direct_construction_and_replace_are_validated():
    with pytest.raises(ProfileError, match=r"'payload_kg' = -1"):
        DynamicsProfile(payload_kg=-1)
    with pytest.raises(ProfileError, match=r"unknown fields \['lag'\]"):
        DynamicsProfile().replace(lag=0.1)
    p = DynamicsProfile().replace(coulomb_friction_nm=np.array([1, 2, 3, 4, 5, 6]))
    assert p.coulomb_friction_nm == (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    assert hash(p) == hash(DynamicsProfile().replace(coulomb_friction_nm=[1, 2, 3, 4, 5, 6]))


def test_sample_profile_draws_within_ranges_deterministically():
    ranges = {
        "payload_kg": (0.5, 1.0),
        "coulomb_friction_nm": (0.0, [1, 1, 1, 0.2, 0.2, 0.2]),
        "link_mass_scale": (0.9, 1.1),
    }
    a = sample_profile(np.random.default_rng(1), ranges)
    b = DynamicsProfile().randomized(np.random.default_rng(1), ranges)
    assert a == b and a.name == "nominal-randomized"
    assert 0.5 <= a.payload_kg <= 1.0
    assert all(0 <= f <= hi for f, hi in zip(a.coulomb_friction_nm, [1, 1, 1, 0.2, 0.2, 0.2]))
    assert len(set(a.link_mass_scale)) == 6, "each link drawn on its own"
    assert a.actuator_lag_s == 0.0, "fields not in ranges keep the base value"
    c = sample_profile(np.random.default_rng(2), ranges, base="real_twin", name="twin-2")
    assert c.name == "twin-2" and c.actuator_lag_s == 0.008


@pytest.mark.parametrize(
    ("ranges", "match"),
    [
        ({"friction": (0, 1)}, "unknown field 'friction'"),
        ({"name": ("a", "b")}, "'name' is text"),
        ({"payload_kg": (1.0,)}, r"'payload_kg' = \(1.0,\): expected a \(low, high\) pair"),
        ({"payload_kg": (2.0, 1.0)}, "low <= high"),
        ({"coulomb_friction_nm": ([0, 0], [1, 1])}, "lists of 6 numbers"),
        ({"coulomb_friction_nm": (-2.0, -1.0)}, "invalid profile.*'coulomb_friction_nm'"),
    ],
)
def test_sample_profile_rejects_bad_ranges(ranges, match):
    with pytest.raises(ProfileError, match=match):
        sample_profile(np.random.default_rng(0), ranges)


def test_default_randomization_ranges_give_profiles_a_batch_can_mix():
    rng = np.random.default_rng(0)
    profiles = [sample_profile(rng, default_randomization_ranges()) for _ in range(4)]
    assert len(set(profiles)) == 4
    vec = VecArmSim(4, profiles=profiles, seed=0)
    vec.reset()
    obs = vec.step(np.full((4, 6), 0.2))
    assert np.all(np.isfinite(obs.q_rad))
