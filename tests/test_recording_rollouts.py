"""The gateway's rollouts in a recording (issue 31): a console records a real gateway
while a real rollout starts, is asked to pause, halts, is resumed, halts again and is
aborted, beside a weight change by hand. The recording carries every record as it was
read, and every step and every start, pause, resume, halt and abort with who and why,
once each; the timeline lists them in time order beside the weight change; replay shows
the rollout on the Rollouts screen as it was at the cursor and refuses its keys. What a
recording keeps is bounded, and the bounds are tested at the bound and one past it.

The rollout needs no engine (tests/test_tui_rollouts.py): tiny's deployments and its
node's agent are closed ports, so the gateway's drain finds no other deployment ready and
the rollout halts at its first step. Its baseline phase takes `verify_s` (3 s), so the
recorder sees the step under way.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from console.collect.clients.gateway_client import GatewayClient
from console.collect.recordings.format import MAX_TEXT
from console.collect.recordings.reader import FleetAt, Recording, RecordingError
from console.collect.recordings.recorder import Recorder
from console.collect.recordings.rollouts import (
    DETAILED_STEPS,
    MAX_ROLLOUT_EVENTS,
    MAX_ROLLOUT_STEPS,
    MAX_ROLLOUTS,
    RolloutTracker,
    kept,
)
from console.collect.recordings.timeline import build, markdown
from console.collect.recordings.writer import RecordingWriter
from console.core.config.load import parse_fleet
from console.core.rollouts.plan_file import to_data
from console.core.rollouts.planner import Ask, make_plan
from console.tui.screens.rollouts import RolloutsScreen
from tests.engines.servers import free_port, stop
from tests.test_gateway import ADMIN, Gateway, start_gateway
from tests.test_replay import replay_app
from tests.test_tui_rollouts import SIZE, TOKEN_ENV, fleet_text, shown
from tests.tui_support import until

ALICE_WHY = "kernel 6.8 on \x1b[31mlocal"  # outside text: an escape sequence in a why


def _record(rid: str, steps: int, current: int = 0, events: int = 1) -> dict:
    return {
        "id": rid, "who": "alice", "status": "running", "operation": "restart",
        "current": current, "params": {"plan": {"waves": ["big"] * 3}, "why": "drill"},
        "steps": [
            {"model": "tiny", "deployment": f"tiny-{i}", "node": "n1", "operation": "restart",
             "wave": i + 1, "state": "pending", "phase": None,
             "details": {"baseline": f"weights {i}"}, "baseline": {"ttft_p95_s": 0.1}}
            for i in range(steps)
        ],
        "events": [{"time": 1000.0 + i, "who": "alice", "what": f"e{i}", "why": ""}
                   for i in range(events)],
    }  # fmt: skip


def test_what_a_recording_keeps_of_the_rollouts_is_bounded_at_each_bound(tmp_path: Path):
    at_bound = _record("big", MAX_ROLLOUT_STEPS, current=5_000, events=MAX_ROLLOUT_EVENTS + 50)
    at_bound["error"] = "x" * (MAX_TEXT + 10)
    not_one = {**_record("odd", 1), "current": "the third"}  # not what a record holds
    records = [at_bound, _record("over", MAX_ROLLOUT_STEPS + 1), not_one]
    records += [_record(f"r{i:02}", 2) for i in range(MAX_ROLLOUTS)]
    value, notes = kept(records)

    # The newest MAX_ROLLOUTS listed; the one past the step bound is left out, said.
    assert f"the gateway listed {MAX_ROLLOUTS + 3} rollouts" in notes[0]
    assert value.ids == ["big"] + [f"r{i:02}" for i in range(MAX_ROLLOUTS - 3)]
    assert any("rollout over: 10,001 steps, over the 10,000" in n for n in notes), notes
    assert any(n.startswith("rollout odd: not a rollout record (") for n in notes), notes
    # Each said once in the recording, as a gap.
    tracker = RolloutTracker()
    gaps = tracker.notes(notes, t=2000.0)
    assert [(g["kind"], g["message"]) for g in gaps] == [("gap", n) for n in notes]
    assert tracker.notes(notes, t=2001.0) == []
    big = value.rollouts["big"]
    assert len(big.steps) == MAX_ROLLOUT_STEPS
    # Its last events; texts cut; the plan document not kept, its why is.
    assert len(big.events) == MAX_ROLLOUT_EVENTS and big.events[-1].what == "e249"
    assert big.error is not None and len(big.error) == MAX_TEXT
    assert msgspec.to_builtins(big.params) == {"why": "drill"}
    # Details and figures only near the step under way (the screen lists those).
    near, far = DETAILED_STEPS, DETAILED_STEPS + 1
    assert big.steps[5_000 + near].details and big.steps[5_000 - near].baseline is not None
    assert not big.steps[5_000 + far].details and big.steps[5_000 - far].baseline is None
    assert big.steps[0].deployment == "tiny-0" and big.steps[-1].state == "pending"

    # What the writer writes at the bound reads back whole, typed.
    path = tmp_path / "bound.rec"
    writer = RecordingWriter(path, fleet_text="")
    writer.rollouts(msgspec.to_builtins(value), t=2000.0)
    writer.close()
    moment = Recording(path).fleet_at(2000.0)
    assert moment.rollouts_typed is not None
    assert len(moment.rollouts_typed.rollouts["big"].steps) == MAX_ROLLOUT_STEPS
    assert moment.rollouts_typed.ids == value.ids


def test_a_recording_whose_rollouts_break_the_schema_says_so(tmp_path: Path):
    path = tmp_path / "bad.rec"
    writer = RecordingWriter(path, fleet_text="")
    bad = {"ids": ["a"], "rollouts": {"a": {"id": "a", "status": "running", "current": -1}}}
    writer.rollouts(bad, t=2000.0)
    writer.close()
    with pytest.raises(RecordingError, match=r"not the gateway's rollouts: .*current"):
        Recording(path).fleet_at(2000.0)


async def _read_until(recorder: Recorder, client: GatewayClient, done, what: str) -> dict:
    """Read the gateway's rollouts as a recording console does until `done(record)`."""
    for _ in range(600):
        await recorder.read_actions(client)
        records = recorder._rollouts
        if records and done(records[0]):
            return records[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"the rollout never read {what}: {recorder._rollouts[:1]}")


def _first_read(recording: Recording, status: str) -> float:
    """When the recording first holds the rollout in `status` (as the console read it)."""
    moment = FleetAt(0.0)
    for record in recording.records():
        moment.apply(record)
        typed = moment.rollouts_typed
        if typed is not None and any(r.status == status for r in typed.rollouts.values()):
            return record.t
    raise AssertionError(f"the recording never holds a rollout {status}")


def _steer(gateway: Gateway, rid: str, verb: str, who: str, why: str) -> None:
    answer = gateway.admin("POST", f"/admin/rollouts/{rid}/{verb}", json={"who": who, "why": why})
    assert answer.status_code == 200, answer.text


async def test_a_recorded_rollout_is_on_the_timeline_and_in_replay_with_who_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(TOKEN_ENV, ADMIN)
    port = free_port()
    text = fleet_text(tmp_path, port).replace("verify_s = 0.5", "verify_s = 3")
    fleet = parse_fleet(text)
    gateway = start_gateway(tmp_path, text, port, healthy=False)
    path = tmp_path / "rollout.rec"
    writer = RecordingWriter(path, fleet_text=text, keyframe_s=2)
    recorder = Recorder(writer, 0.5)
    client = GatewayClient(fleet, timeout=5)
    try:
        set_by_hand = gateway.admin("PUT", "/admin/routes/tiny",
                                    json={"weights": {"tiny-a": 60, "tiny-b": 40},
                                          "why": "before the rollout"})  # fmt: skip
        assert set_by_hand.status_code == 200, set_by_hand.text
        await recorder.read_actions(client)  # the recording began: nothing to roll yet
        plan = to_data(make_plan(fleet, Ask(operation="restart", models=["tiny"])))
        body = {"plan": plan, "who": "alice", "why": ALICE_WHY}
        started = gateway.admin("POST", "/admin/rollouts", json=body)
        assert started.status_code == 202, started.text
        rid = started.json()["id"]
        await _read_until(recorder, client, lambda r: r["steps"][0]["phase"] == "baseline",
                          "step 1 in its baseline")  # fmt: skip
        _steer(gateway, rid, "pause", "dave", "look first")
        await _read_until(recorder, client, lambda r: r["status"] == "halted", "halted")
        _steer(gateway, rid, "resume", "carol", "retry the drain")
        await _read_until(recorder, client,
                          lambda r: r["status"] == "halted" and len(r["events"]) >= 5,
                          "halted again")  # fmt: skip
        _steer(gateway, rid, "abort", "bob", "engines are gone")
        await _read_until(recorder, client, lambda r: r["status"] == "aborted", "aborted")
    finally:
        await client.close()
        writer.close()
        stop(gateway.process, grace=5)

    recording = Recording(path)
    rollout_events = [e for e in recording.events if e["kind"] == "rollout"]
    said = [(e["message"].split(": ", 1)[1], e.get("who"), e.get("why")) for e in rollout_events]
    halts = [e for e in rollout_events if e["message"].endswith(": halted")]
    halted = halts[0]
    expected = [
        ("started", "alice", ALICE_WHY),
        ("pause asked", "dave", "look first"),
        ("halted", "gateway", halted["why"]),
        ("resumed", "carol", "retry the drain"),
        ("halted", "gateway", halts[-1]["why"]),
        ("aborted", "bob", "engines are gone"),
    ]
    steered = {what for what, _, _ in expected}
    assert [s for s in said if s[0] in steered] == expected, said
    assert len(halts) == 2 and halts[-1]["why"].startswith("step 1 (tiny-a): drain: ")
    assert halted["why"].startswith("step 1 (tiny-a): drain: ") and halted["severity"] == "critical"
    # Each step's progress, with the rollout's who and why: its baseline under way, then
    # done with what it found and the drain begun.
    steps = [e for e in rollout_events if e["subject"] == "tiny/tiny-a"]
    assert steps[0]["message"].endswith(
        "step 1 of 2, wave 1: restart tiny-a on local: baseline under way"
    ), steps
    assert any(": baseline done: weights " in e["message"] for e in steps), steps
    assert all((e["who"], e["why"]) == ("alice", ALICE_WHY) for e in steps)
    # Said once: the gateway's audit rows of the same events are not written again.
    audited = [e for e in recording.events if e["message"].startswith("gateway: ")]
    assert [e["message"] for e in audited] == ["gateway: routes set: tiny-a=60 tiny-b=40"]

    # The timeline: the weight change by hand, then the rollout, in time order.
    entries = build(recording, recording.start - 60)
    whats = [(e.kind, e.what) for e in entries if e.kind in ("action", "rollout")]
    assert whats[0] == ("action", "gateway: routes set: tiny-a=60 tiny-b=40"), whats
    assert [e.t for e in entries] == sorted(e.t for e in entries)
    rows = [e for e in entries if e.kind == "rollout"]
    assert [e.what for e in rows] == [e["message"] for e in rollout_events]
    # Its baseline's end, seen only once the step had halted, is listed before the halt.
    order = [e.what.rsplit(": ", 1)[-1] if e.subject.startswith("rollout") else "step"
             for e in rows]  # fmt: skip
    assert order == ["started", "step", "pause asked", "step", "halted", "resumed", "halted",
                     "aborted"], [e.what for e in rows]  # fmt: skip
    assert all(e.p95.keys() == {"tiny"} for e in rows)
    page = markdown(recording, entries, recording.start - 60, recording.end)
    aborted = f"| rollout (warning) | rollout {rid} | rollout {rid} (restart of tiny): aborted |"
    assert f"{aborted} bob | engines are gone |" in page
    assert "kernel 6.8 on \\\\x1b\\[31mlocal" in page and "\x1b" not in page  # made safe

    # Replay: the Rollouts screen as the recording had it at the cursor; no key acts.
    app = replay_app(path, at=_first_read(recording, "halted"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("o")
        await until(pilot, lambda: isinstance(app.screen, RolloutsScreen), what="Rollouts")
        screen = await until(pilot, lambda: "HALTED" in shown(app) and shown(app),
                             what="the halted rollout, as recorded then")  # fmt: skip
        assert rid in screen and "by alice" in screen
        assert "why: kernel 6.8 on \\x1b[31mlocal" in screen and "\x1b" not in screen
        assert "step 1 of 2, wave 1: tiny-a (tiny on local)  halted, phase drain" in screen
        assert "read-only console" in screen
        await pilot.press("p", "r", "A")
        await until(pilot, lambda: len(app.refused) == 3, what="the three refusals")
        assert app.refused == ["pausing a rollout", "resuming a rollout", "aborting a rollout"]
        app.jump_to(str(recording.end))
        await until(pilot, lambda: "ABORTED" in shown(app), what="aborted at the end")
        assert "aborted by bob: engines are gone" in shown(app)
