"""`engineroom replay`: the console on a recording, read-only, with a time cursor.

The recording here is written by the real RecordingWriter from snapshots that real agents
printed (tests/fixtures, docs/evidence), at fixed times, so the screens render the same
every run. The recording of a live fleet (real agents, a failover, a drill) is replayed
in tests/test_timeline.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.text import Text

from console.collect.recordings.reader import Recording
from console.collect.recordings.replay import ReplayCollector, fleet_of
from console.collect.recordings.writer import RecordingWriter
from console.tui.replay import ReplayApp
from console.tui.screens.base import ViewScreen
from console.tui.widgets.header import FleetHeader
from console.tui.widgets.table import FleetTable
from console.tui.widgets.time_cursor import TimeCursor, clock
from tests.tui_support import CPU, FLEET, H200, keys, until

T0 = 1_796_083_200.0  # 2026-12-01 00:00:00 UTC
SIZE = (110, 30)


def _gateway(trt: int, vllm: int) -> dict:
    return {
        "models": {
            "tiny": {
                "tiny-trt": {"weight": trt, "up": True, "ttft_s": {"p95": 0.0921, "count": 40}},
                "tiny-vllm": {"weight": vllm, "up": True, "ttft_s": {"p95": 0.0547, "count": 40}},
            }
        }
    }


def write_incident(path: Path) -> Path:
    """60 s of the recorded fleet: an alert at +10 s, a failover step (by alice, with her
    reason) at +20 s that moves tiny's weight to vLLM, the alert cleared at +30 s; the
    node "gone" never answers."""
    h200 = json.loads(H200.read_text())
    cpu = json.loads(CPU.read_text())
    writer = RecordingWriter(path, fleet_text=FLEET, fleet_source="fleet.toml", keyframe_s=20)
    for second in range(61):
        t = T0 + second
        for name, snap in (("h200", h200), ("cpu-1", cpu)):
            snap = {**snap, "node": {**snap["node"], "time": t}}
            writer.node(name, snap, "up", None, t=t)
        writer.node("gone", None, "down", "connection refused", t=t)
        writer.gateway(_gateway(100, 0) if second < 20 else _gateway(0, 100), t=t)
    events = [
        (10, "raised", "critical", "tiny/tiny-trt", "TTFT p95 900 ms over the SLO 500 ms", {}),
        (20, "action", "info", "tiny", "gateway: routes set: tiny-trt=0 tiny-vllm=100",
         {"who": "alice", "why": "failover 1a2b: shift 100% (trt p95 over SLO)"}),
        (30, "cleared", "critical", "tiny/tiny-trt", "TTFT p95 900 ms over the SLO 500 ms", {}),
    ]  # fmt: skip
    for second, kind, severity, subject, message, extra in events:
        writer.event(
            {"t": T0 + second, "kind": kind, "severity": severity, "subject": subject,
             "message": message, **extra}
        )  # fmt: skip
    writer.close()
    return path


@pytest.fixture
def incident(tmp_path: Path) -> Path:
    return write_incident(tmp_path / "incident.rec")


def replay_app(path: Path, at: float | None = None) -> ReplayApp:
    recording = Recording(path)
    fleet = fleet_of(recording)
    app = ReplayApp(fleet, ReplayCollector(fleet, recording=recording, at=at))
    # Every notification the console gave, kept (Textual drops them after their timeout).
    said: list[str] = []
    shown = app.notify

    def notify(message: str, **kw: Any) -> None:
        said.append(message)
        shown(message, **kw)

    app.notify = notify  # type: ignore[method-assign]
    app.said = said  # type: ignore[attr-defined]
    return app


def _cell(app: ReplayApp, key: str, column: str) -> str:
    """The cell of the column labelled `column` (those the terminal's width holds)."""
    table = app.screen.query_one(FleetTable)
    row = table.rows_by_key[key]
    cells = row.cells() if callable(row.cells) else row.cells
    cell = cells[[c.label.plain for c in table.ordered_columns].index(column)]
    return cell.plain if isinstance(cell, Text) else str(cell)


def _notes(app: ReplayApp) -> list[str]:
    return list(app.said)  # type: ignore[attr-defined]


def _drawn(app: ReplayApp, at: float, before: object = None, row: str | None = None) -> bool:
    """The screen on top (another than `before`) has drawn the moment `at`: its header
    names it and that time, its time cursor is laid out to its width at that time (the
    cursor is drawn at the refresh after a screen opens), and its table has `row`."""
    screen = app.screen
    if not isinstance(screen, ViewScreen) or not screen.is_mounted or screen is before:
        return False
    headers, cursors = screen.query(FleetHeader), screen.query(TimeCursor)
    if not headers or not cursors:
        return False
    line, cursor = str(headers.first().render()), cursors.first()
    if screen.where not in line or clock(at) not in line:
        return False
    bar, _, said = str(cursor.render()).partition("\n")
    if clock(at) not in said or len(bar) != cursor.size.width - 1:
        return False
    return row is None or any(row in t.rows_by_key for t in screen.query(FleetTable))


WEIGHT = "W"  # the Models table's weight column


async def test_the_cursor_moves_through_the_incident_and_every_screen_shows_that_moment(
    incident,
):
    app = replay_app(incident)
    async with app.run_test(size=(200, 30)) as pilot:  # wide enough for Models' W column
        await until(pilot, lambda: _drawn(app, T0), what="the fleet at the start")
        assert app.replay_label() == "2026-12-01 00:00:00 UTC"
        fleet = app.screen
        await pilot.press(*keys(":models\r"))
        await until(
            pilot, lambda: _drawn(app, T0, fleet, "d:tiny:tiny-trt"), what="Models at the start"
        )
        assert _cell(app, "d:tiny:tiny-trt", WEIGHT) == "100"

        await pilot.press("right_square_bracket")  # the alert
        assert app.replay.at == T0 + 10
        await pilot.press("right_square_bracket")  # alice's failover step
        await until(
            pilot, lambda: _drawn(app, T0 + 20, row="d:tiny:tiny-trt"), what="Models at +20 s"
        )
        assert app.replay.at == T0 + 20
        assert app.replay_label() == "2026-12-01 00:00:20 UTC"
        # The Models screen at the moment of the failover: the weights of that moment.
        assert _cell(app, "d:tiny:tiny-trt", WEIGHT) == "0"
        assert _cell(app, "d:tiny:tiny-vllm", WEIGHT) == "100"
        said = [n for n in _notes(app) if "by alice: gateway: routes set" in n]
        assert said and "(failover 1a2b" in said[0], _notes(app)

        models = app.screen
        await pilot.press("v")
        await until(pilot, lambda: _drawn(app, T0 + 20, models), what="Events at +20 s")
        shown = [(e.kind, e.subject) for e in app.events.events]
        assert shown == [("action", "tiny"), ("raised", "tiny/tiny-trt")]  # not yet cleared

        await pilot.press("left_square_bracket", "left_square_bracket")  # back to the start
        await pilot.press("left_square_bracket")
        assert app.replay.at == T0 + 10
        await pilot.press(*keys(":at 00:00:05\r"))
        await until(pilot, lambda: _drawn(app, T0 + 5), what="Events at +5 s")
        assert app.replay.at == T0 + 5 and list(app.events.events) == []
        events = app.screen
        await pilot.press("m")
        await until(
            pilot, lambda: _drawn(app, T0 + 5, events, "d:tiny:tiny-trt"), what="Models at +5 s"
        )
        assert _cell(app, "d:tiny:tiny-trt", WEIGHT) == "100"

        await pilot.press(*keys(":at +0:45\r"), "full_stop", "full_stop", "comma")
        assert app.replay.at == pytest.approx(T0 + 45 + app.refresh_s)
        await pilot.press(*keys(":at half past\r"))
        assert any("cannot read 'half past' as a time" in n for n in _notes(app))

        # Every screen draws at the cursor: nodes, GPUs, a node, a model, jobs, drills.
        for typed in (":nodes\r", ":gpus\r", ":node cpu-1\r", ":model tiny\r", ":jobs\r", "d"):
            before = app.screen
            await pilot.press(*keys(typed))
            await until(
                pilot, lambda b=before: _drawn(app, app.replay.at, b), what=f"{typed!r} drawn"
            )
        assert app.replay.states["gone"].error == "connection refused"
        assert app.replay.states["cpu-1"].status(app.refresh_s) == "up"


async def test_playing_moves_the_cursor_at_the_chosen_speed_and_stops_at_the_end(incident):
    app = replay_app(incident, at=T0 + 50)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("greater_than_sign", "greater_than_sign")
        assert app.speed == 60
        await pilot.press("space")
        # 10 s of recording at 60x: a fraction of a second (at 1x it would take 10 s, so
        # the bound is part of what is tested).
        await until(pilot, lambda: not app.playing, timeout=5, what="the play at the end")
        assert not app.playing and app.replay.at == app.replay.last == T0 + 60


async def test_action_keys_say_replay_is_read_only(incident):
    app = replay_app(incident)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: _drawn(app, T0), what="the fleet at the start")
        fleet = app.screen
        await pilot.press(*keys(":models\r"))
        await until(pilot, lambda: _drawn(app, T0, fleet), what="Models")
        await pilot.press("s", "f", "R")
        models = app.screen
        await pilot.press(*keys(":node cpu-1\r"))
        await until(pilot, lambda: _drawn(app, T0, models), what="the node")
        await pilot.press("s", "x", "r")
        await pilot.press(*keys(":start\r"))

        def refused() -> int:
            return sum(n.startswith("replay is read-only") for n in _notes(app))

        await until(pilot, lambda: refused() >= 7, what="the seven refusals")
        said = [n for n in _notes(app) if n.startswith("replay is read-only")]
        assert len(said) == 7, _notes(app)
        # No form, plan or confirmation opened: the Node screen is still on top.
        assert type(app.screen).__name__ == "NodeScreen" and len(app.screen_stack) == 4
        # A job's screen asks no agent (theirs would refuse the connection): the recording.
        node = app.screen
        await pilot.press(*keys(":job cpu-1/4f2a\r"))
        await until(
            pilot,
            lambda: (
                _drawn(app, T0, node) and str(app.screen.query_one("#job-info").render()).strip()
            ),
            what="the job's screen",
        )
        info = app.screen.query_one("#job-info")
        assert "not in the recording at this moment" in str(info.render())
        await pilot.press("c")
        assert _notes(app)[-1].startswith("replay is read-only")


def test_replay_header_and_time_cursor(snap_compare, incident):
    """REPLAY and the replayed time where the live console shows its environment; the
    cursor with the alert, the action and the clearing marked."""
    app = replay_app(incident, at=T0 + 15)

    async def settle(pilot) -> None:
        await until(pilot, lambda: _drawn(app, T0 + 15, row="h200"), what="the fleet at +15 s")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=settle)


def test_time_cursor_playing_at_ten_times_on_models(snap_compare, incident):
    app = replay_app(incident, at=T0 + 20)

    async def models(pilot) -> None:
        fleet = app.screen
        await pilot.press(*keys(":models\r"), "greater_than_sign")
        await until(
            pilot,
            lambda: (
                _drawn(app, T0 + 20, fleet, "d:tiny:tiny-trt")
                and " 10×" in str(app.screen.query_one(TimeCursor).render())
            ),
            what="Models at +20 s, at 10x",
        )
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=models)


async def test_replay_opens_where_the_data_starts_and_says_there_is_none_before(tmp_path):
    """Issue 28 #3: a recording started at 07:23:18 opened replay at 07:19:02, the time of
    an audited action older than the recording, with every node "down"."""
    # The gateway's audit log, read as the recording began, holds an older action.
    early = tmp_path / "early.rec"
    writer = RecordingWriter(early, fleet_text=FLEET, fleet_source="fleet.toml", keyframe_s=20)
    writer.event({"t": T0 - 256, "kind": "action", "severity": "info", "subject": "tiny",
                  "message": "gateway: routes set: tiny-trt=100", "who": "bob"})  # fmt: skip
    h200 = json.loads(H200.read_text())
    for second in range(5):
        t = T0 + second
        writer.node("h200", {**h200, "node": {**h200["node"], "time": t}}, "up", None, t=t)
        writer.node("cpu-1", None, "down", "connection refused", t=t)
        writer.node("gone", None, "down", "connection refused", t=t)
    writer.close()
    recording = Recording(early)
    assert recording.start == T0  # not the older action's time
    assert any(e["t"] == T0 - 256 for e in recording.events)  # which is kept
    app = replay_app(early)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.replay.at == T0
        assert app.view is not None and app.view.summary.nodes_up == 1
        await pilot.press("t")
        from console.tui.widgets.command_line import CommandLine

        hint = app.screen.query_one(CommandLine).input.placeholder
        assert hint.startswith("00:00:00 to 00:00:04 (UTC), 2026-12-01 00:00:00"), hint
        assert "+1:30 from the start" in hint  # a form parse_time reads ("+90s" was not)
        await pilot.press(*keys("2026-11-30 23:50:00"), "enter")
        await pilot.pause()
        assert any("no data before the recording" in n for n in _notes(app)), _notes(app)
        assert app.replay.at == T0


def test_replay_opens_once_every_node_was_read_and_never_invents_an_error(tmp_path):
    """Seen in tmux on the demo's recording: replay opened on the first node's answer, 26 ms
    before the other three's, and showed those three "down: connection refused", an error
    nobody recorded."""
    path = tmp_path / "round.rec"
    writer = RecordingWriter(path, fleet_text=FLEET, fleet_source="fleet.toml", keyframe_s=20)
    h200, cpu = json.loads(H200.read_text()), json.loads(CPU.read_text())
    for second in range(3):
        t = T0 + second
        writer.node("h200", {**h200, "node": {**h200["node"], "time": t}}, "up", None, t=t)
        t += 0.026
        writer.node("cpu-1", {**cpu, "node": {**cpu["node"], "time": t}}, "up", None, t=t)
        writer.node("gone", None, "down", "connection refused", t=t)
    writer.close()
    recording = Recording(path)
    assert recording.start == T0 and recording.first_round() == T0 + 0.026
    replay = ReplayCollector(fleet_of(recording), recording=recording)
    assert replay.at == T0 + 0.026
    view_at_open = {n: (s.snapshot is not None, s.error) for n, s in replay.states.items()}
    assert view_at_open == {
        "h200": (True, None), "cpu-1": (True, None), "gone": (False, "connection refused")
    }  # fmt: skip
    # Stepped back to the first answer: cpu-1 is not in the recording yet: unknown.
    replay.move_to(T0)
    assert (replay.states["cpu-1"].snapshot, replay.states["cpu-1"].error) == (
        None, "not recorded yet"
    )  # fmt: skip
    assert replay.states["cpu-1"].failures == 0  # unknown, counted unseen, never "down"
