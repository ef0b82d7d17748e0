"""robot_wm's ROS interfaces (msg/, srv/): generated types, constants, CDR round trips, and a
cross-process publish/subscribe over loopback DDS.

The types come from the install space (the venv's site-packages after tools/build_interfaces.sh,
or a colcon install tree). The DDS environment (loopback, own domain) comes from conftest.py.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import os
import random
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
FASTDDS_PROFILE = REPO / "config" / "fastdds_loopback.xml"

# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def interfaces():
    """The generated robot_wm message/service classes (`make test` builds them first)."""
    try:
        msg = importlib.import_module("robot_wm.msg")
        srv = importlib.import_module("robot_wm.srv")
    except ImportError as exc:  # pragma: no cover - environment problem
        pytest.fail(f"robot_wm interfaces not importable ({exc}); run tools/build_interfaces.sh .venv")
    return SimpleNamespace(
        WorldModelPrediction=msg.WorldModelPrediction,
        SafetyStatus=msg.SafetyStatus,
        TrustState=msg.TrustState,
        ModelUpdate=msg.ModelUpdate,
        InjectFault=srv.InjectFault,
    )


# --------------------------------------------------------------------------------------------
# Field names/types and constants (type strings as rosidl_generator_py reports them)
# --------------------------------------------------------------------------------------------

EXPECTED_FIELDS = {
    "WorldModelPrediction": {
        "header": "std_msgs/Header",
        "joint_names": "sequence<string>",
        "model_version": "string",
        "horizon_steps": "uint32",
        "position_rad": "sequence<double>",
        "velocity_radps": "sequence<double>",
        "position_std_epistemic_rad": "sequence<double>",
        "position_std_aleatoric_rad": "sequence<double>",
        "velocity_std_epistemic_radps": "sequence<double>",
        "velocity_std_aleatoric_radps": "sequence<double>",
        "dt_s": "double",
    },
    "SafetyStatus": {
        "header": "std_msgs/Header",
        "state": "uint8",
        "state_text": "string",
        "active_constraints": "sequence<string>",
        "intervention_norm": "double",
        "solver_status": "int32",
        "solver_status_text": "string",
        "iterations": "uint32",
        "solve_time_s": "double",
        "max_slack": "double",
        "fault_reason": "string",
        "fault_kind": "string",
        "latches": "sequence<string>",
    },
    "TrustState": {
        "header": "std_msgs/Header",
        "score": "double",
        "level": "uint8",
        "phase": "uint8",
        "normalized_error": "double",
        "threshold": "double",
        "reason": "string",
    },
    "ModelUpdate": {
        "header": "std_msgs/Header",
        "model_kind": "string",
        "version": "string",
        "path": "string",
        "sha256": "string",
        "metric_names": "sequence<string>",
        "metric_values": "sequence<double>",
        "accepted": "boolean",
        "task": "string",
        "set_version": "string",
        "previous_set_version": "string",
        "action": "string",
        "reason": "string",
    },
}

EXPECTED_SRV_FIELDS = {
    "Request": {
        "kind": "string",
        "force_n": "sequence<double>",
        "duration_s": "double",
        "payload_kg": "double",
        "noise_std": "double",
        "latency_s": "double",
    },
    "Response": {"success": "boolean", "message": "string"},
}

EXPECTED_CONSTANTS = {
    "SafetyStatus": {"OK": 0, "FILTERING": 1, "STOPPING": 2, "STOPPED": 3, "ESTOP": 4, "FAULT": 5},
    "TrustState": {
        "LEVEL_FULL": 0, "LEVEL_CAUTIOUS": 1, "LEVEL_SLOW": 2, "LEVEL_STOP": 3, "LEVEL_HUMAN": 4,
        "PHASE_SIM": 0, "PHASE_MIXED": 1, "PHASE_REAL": 2,
    },
    "WorldModelPrediction": {},
    "ModelUpdate": {},
}


@pytest.mark.parametrize("name", sorted(EXPECTED_FIELDS))
def test_message_fields(interfaces, name):
    cls = getattr(interfaces, name)
    fields = cls.get_fields_and_field_types()
    assert list(fields) == list(EXPECTED_FIELDS[name])  # same names, same order
    assert fields == EXPECTED_FIELDS[name]


@pytest.mark.parametrize("name", sorted(EXPECTED_CONSTANTS))
def test_message_constants(interfaces, name):
    cls = getattr(interfaces, name)
    expected = EXPECTED_CONSTANTS[name]
    for const, value in expected.items():
        assert getattr(cls, const) == value, const
    # the generated metaclass lists every constant of the type, and nothing else
    assert dict(getattr(type(cls), f"_Metaclass_{name}__constants")) == expected


def test_service_fields(interfaces):
    for part, expected in EXPECTED_SRV_FIELDS.items():
        cls = getattr(interfaces.InjectFault, part)
        fields = cls.get_fields_and_field_types()
        assert list(fields) == list(expected), part
        assert fields == expected, part


def test_constants_are_typed(interfaces):
    # uint8 constants fit the fields they are meant for; out-of-range values are rejected when
    # field checks are on (off by default unless ROS_PYTHON_CHECK_FIELDS=1)
    status = interfaces.SafetyStatus(state=interfaces.SafetyStatus.FAULT, check_fields=True)
    assert status.state == 5
    with pytest.raises(AssertionError):
        interfaces.SafetyStatus(state=256, check_fields=True)
    with pytest.raises(AssertionError):
        interfaces.TrustState(level=-1, check_fields=True)
    with pytest.raises((AssertionError, TypeError)):
        interfaces.InjectFault.Request(force_n=["x"], check_fields=True)


# --------------------------------------------------------------------------------------------
# CDR round trips
# --------------------------------------------------------------------------------------------


def _samples(i):
    """One fully populated instance of every interface type (and the srv request/response)."""
    from builtin_interfaces.msg import Time
    from std_msgs.msg import Header

    header = Header(stamp=Time(sec=1_700_000_000, nanosec=123_456_789), frame_id="base_link")
    joints = [f"joint_{k}" for k in range(1, 7)]
    horizon = 3
    n = horizon * len(joints)
    ramp = [0.01 * k - 0.05 for k in range(n)]
    return {
        "WorldModelPrediction": i.WorldModelPrediction(
            header=header, joint_names=joints, model_version="wm-test-1", horizon_steps=horizon,
            position_rad=ramp, velocity_radps=[2 * v for v in ramp],
            position_std_epistemic_rad=[1e-3] * n, position_std_aleatoric_rad=[2e-3] * n,
            velocity_std_epistemic_radps=[3e-3] * n, velocity_std_aleatoric_radps=[4e-3] * n,
            dt_s=0.002,
        ),
        "SafetyStatus": i.SafetyStatus(
            header=header, state=i.SafetyStatus.FILTERING, state_text="FILTERING",
            active_constraints=["joint_limit:joint_2", "velocity:joint_5"], intervention_norm=0.125,
            solver_status=1, solver_status_text="solved", iterations=17, solve_time_s=5.2e-5,
            max_slack=0.0, fault_reason="",
        ),
        "TrustState": i.TrustState(
            header=header, score=0.73, level=i.TrustState.LEVEL_SLOW, phase=i.TrustState.PHASE_MIXED,
            normalized_error=2.6, threshold=2.5, reason="normalized error 2.6 > 2.5",
        ),
        "ModelUpdate": i.ModelUpdate(
            header=header, model_kind="world_model", version="wm-2", path="/tmp/wm-2.onnx",
            sha256="ab" * 32, metric_names=["val_nll", "val_rmse_rad"], metric_values=[-1.5, 0.004],
            accepted=True,
        ),
        "InjectFault.Request": i.InjectFault.Request(
            kind="push", force_n=[10.0, -5.0, 0.5], duration_s=0.2, payload_kg=0.0, noise_std=0.0,
            latency_s=0.0,
        ),
        "InjectFault.Response": i.InjectFault.Response(success=True, message="push applied"),
    }


@pytest.mark.parametrize(
    "key",
    ["WorldModelPrediction", "SafetyStatus", "TrustState", "ModelUpdate",
     "InjectFault.Request", "InjectFault.Response"],
)
def test_serialization_round_trip(interfaces, key):
    from rclpy.serialization import deserialize_message, serialize_message

    msg = _samples(interfaces)[key]
    data = serialize_message(msg)
    assert isinstance(data, bytes) and len(data) > 4
    back = deserialize_message(data, type(msg))
    assert back == msg
    assert back is not msg
    # defaults round-trip too
    empty = type(msg)()
    assert deserialize_message(serialize_message(empty), type(msg)) == empty


def test_prediction_layout_is_row_major(interfaces):
    msg = _samples(interfaces)["WorldModelPrediction"]
    n_joints = len(msg.joint_names)
    for field in ("position_rad", "velocity_radps", "position_std_epistemic_rad",
                  "position_std_aleatoric_rad", "velocity_std_epistemic_radps",
                  "velocity_std_aleatoric_radps"):
        assert len(getattr(msg, field)) == msg.horizon_steps * n_joints, field
    # value(step k, joint j) = array[k * n_joints + j]
    k, j = 2, 4
    assert math.isclose(msg.position_rad[k * n_joints + j], 0.01 * (k * n_joints + j) - 0.05)


# --------------------------------------------------------------------------------------------
# Cross-process publish/subscribe (loopback DDS, private domain)
# --------------------------------------------------------------------------------------------

PUBLISHER_SCRIPT = textwrap.dedent(
    """
    import signal, sys, time
    import rclpy
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from robot_wm.msg import SafetyStatus, WorldModelPrediction

    safety_topic, prediction_topic = sys.argv[1], sys.argv[2]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    rclpy.init()
    node = rclpy.create_node("robot_wm_test_interfaces_pub")
    qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    pub_s = node.create_publisher(SafetyStatus, safety_topic, qos)
    pub_p = node.create_publisher(WorldModelPrediction, prediction_topic, qos)
    deadline = time.monotonic() + 60.0  # never outlive a broken test by long
    seq = 0
    try:
        while time.monotonic() < deadline:
            seq += 1
            s = SafetyStatus(state=SafetyStatus.STOPPING, state_text="STOPPING",
                             active_constraints=["c%d" % seq], iterations=seq,
                             solver_status=1, solver_status_text="solved")
            s.header.stamp = node.get_clock().now().to_msg()
            p = WorldModelPrediction(joint_names=["a", "b"], model_version="wm-x",
                                     horizon_steps=2, position_rad=[0.1, 0.2, 0.3, 0.4],
                                     dt_s=0.01)
            p.header.frame_id = "seq%d" % seq
            pub_s.publish(s)
            pub_p.publish(p)
            time.sleep(0.05)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    """
)


def test_cross_process_pub_sub(spawn, interfaces):
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    suffix = f"{os.getpid()}_{random.randint(0, 1_000_000)}"
    safety_topic = f"/robot_wm_test/safety_{suffix}"
    prediction_topic = f"/robot_wm_test/prediction_{suffix}"
    received = {"safety": None, "prediction": None}

    context = Context()
    rclpy.init(context=context)
    node = None
    executor = None
    try:
        node = rclpy.create_node("robot_wm_test_interfaces_sub", context=context)
        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        node.create_subscription(
            interfaces.SafetyStatus, safety_topic, lambda m: received.__setitem__("safety", m), qos)
        node.create_subscription(
            interfaces.WorldModelPrediction, prediction_topic,
            lambda m: received.__setitem__("prediction", m), qos)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)

        proc = spawn([sys.executable, "-c", PUBLISHER_SCRIPT, safety_topic, prediction_topic])
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and None in received.values():
            if proc.process.poll() is not None:
                break
            executor.spin_once(timeout_sec=0.1)

        if None in received.values():
            pytest.fail(f"not received within 10 s: {received}; publisher rc={proc.stop()}:\n{proc.output()}")

        s, p = received["safety"], received["prediction"]
        assert s.state == interfaces.SafetyStatus.STOPPING and s.state_text == "STOPPING"
        assert s.solver_status_text == "solved" and s.iterations >= 1
        assert s.active_constraints == [f"c{s.iterations}"]
        assert s.header.stamp.sec > 0
        assert p.joint_names == ["a", "b"] and p.horizon_steps == 2 and p.model_version == "wm-x"
        assert list(p.position_rad) == [0.1, 0.2, 0.3, 0.4] and p.dt_s == 0.01
    finally:
        if executor is not None:
            executor.shutdown()
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown(context=context)
