"""DDS stays on loopback: the shipped profile, the environment, and what doctor says."""
from __future__ import annotations

import subprocess
import sys

import pytest

from robot_wm import rosenv


def test_shipped_profile_is_loopback_only():
    assert rosenv.check_profile(rosenv.profile_path()) == []


def test_loopback_env_sets_discovery_and_profile():
    env = rosenv.loopback_env({"ROS_AUTOMATIC_DISCOVERY_RANGE": "SUBNET", "ROS_STATIC_PEERS": "10.0.0.9"}, domain_id=42)
    assert env["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "LOCALHOST"
    assert env["FASTDDS_DEFAULT_PROFILES_FILE"] == str(rosenv.profile_path().resolve())
    assert env["ROS_DOMAIN_ID"] == "42"
    assert "ROS_STATIC_PEERS" not in env
    assert rosenv.check_environment(env) == []


def test_opt_out_leaves_environment_alone():
    env = rosenv.loopback_env({"ROBOT_WM_DDS": "system", "ROS_AUTOMATIC_DISCOVERY_RANGE": "SUBNET"})
    assert env["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "SUBNET"


@pytest.mark.parametrize(
    "xml,problem",
    [
        (None, "not found"),
        ("<dds><profiles", "not valid XML"),
        ("<dds><profiles><participant><rtps><useBuiltinTransports>true</useBuiltinTransports></rtps></participant></profiles></dds>",
         "useBuiltinTransports"),
        ("<dds><x><useBuiltinTransports>false</useBuiltinTransports><address>192.168.1.5</address></x></dds>", "not on loopback"),
    ],
)
def test_bad_profiles_are_refused_with_the_reason(tmp_path, monkeypatch, xml, problem):
    path = tmp_path / "profile.xml"
    if xml is not None:
        path.write_text(xml)
    monkeypatch.setenv(rosenv.PROFILE_ENV, str(path))
    with pytest.raises(rosenv.DdsConfigError, match=problem):
        rosenv.loopback_env({})


def test_unset_environment_is_reported():
    problems = rosenv.check_environment({})
    assert any("ROS_AUTOMATIC_DISCOVERY_RANGE" in p for p in problems)
    assert any("FASTDDS_DEFAULT_PROFILES_FILE" in p for p in problems)


def _doctor(env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "robot_wm.cli", "doctor"], env=env, capture_output=True, text=True, timeout=120)


def test_doctor_reports_a_good_environment_as_good():
    result = _doctor({})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[OK  ] DDS profile" in result.stdout
    assert "[OK  ] ROS 2 round trip" in result.stdout
    assert "[OK  ] MuJoCo" in result.stdout
    assert "0 failed" in result.stdout


def test_doctor_reports_a_missing_dds_profile_clearly(tmp_path):
    missing = tmp_path / "gone.xml"
    result = _doctor({rosenv.PROFILE_ENV: str(missing)})
    assert result.returncode == 1
    assert f"[FAIL] DDS profile: Fast DDS profile not found: {missing}" in result.stdout
    assert "Fix:" in result.stdout


def test_env_verb_prints_exports():
    result = subprocess.run([sys.executable, "-m", "robot_wm.cli", "env"], capture_output=True, text=True, timeout=60)
    assert "export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST" in result.stdout
    assert "export FASTDDS_DEFAULT_PROFILES_FILE=" in result.stdout


def test_cli_help_explains_the_verbs():
    result = subprocess.run([sys.executable, "-m", "robot_wm.cli", "--help"], capture_output=True, text=True, timeout=60)
    for verb in ("sim", "up", "demo", "doctor", "env"):
        assert verb in result.stdout
    assert "loopback" in result.stdout
