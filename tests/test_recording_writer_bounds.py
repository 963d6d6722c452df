"""What the recording's writer takes from outside (agents' snapshots, the gateway's audit
rows) and what it writes both keep within the reader's bounds
(console/collect/recordings/format.py): whatever the fleet sends, the file reads, and an
update the file cannot hold is left out with a gap event that says so, never the end of the
recording (issue 27)."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from console.collect.recordings import reader as reading
from console.collect.recordings import sink as writing
from console.collect.recordings.format import MAX_INFLATED_FRAME, MAX_TEXT, Diff, NodeStatus, Snap
from console.collect.recordings.reader import KEY, Recording
from console.collect.recordings.sink import Sink
from console.collect.recordings.writer import RecordingWriter

T0 = 1_796_083_200.0
MIB = 2**20


def _nested(depth: int, leaf: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": leaf}
    for _ in range(depth):
        value = {"x": value}
    return value


def _sink(file: Any) -> Sink:
    """The sink, in this process: what `python -m console.collect.recordings.sink` runs."""
    head = {"format": "engineroom-recording", "version": 1, "started": T0, "by": "record",
            "keyframe_s": 20.0, "flush_s": 1.0, "fleet_source": "f", "fleet_text": ""}  # fmt: skip
    return Sink(file, head)


def _bound_both(monkeypatch: pytest.MonkeyPatch, name: str, value: int) -> None:
    """The sink's bound `name` and the reader's, shrunk to `value`: the file is written and
    read under the same bounds."""
    for module in (reading, writing):
        monkeypatch.setattr(module, name, value)


def _gaps(recording: Recording) -> list[str]:
    return [e["message"] for e in recording.events if e["kind"] == "gap"]


def test_a_config_nested_a_thousand_deep_no_longer_ends_the_recording(tmp_path):
    """An agent's engine config may nest as deep as the console decodes. Before: the
    sink's diff of a 900-deep config nested its change 1,800 deep, its encoder raised
    RecursionError, and the sink died: nothing after was recorded; one nested deeper
    than the console's own encoder takes (990) ended the writer's thread the same way.
    Now an update nested deeper than 128 levels is left out with a gap event (a record
    must decode in any reader, whatever its stack), diffs stop at 64 levels, and what
    does not encode is left out too."""
    path = tmp_path / "deep.rec"
    writer = RecordingWriter(path, fleet_text="", flush_s=0.05)
    for i in range(3):
        writer.node("a", {"config": _nested(120, i), "i": i}, "up", None, t=T0 + i)
    writer.node("b", {"config": _nested(900, 0)}, "up", None, t=T0 + 3)
    writer.node("c", {"config": _nested(990, 0)}, "up", None, t=T0 + 4)
    writer.node("d", {"i": 99}, "up", None, t=T0 + 5)
    writer.close()
    recording = Recording(path)
    records = list(recording.records())
    changes = [r for r in records if isinstance(r, Snap | Diff) and r.n == "a"]
    assert len(changes) == 3 and isinstance(changes[-1], Diff)
    assert recording.fleet_at(T0 + 2).nodes["a"]["config"] == _nested(120, 2)
    assert any(isinstance(r, Snap) and r.n == "d" for r in records)  # after: still recorded
    assert [r.n for r in records if isinstance(r, NodeStatus)] == ["a", "d"]
    b, c = _gaps(recording)
    assert b == "an update nested deeper than 128 levels: left out"
    assert c.endswith(": left out")


def test_an_update_over_what_a_record_or_the_pipe_holds_is_left_out_and_said(tmp_path):
    """Before: an 18 MiB snapshot was written as one record, which the reader's 17 MiB
    bound then refuses (the file did not read), and a 65 MiB one made the sink exit
    (`a message of ... bytes; the pipe is broken`): nothing after it was recorded."""
    path = tmp_path / "big.rec"
    writer = RecordingWriter(path, fleet_text="", flush_s=0.05)
    writer.node("a", {"i": 0}, "up", None, t=T0)
    writer.node("big", {"blob": "x" * (18 * MIB)}, "up", None, t=T0 + 1)
    writer.node("huge", {"blob": "y" * (65 * MIB)}, "up", None, t=T0 + 2)
    writer.node("big", {"blob": "small now"}, "up", None, t=T0 + 3)
    writer.node("a", {"i": 4}, "up", None, t=T0 + 4)
    writer.close(timeout=60)
    recording = Recording(path)
    state = recording.fleet_at(T0 + 4)
    assert state.nodes["a"] == {"i": 4}
    assert state.nodes["big"] == {"blob": "small now"}  # written whole, after the gap
    assert "huge" not in state.nodes and state.status["huge"] == ("up", None)
    big, huge = _gaps(recording)
    assert big.startswith("an update of 18,874,") and "17 MiB a record" in big
    assert huge.startswith("an update of 68,157,") and "the 64 MiB the sink takes" in huge


def test_event_fields_from_outside_are_made_what_the_reader_takes(tmp_path):
    """A gateway's audit row may carry any JSON: a `who` that is an object, a `why` that
    is a list, a message of ten thousand characters, a time of NaN. Before, the sink wrote
    them as they came, and the reader then refused the file (or a NaN time put the
    events frame's header out of range)."""
    path = tmp_path / "events.rec"
    writer = RecordingWriter(path, fleet_text="", flush_s=0.05)
    writer.node("a", {"i": 0}, "up", None, t=T0)
    before = time.time()
    hostile = [
        {"t": T0 + 1, "kind": "action", "who": {"name": "alice"}, "why": ["INC", 42],
         "message": "m" * 10_000, "subject": None, "extra": {"x": 1}},
        {"t": math.nan, "kind": "action", "message": "no time"},
        {"t": float("inf"), "kind": 7, "severity": 2},
        {"t": "yesterday", "message": "\x1b[2J"},
    ]  # fmt: skip
    for event in hostile:
        writer.event(event)  # type: ignore[arg-type]
    writer.close()
    events = Recording(path).events
    assert len(events) == 4
    first = next(e for e in events if e["t"] == T0 + 1)
    assert first["who"] == "{'name': 'alice'}" and first["why"] == "['INC', 42]"
    assert len(first["message"]) == MAX_TEXT and first["message"].endswith("\u2026")
    assert "subject" not in first and "extra" not in first
    late = [e for e in events if e["t"] != T0 + 1]
    assert all(e["t"] >= before for e in late)  # an unreadable time is the time it came
    assert {e["kind"] for e in late} == {"action", "7"}


def test_a_second_of_many_updates_is_cut_into_frames_and_blocks_the_reader_takes(tmp_path):
    """40 MiB of snapshots in one second. Before: one frame of 40 MiB, which the reader's
    32 MiB bound for a frame refuses. Now a frame ends at 8 MiB and a block at half its
    64 MiB, and every node reads back."""
    path = tmp_path / "busy.rec"
    with path.open("ab") as file:
        sink = _sink(file)
        for i in range(20):
            sink.take(["node", T0, f"n{i}", "up", None, {"blob": f"{i:02d}" * MIB}])
        sink.flush()
    recording = Recording(path)
    assert max(recording.frames.lengths) < MAX_INFLATED_FRAME
    assert len(recording.blocks) >= 2
    nodes = recording.fleet_at(T0).nodes
    assert sorted(nodes) == sorted(f"n{i}" for i in range(20))
    assert nodes["n7"]["blob"] == "07" * MIB


def test_the_sink_ends_the_file_at_its_bounds_on_events_and_frames(tmp_path, monkeypatch):
    """At its event bound the sink writes one last event that says so and no more; at
    its frame bound it ends the file with an event saying so and writes nothing after.
    The file reads under the same bounds (shrunk here, so that a test reaches them)."""
    _bound_both(monkeypatch, "MAX_EVENTS", 10)
    path = tmp_path / "full.rec"
    with path.open("ab") as file:
        sink = _sink(file)
        for second in range(40):
            t = T0 + second
            sink.take(["node", t, "a", "up", None, {"i": second}])
            sink.take(["event", {"t": t, "kind": "action", "message": f"step {second}"}])
            sink.flush()
    recording = Recording(path)
    assert len(recording.events) == 10
    assert recording.events[-1]["message"].startswith("the recording holds 10 events")
    assert recording.fleet_at(recording.end).nodes["a"]["i"] >= 10
    assert KEY in recording.frames.kinds

    _bound_both(monkeypatch, "MAX_FRAMES", 30)
    path = tmp_path / "frames.rec"
    with path.open("ab") as file:
        sink = _sink(file)
        for second in range(40):
            sink.take(["node", T0 + second, "a", "up", None, {"i": second}])
            sink.flush()
        assert sink.full
    recording = Recording(path)
    assert len(recording.frames) <= 30 and recording.torn is None
    assert recording.events[-1]["message"].startswith("the recording reached its bound of 30")


def test_a_node_name_over_the_bound_is_left_out(tmp_path):
    name = "n" * (MAX_TEXT + 1)
    path = tmp_path / "name.rec"
    with path.open("ab") as file:
        sink = _sink(file)
        sink.take(["node", T0, name, "up", None, {"i": 1}])
        sink.take(["node", T0, "a", "up", "e" * (MAX_TEXT + 5), {"i": 2}])
        sink.flush()
    recording = Recording(path)
    state = recording.fleet_at(T0)
    assert list(state.nodes) == ["a"] and len(state.status["a"][1] or "") == MAX_TEXT
    assert _gaps(recording) == [f"a node name over {MAX_TEXT} characters: left out"]
