"""DDS stays on loopback: the shipped profile, the environment, and what doctor says."""
from __future__ import annotations

import subprocess
import sys

import pytest

from robot_wm import rosenv


def test_shipped_profile_is_loopback_only():
    assert rosenv.check_profile(rosenv.profile_path()) == []


def test_the_udp_only_profile_is_loopback_only_and_has_no_shared_memory():
    import xml.etree.ElementTree as ET

    path = rosenv.profile_path(shared_memory=False)
    assert path.name == "fastdds_loopback_udp.xml" and rosenv.check_profile(path) == []
    ns = "{http://www.eprosima.com}"
    kinds = [e.text for e in ET.parse(path).getroot().iter(f"{ns}type")]
    assert kinds == ["UDPv4"], kinds
    shm = [e.text for e in ET.parse(rosenv.profile_path()).getroot().iter(f"{ns}type")]
    assert "SHM" in shm  # the other processes keep shared memory
    env = rosenv.loopback_env({}, shared_memory=False)
    assert env["FASTDDS_DEFAULT_PROFILES_FILE"] == str(path.resolve()) and rosenv.check_environment(env) == []


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


_SUBSCRIBER = """
import os, sys, time
from robot_wm.rosenv import apply_loopback_dds
apply_loopback_dds(shared_memory=sys.argv[1] == "shm")
import rclpy
from std_msgs.msg import Float64MultiArray
rclpy.init()
node = rclpy.create_node("transport_probe")
got = []
node.create_subscription(Float64MultiArray, "/robot_wm_test/transport", got.append, 10)
end = time.monotonic() + 60.0
while len(got) < 50 and time.monotonic() < end:
    rclpy.spin_once(node, timeout_sec=0.1)
print("received", len(got), flush=True)
"""


def _shm_ports() -> set[str]:
    with open("/proc/self/maps") as maps:
        return {line.split()[-1] for line in maps if "/dev/shm/fastdds_port" in line}


@pytest.mark.ros
@pytest.mark.parametrize("mode", ["shm", "udp"])
def test_a_process_off_shared_memory_gets_its_data_over_udp(ros_context, mode):
    """rmw_fastrtps gives every LOCALHOST participant a shared-memory transport, whatever the profile
    says; the UDP-only profile moves the process's own data port to UDP (defaultUnicastLocatorList),
    so no other process pushes into a shared-memory port of its: this process, publishing to it,
    opens no new port (with the shared-memory profile, the control, it opens the subscriber's)."""
    import time

    import rclpy
    from std_msgs.msg import Float64MultiArray

    from conftest import PYTHON

    node = rclpy.create_node("transport_source", context=ros_context)
    pub = node.create_publisher(Float64MultiArray, "/robot_wm_test/transport", 10)
    before = _shm_ports()
    child = subprocess.Popen([PYTHON, "-c", _SUBSCRIBER, mode], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        deadline = time.monotonic() + 60.0
        while child.poll() is None and time.monotonic() < deadline:
            pub.publish(Float64MultiArray(data=[1.0]))
            time.sleep(0.02)
        out = child.communicate(timeout=10)[0]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert "received 50" in out, out
    opened = _shm_ports() - before  # the ports this process pushed the subscriber's data into
    assert (len(opened) > 0) if mode == "shm" else (opened == set()), (mode, opened, before)
    node.destroy_node()


def test_the_online_learner_runs_off_shared_memory():
    from robot_wm.nodes import adaptation_node

    assert adaptation_node.main.shared_memory is False
