"""``robot-wm train mixed`` on a running stack (no ``--library``): the real episodes are the live
graph's (policy → safety filter → arm, the trust monitor watching), on the embedded arm with any
profile or on hardware.

* **Before the first round** (``LiveArm.check``): the trust monitor must say MIXED (an operator
  promotes SIM → MIXED with ``robot-wm trust promote``; the run never changes the phase), the
  policy node must run a learned policy that follows the registry (``model_path`` empty, not
  ``scripted``), and ``--base`` must be the task's active set: what the arm runs.
* **A round's real episodes** (``LiveArm.run_episodes``): the policy node's exploration is switched
  on (its ``exploration_*`` parameters from ``config/training.yaml`` ``mixed``: the same rule as the
  library loop, ``robot_wm.core.exploration``), the recorder (``robot_wm.nodes.mixed_recorder``)
  writes one bag per counted episode into ``OUT/real``, and exploration is switched off again.
  While the round trains, the stack goes on running the set in force without exploring.
* **After a round**, its set is registered, **activated** and announced on
  ``/robot_wm/model_update`` (``LiveArm.put_in_force``): the world_model node and the safety filter
  swap its world model in between two periods, the policy node its policy, and the trust monitor
  takes its calibration. The next round waits until the predictions carry the new world model's
  version and the policy node has said it swapped (its log on /rosout). Activation is what lets the
  next round's episodes run the new set; the phase stays MIXED, and ``robot-wm models rollback``
  puts the previous set back.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

from robot_wm.learning.mixed_episodes import MixedConfig, MixedError

READY_TIMEOUT_S = 30.0  # a graph that has said nothing by then is not running
SWAP_TIMEOUT_S = 60.0  # an announced set not running by then: the run stops and says so
LATCH_NOTICE_S = 3.0  # the filter holding the arm this long while the trust level moves: an operator is needed
POLICY_NODE = "/policy"


class LiveArm:
    """The running graph as ``train mixed`` sees it (module docstring)."""

    def __init__(self, task: str, robot: str, cfg: MixedConfig, *, episode_timeout_s: float = 120.0,
                 progress=print) -> None:
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor

        from robot_wm.core.safety import TrustLevel
        from robot_wm.nodes.mixed_recorder import MixedRecorder
        from robot_wm.rosenv import apply_loopback_dds

        apply_loopback_dds()
        self.task, self.robot, self.cfg, self.progress = task, robot, cfg, progress
        self.episode_timeout_s = float(episode_timeout_s)
        self.context = Context()
        rclpy.init(context=self.context)
        self.swapped: list[str] = []
        self.recorder = MixedRecorder(Path("."), task=task, robot=robot, end_level=int(TrustLevel[cfg.end_level]),
                                      context=self.context,
                                      on_episode=lambda p, m: progress(f"real episode {p.name}: "
                                                                       f"{(m.extra['mixed']['ended'] or ('success' if m.success else 'failed'))}"))
        from rcl_interfaces.msg import Log
        from rcl_interfaces.srv import SetParametersAtomically

        from robot_wm.msg import ModelUpdate, WorldModelPrediction
        from robot_wm.nodes.model_swap import UPDATE_QOS, UPDATE_TOPIC

        node = self.recorder
        self.wm_version = ""
        node.create_subscription(WorldModelPrediction, "/robot_wm/prediction", self._on_prediction, 10)
        node.create_subscription(Log, "/rosout", self._on_log, 100)
        self._params = node.create_client(SetParametersAtomically, f"{POLICY_NODE}/set_parameters_atomically")
        self._updates = node.create_publisher(ModelUpdate, UPDATE_TOPIC, UPDATE_QOS)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(node)
        self._spinner = threading.Thread(target=self.executor.spin, name="train_mixed_live", daemon=True)
        self._spinner.start()

    # ---------------------------------------------------------------------------------- inputs
    def _on_prediction(self, msg) -> None:
        self.wm_version = msg.model_version

    def _on_log(self, msg) -> None:
        if msg.name == POLICY_NODE.strip("/") and msg.msg.startswith("policy swapped:"):
            self.swapped.append(msg.msg)

    def _wait(self, predicate, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.05)
        return predicate()

    # ---------------------------------------------------------------------------------- checks
    def check(self, base: Path, resume_set: str | None = None, reason: str = "") -> None:
        """Refuse (MixedError) unless the graph runs ``base``, a learned policy, in the MIXED phase.
        ``resume_set``: the registry version of ``base`` when a run resumes; if the running world_model
        node predicts with another model (a run stopped before its set was in force), it is put in
        force first."""
        from robot_wm.core.onnx_model import read_sidecar, sha256_file
        from robot_wm.registry import Registry

        rec = self.recorder
        if not self._wait(lambda: rec.trust_phase is not None, READY_TIMEOUT_S):
            raise MixedError(f"no TrustState on /robot_wm/trust within {READY_TIMEOUT_S:g} s: is the stack running "
                             f"with its trust monitor (robot-wm up --task {self.task})?")
        if rec.trust_phase != 1:
            name = ("SIM", "MIXED", "REAL")[min(rec.trust_phase, 2)]
            raise MixedError(f"the running stack is in phase {name}: train mixed runs its real episodes in MIXED only "
                             f"(an operator promotes with `robot-wm trust promote`; see `robot-wm trust status`)")
        if not self._wait(rec.policy_known.is_set, READY_TIMEOUT_S):
            raise MixedError(f"the policy node ({POLICY_NODE}) did not answer within {READY_TIMEOUT_S:g} s: is it running?")
        if rec.policy_source == "scripted":
            raise MixedError(f"{POLICY_NODE} runs the scripted baseline: train mixed trains a learned policy")
        if rec.policy_task and rec.policy_task != self.task:
            raise MixedError(f"{POLICY_NODE} runs the {rec.policy_task!r} task, not {self.task!r} (--task)")
        if rec.policy_model_path:
            raise MixedError(f"{POLICY_NODE} runs model_path={rec.policy_model_path!r}: it would not swap in the rounds' "
                             f"policies; start it without model_path (the registry's active set, the default)")
        reg = Registry()
        reg.ensure_shipped()  # a fresh machine: the shipped set, which the nodes run, becomes the active one
        active = reg.active(self.task)
        if active is None:
            raise MixedError(f"no active {self.task} set in the model registry: the stack runs what it was given; "
                             f"register and activate the base first (robot-wm models add/activate)")
        for kind, path in (("policy", active.policy_path), ("world_model", active.world_model_path)):
            if sha256_file(Path(base) / f"{kind}.onnx") != sha256_file(path):
                raise MixedError(f"--base {base}: its {kind} is not the registry's active {self.task} set's "
                                 f"({active.version}), which the running stack runs; activate it first "
                                 f"(robot-wm models activate {self.task} VERSION) or leave --base out")
        self.recorder.in_force = {k: read_sidecar(Path(base) / f"{k}.onnx")["version"] for k in ("policy", "world_model")}
        if resume_set and self._wait(lambda: bool(self.wm_version), READY_TIMEOUT_S) \
                and self.wm_version != self.recorder.in_force["world_model"]:
            # the announcement carries the set's policy too; the policy node swaps it in if it runs another
            self.put_in_force(resume_set, "", reason)
        if not self._params.wait_for_service(timeout_sec=READY_TIMEOUT_S):
            raise MixedError(f"{POLICY_NODE}/set_parameters_atomically did not appear: the exploration cannot be switched on")
        self._set_exploration(0.0)  # a run interrupted while exploring left it on

    # ---------------------------------------------------------------------------------- episodes
    def _set_exploration(self, std: float) -> None:
        from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
        from rcl_interfaces.srv import SetParametersAtomically

        c = self.cfg
        values = (("exploration_std", float(std)), ("exploration_tau_s", float(c.exploration_tau_s)),
                  ("exploration_uncertainty_low_radps", float(c.uncertainty_low_radps)),
                  ("exploration_uncertainty_high_radps", float(c.uncertainty_high_radps)))
        req = SetParametersAtomically.Request(parameters=[
            Parameter(name=n, value=ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=v)) for n, v in values])
        future = self._params.call_async(req)
        if not self._wait(future.done, 10.0) or future.result() is None:
            raise MixedError(f"{POLICY_NODE}: setting its exploration parameters got no answer in 10 s")
        result = future.result().result
        if not result.successful:
            raise MixedError(f"{POLICY_NODE} refused the exploration settings: {result.reason}")

    def run_episodes(self, set_dir: Path, indices: list[int], out: Path, round_index: int, explore: bool = True) -> list[dict]:
        """Record the round's real episodes (``indices``) from the running stack; their summaries."""
        from robot_wm.core.onnx_model import read_sidecar

        rec = self.recorder
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        in_force = {k: read_sidecar(Path(set_dir) / f"{k}.onnx")["version"] for k in ("policy", "world_model")}
        std = self.cfg.exploration_std if explore else 0.0
        self._set_exploration(std)
        rec.start_round(out, indices, round_index, in_force, std)
        try:
            ok = self._wait_round(rec, self.episode_timeout_s * len(indices))
        finally:
            with rec._round_lock:
                rec.indices = []  # nothing more counts until the next round
            self._set_exploration(0.0)
        if rec.error:
            raise MixedError(rec.error)
        if not ok:
            raise MixedError(f"round {round_index}: {len(rec.summaries)} of {len(indices)} real episodes in "
                             f"{self.episode_timeout_s * len(indices):.0f} s (passed over: {rec.passed[-3:]}); is the "
                             f"stack enabled (robot-wm reset) and its trust level reaching FULL?")
        return sorted(rec.summaries, key=lambda e: e["index"])

    def _wait_round(self, rec, timeout_s: float) -> bool:
        """Until the round's bags are written; says so when the arm waits for an operator: trust level
        HUMAN, or the filter holding the arm (a latch) for LATCH_NOTICE_S while the trust level moves."""
        deadline, told, held_since, told_held = time.monotonic() + timeout_s, False, None, False
        while time.monotonic() < deadline and not rec.done.is_set():
            human = rec.trust_level == 4
            if human and not told:
                self.progress("trust level HUMAN: the arm is held until an operator acknowledges (robot-wm trust "
                              "acknowledge) and releases the filter's latch (robot-wm reset); the round goes on after")
            told = human
            held = bool(rec.filter_reason) and rec.trust_level is not None and rec.trust_level <= 1 and not human
            held_since = (held_since or time.monotonic()) if held else None
            if held and not told_held and time.monotonic() - held_since >= LATCH_NOTICE_S:
                self.progress(f"the safety filter holds the arm ({rec.filter_reason}) while the trust level moves: "
                              "an operator checks the arm and releases it (robot-wm reset); the round goes on after")
            told_held = held and (told_held or time.monotonic() - held_since >= LATCH_NOTICE_S)
            time.sleep(0.1)
        return rec.done.is_set()

    # ---------------------------------------------------------------------------------- swaps
    def put_in_force(self, set_version: str, previous: str, reason: str) -> None:
        """Announce the (already activated) registry set ``set_version``; wait until the graph runs it."""
        from robot_wm.core.onnx_model import read_sidecar
        from robot_wm.nodes.trust_swap import announce
        from robot_wm.registry import Registry

        node = self.recorder
        set_dir = Registry().get(self.task, set_version).path
        versions = {k: read_sidecar(Path(set_dir) / f"{k}.onnx") for k in ("world_model", "policy")}
        swaps_before = len(self.swapped)
        policy_before = node.in_force.get("policy")
        announce(node, self._updates, self.task, "activate", reason, previous_set=previous)  # the active set: this one
        if not self._wait(lambda: self.wm_version == versions["world_model"]["version"], SWAP_TIMEOUT_S):
            raise MixedError(f"{set_version} activated, but the world_model node still predicts with {self.wm_version!r} "
                             f"after {SWAP_TIMEOUT_S:g} s (see its log); the registry's active set is {set_version}")
        if versions["policy"]["version"] != policy_before and not self._wait(
                lambda: any(versions["policy"]["version"] in line for line in self.swapped[swaps_before:]), SWAP_TIMEOUT_S):
            raise MixedError(f"{set_version} activated, but {POLICY_NODE} did not say it swapped in policy "
                             f"{versions['policy']['version']} within {SWAP_TIMEOUT_S:g} s (see its log)")
        node.in_force = {k: v["version"] for k, v in versions.items()}
        self.progress(f"the stack runs {set_version} (world model {versions['world_model']['version']}, policy "
                      f"{versions['policy']['version']})")

    def close(self) -> None:
        import rclpy

        try:
            self._set_exploration(0.0)
        except Exception:  # noqa: BLE001 - closing: the graph may be gone
            pass
        self.executor.shutdown(timeout_sec=2.0)
        self.recorder.destroy_node()
        rclpy.shutdown(context=self.context)
