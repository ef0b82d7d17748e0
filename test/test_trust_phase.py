"""Deployment phases (robot_wm.core.trust.phase): gated promotion, automatic demotion, persistence.

The property test drives the machine with random event sequences (operation, episodes, anomalies,
interventions, operator requests, restarts from the file) and checks, against an independent
account of the evidence, that no path leads to a higher phase without the stated evidence and an
operator's request, and that a restart always comes back in the phase that was saved.
"""
from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robot_wm.core.safety.limits import Phase
from robot_wm.core.trust.phase import (PhaseConfig, PhaseFileError, PhaseMachine, PhaseStore, PromotionCriteria,
                                       criteria_from_mapping)
from robot_wm.core.trust.settings import load_phase_config, phase_config_from_params

SMALL = PhaseConfig(
    to_mixed=PromotionCriteria(min_minutes=1.0, min_episodes=3, min_success_rate=0.6, min_mean_score=0.5,
                               anomaly_free_minutes=0.5),
    to_real=PromotionCriteria(min_minutes=2.0, min_episodes=5, min_success_rate=0.8, min_mean_score=0.6,
                              anomaly_free_minutes=1.0))


class Clock:
    def __init__(self) -> None:
        self.t = 1.0e9

    def __call__(self) -> float:
        return self.t


def test_a_fresh_machine_starts_in_sim_and_writes_its_file(tmp_path):
    store = PhaseStore(tmp_path / "phase" / "reach.json")
    m = PhaseMachine(SMALL, store, model_version="wm-a")
    assert m.phase == Phase.SIM
    data = json.loads(store.path.read_text())
    assert data["phase"] == "SIM" and data["model_version"] == "wm-a"


def test_promotion_is_refused_with_every_unmet_criterion_then_granted(tmp_path):
    m = PhaseMachine(SMALL, PhaseStore(tmp_path / "p.json"), model_version="wm-a")
    ok, message, unmet = m.promote("first try", calibrated=False)
    assert not ok and m.phase == Phase.SIM
    assert len(unmet) == 6, unmet  # minutes, episodes, success rate, score, anomaly-free, calibration
    assert "operated 0.0 of 1 min" in message and "no trust calibration" in message
    for _ in range(61 * 100):
        m.operate(0.01, 0.9)
    for success in (True, True, False, True):
        m.episode(success)
    ok, message, unmet = m.promote("still uncalibrated", calibrated=False)
    assert not ok and unmet == ["no trust calibration for the running world model (`robot-wm trust calibrate`)"]
    ok, message, unmet = m.promote("sim evidence is in", calibrated=True)
    assert ok and unmet == [] and m.phase == Phase.MIXED, message
    # the evidence starts afresh in the new phase: the next promotion is refused again
    ok, _, unmet = m.promote("too soon", calibrated=True)
    assert not ok and m.phase == Phase.MIXED and any("episodes" in u for u in unmet)
    hist = m.state.history[-1]
    assert (hist["from"], hist["to"], hist["by"]) == ("SIM", "MIXED", "operator")
    assert hist["evidence"]["episodes"] == 4 and "sim evidence is in" in hist["reason"]


def test_anomaly_demotes_real_to_mixed_and_asks_for_a_human_in_mixed(tmp_path):
    store = PhaseStore(tmp_path / "p.json")
    m = PhaseMachine(SMALL, store)
    m.state.phase = Phase.REAL
    assert m.anomaly("payload") == "demoted" and m.phase == Phase.MIXED
    assert m.anomaly("payload again") == "human" and m.phase == Phase.MIXED
    m.demote("operator")
    assert m.phase == Phase.SIM and m.anomaly("in sim") is None and m.phase == Phase.SIM
    assert PhaseMachine(SMALL, store).phase == Phase.SIM


def test_an_intervention_in_real_demotes_and_a_later_anomaly_resets_the_anomaly_free_clock(tmp_path):
    m = PhaseMachine(SMALL, PhaseStore(tmp_path / "p.json"))
    m.state.phase = Phase.REAL
    assert m.intervention("tool caught") and m.phase == Phase.MIXED
    assert not m.intervention("again") and m.phase == Phase.MIXED
    assert m.state.evidence.interventions == 1  # counted in the new phase's evidence
    for _ in range(100):
        m.operate(1.0, 1.0)
    assert m.state.evidence.anomaly_free_s == pytest.approx(100.0)
    m.anomaly("x")
    m.operate(10.0, 1.0)
    assert m.state.evidence.anomaly_free_s == pytest.approx(10.0)


def test_demotion_out_of_sim_is_refused_and_promotion_out_of_real_too(tmp_path):
    m = PhaseMachine(PhaseConfig(to_mixed=PromotionCriteria(0, 0, 0, 0, 0, False),
                                 to_real=PromotionCriteria(0, 0, 0, 0, 0, False)), PhaseStore(tmp_path / "p.json"))
    assert m.demote("x") == (False, "already SIM: there is no lower phase")
    m.episode(True)
    assert m.promote("a", calibrated=False)[0] and m.phase == Phase.MIXED
    m.episode(True)
    assert m.promote("b", calibrated=False)[0] and m.phase == Phase.REAL
    ok, _, unmet = m.promote("c", calibrated=True)
    assert not ok and unmet == ["already REAL: there is no higher phase"]


def test_a_new_world_model_starts_the_evidence_afresh(tmp_path):
    store = PhaseStore(tmp_path / "p.json")
    m = PhaseMachine(SMALL, store, model_version="wm-a")
    m.operate(100.0, 1.0)
    m.episode(True)
    m.save()
    again = PhaseMachine(SMALL, store, model_version="wm-a")
    assert again.state.evidence.episodes == 1
    swapped = PhaseMachine(SMALL, store, model_version="wm-b")
    assert swapped.state.evidence.episodes == 0 and swapped.state.evidence.operating_s == 0.0
    assert "evidence starts afresh" in swapped.state.history[-1]["reason"]


@pytest.mark.parametrize("content, says", [
    ("{not json", "not JSON"),
    ('{"format": "other/1"}', "format 'other/1'"),
    ('{"format": "robot_wm.trust.phase/1", "phase": "ORBIT"}', "phase 'ORBIT'"),
    ('{"format": "robot_wm.trust.phase/1", "phase": "REAL", "evidence": {"operating_s": -1}}', "negative"),
    ('{"format": "robot_wm.trust.phase/1", "phase": "REAL", "evidence": {"bogus": 1}}', "bogus"),
    ("[]", "format 'list'"),
])
def test_a_malformed_phase_file_is_an_error_naming_the_file_never_a_silent_reset(tmp_path, content, says):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(PhaseFileError, match=says) as err:
        PhaseMachine(SMALL, PhaseStore(path))
    assert str(path) in str(err.value)
    assert path.read_text() == content  # left alone for the operator to look at


def test_the_write_is_atomic_a_failing_write_leaves_the_old_state(tmp_path, monkeypatch):
    store = PhaseStore(tmp_path / "p.json")
    m = PhaseMachine(SMALL, store)
    m.state.phase = Phase.MIXED
    m.save(force=True)
    before = store.path.read_text()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(json, "dump", boom)
    m.state.phase = Phase.REAL
    with pytest.raises(OSError, match="disk full"):
        m.save(force=True)
    assert store.path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]  # no temp file left behind


def test_the_criteria_come_from_config_trust_yaml_and_bad_ones_are_named():
    cfg = load_phase_config()
    assert cfg.to_mixed.min_episodes == 20 and cfg.to_real.min_minutes == 30.0
    with pytest.raises(ValueError, match="phase_to_real_min_success_rate"):
        phase_config_from_params({"phase_to_real_min_success_rate": "high"})
    with pytest.raises(ValueError, match="min_success_rate"):
        phase_config_from_params({"phase_to_real_min_success_rate": 1.5})
    with pytest.raises(ValueError, match="phase_to_mixed_min_episodes"):
        phase_config_from_params({"phase_to_mixed_min_episodes": 2.5})
    with pytest.raises(ValueError, match="unknown"):
        criteria_from_mapping({"to_mixed": {"min_hours": 3}})


# ------------------------------------------------------------------------------------- property
EVENTS = st.lists(st.one_of(
    st.tuples(st.just("operate"), st.floats(0.0, 40.0), st.floats(0.0, 1.0)),
    st.tuples(st.just("episode"), st.booleans()),
    st.tuples(st.just("anomaly")),
    st.tuples(st.just("intervention")),
    st.tuples(st.just("promote"), st.booleans()),
    st.tuples(st.just("demote")),
    st.tuples(st.just("restart")),
    st.tuples(st.just("model"), st.sampled_from(["wm-a", "wm-b"])),
), max_size=80)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=EVENTS)
def test_no_path_to_a_higher_phase_without_the_stated_evidence(tmp_path_factory, events):
    path = tmp_path_factory.mktemp("phase") / "p.json"
    clock = Clock()
    m = PhaseMachine(SMALL, PhaseStore(path), model_version="wm-a", clock=clock)
    # an independent account of the evidence since the phase was entered
    acc = dict(op=0.0, score=0.0, eps=0, ok=0, last_anomaly=None)

    def fresh():
        acc.update(op=0.0, score=0.0, eps=0, ok=0, last_anomaly=None)

    for ev in events:
        before = m.phase
        clock.t += 1.0
        kind = ev[0]
        if kind == "operate":
            m.operate(ev[1], ev[2])
            if ev[1] > 0:
                acc["op"] += ev[1]
                acc["score"] += ev[1] * ev[2]
        elif kind == "episode":
            m.episode(ev[1])
            acc["eps"] += 1
            acc["ok"] += int(ev[1])
        elif kind == "anomaly":
            m.anomaly("x")
            acc["last_anomaly"] = acc["op"]
        elif kind == "intervention":
            m.intervention("x")
        elif kind == "promote":
            crit = SMALL.criteria(before)
            ok, _, unmet = m.promote("p", calibrated=ev[1])
            if ok:
                assert crit is not None
                assert acc["op"] / 60.0 >= crit.min_minutes
                assert acc["eps"] >= crit.min_episodes and acc["ok"] / acc["eps"] >= crit.min_success_rate
                assert acc["score"] / acc["op"] >= crit.min_mean_score
                free = acc["op"] - (acc["last_anomaly"] if acc["last_anomaly"] is not None else 0.0)
                assert free / 60.0 >= crit.anomaly_free_minutes
                assert ev[1] or not crit.require_calibration
                assert m.phase == before + 1
            else:
                assert unmet and m.phase == before
        elif kind == "demote":
            m.demote("d")
        elif kind == "restart":
            saved = json.loads(path.read_text())["phase"]
            m = PhaseMachine(SMALL, PhaseStore(path), model_version=m.state.model_version, clock=clock)
            assert m.phase.name == saved
        elif kind == "model":
            swapped = ev[1] != m.state.model_version
            m.set_model(ev[1])
            m.save()
        # the only way up is a granted promotion (checked above); every other event keeps or lowers it
        if kind != "promote":
            assert m.phase <= before
        if m.phase != before or (kind == "model" and swapped):
            fresh()
        # every transition is on disk at once
        assert json.loads(path.read_text())["phase"] == m.phase.name
        assert not [p for p in os.listdir(path.parent) if p.endswith(".tmp")]


def test_the_event_that_demoted_calls_no_human_even_when_its_evidence_flickers():
    """A loaded fresh-clone CI run: a fault demoted REAL -> MIXED, its effort signal grazed its
    threshold, the anomaly ended for a period and began again, and the second onset called a human
    for the same event. The event lasts until the level is FULL again; the next one calls a human."""
    from robot_wm.core.safety.limits import TrustLevel
    from robot_wm.core.trust.phase import DemotionEvent

    event = DemotionEvent()
    assert not event.human_on_anomaly(Phase.REAL, TrustLevel.FULL)  # REAL: an anomaly demotes, no human
    assert event.human_on_anomaly(Phase.MIXED, TrustLevel.FULL)  # MIXED from the start: a human
    event.demoted()
    for level in (TrustLevel.STOP, TrustLevel.SLOW, TrustLevel.STOP, TrustLevel.CAUTIOUS, TrustLevel.STOP):
        assert not event.human_on_anomaly(Phase.MIXED, level), level  # flickers of the same event
    assert event.human_on_anomaly(Phase.MIXED, TrustLevel.FULL)  # recovered: the next anomaly is new
    assert event.human_on_anomaly(Phase.MIXED, TrustLevel.STOP)
