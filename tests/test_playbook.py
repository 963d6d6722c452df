"""The incident playbook's plan, without Textual: a real fleet file, the snapshot a real
agent recorded after its drills (tests/fixtures/snapshot-cpu-drills.json, as
tests/test_tui_drills.py uses it), the console's own fleet view over it, and the gateway's
live weights as its admin snapshot reports them."""

from __future__ import annotations

from console.collect import view as fleet_view
from console.collect.playbook import plan
from console.collect.replay import ReplayCollector
from console.core.config import Fleet, parse_fleet
from console.core.snapshot import decode_snapshot
from tests.tui_support import FLEET, ROOT

DRILLS = ROOT / "tests" / "fixtures" / "snapshot-cpu-drills.json"
DRILL_FLEET = FLEET + '\n[drills.tiny-bf16]\nmodel = "tiny"\ndeployment = "tiny-trt"\n'
DRILL_FLEET += 'checkpoint = "/models/tiny"\n'


def playbook(fleet: Fleet, gateway: dict | None = None, model: str = "tiny"):
    recorded = decode_snapshot(DRILLS.read_text())
    collector = ReplayCollector(fleet, {"h200": None, "cpu-1": recorded, "gone": None})
    view = fleet_view.build(fleet, collector.states, fleet.fleet.refresh_s)
    return plan(fleet, model, view, collector.states, gateway)


def test_a_stale_trt_engine_with_a_ready_standby_says_fail_over_next():
    checks = playbook(parse_fleet(DRILL_FLEET))
    assert [(c.name, c.state, c.action) for c in checks] == [
        ("TensorRT-LLM deployment", "failed", None),
        ("vLLM standby", "done", None),
        ("fail over to vLLM", "next", "fail_over"),
        ("rebuild drill", "waiting", None),
        ("fail back to TensorRT-LLM", "waiting", None),
    ]
    assert "REBUILD REQUIRED: " in checks[0].detail
    assert "driver 580.159.04 → 575.57.08" in checks[0].detail
    assert "(no [gateway] declared)" in checks[2].detail


def test_once_the_gateway_moved_the_traffic_the_drill_is_next_even_after_a_passed_run():
    """The recorded drills succeeded, but the engine is stale again: rebuild once more."""
    moved = {"models": {"tiny": {"tiny-trt": {"weight": 0}, "tiny-vllm": {"weight": 100}}}}
    checks = playbook(parse_fleet(DRILL_FLEET), moved)
    states = {c.name: (c.state, c.action) for c in checks}
    assert states["fail over to vLLM"] == ("done", None)
    assert states["rebuild drill"] == ("next", "run_drill")
    assert checks[3].detail.startswith("drill tiny-bf16: last succeeded (")
    assert states["fail back to TensorRT-LLM"] == ("waiting", None)


def test_the_live_weights_win_over_the_declared_ones():
    """Declared: all on Triton. The gateway still says so: nothing moved."""
    same = {"models": {"tiny": {"tiny-trt": {"weight": 100}, "tiny-vllm": {"weight": 0}}}}
    checks = playbook(parse_fleet(DRILL_FLEET), same)
    assert checks[2].state == "next" and "tiny-trt still has weight 100" in checks[2].detail


def test_without_a_drill_for_the_deployment_the_drill_step_is_blocked():
    checks = playbook(parse_fleet(FLEET))
    assert (checks[3].state, checks[3].detail) == ("blocked", "no drill rebuilds tiny-trt")


def test_a_model_not_declared_or_without_both_engines_is_blocked_and_says_why():
    (unknown,) = playbook(parse_fleet(DRILL_FLEET), model="nope")
    assert (unknown.state, unknown.detail) == ("blocked", "nope is not declared in fleet.toml")
    only_trt = FLEET.replace('engine = "vllm"', 'engine = "triton"')
    (one,) = playbook(parse_fleet(only_trt))
    assert one.state == "blocked" and "a vLLM deployment" in one.detail
