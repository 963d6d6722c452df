"""The recording file: a real `engineroom record` killed with SIGKILL leaves a file that
replays; a writer whose disk stops taking writes drops and counts, never blocks; a torn
tail ends the recording cleanly wherever it was cut."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from console.collect.recordings.format import Change, Diff, Record, Snap
from console.collect.recordings.reader import (
    EVENTS,
    HEADER,
    KEY,
    MORE,
    Cursor,
    Recording,
    RecordingError,
    diff,
    patch,
)
from console.collect.recordings.replay import ReplayCollector, fleet_of
from console.collect.recordings.writer import RecordingWriter
from tests.conftest import ROOT, agent_env, run_cli
from tests.engines.servers import free_port, log_tail, stop, wait_until
from tests.support.fleet import fleet_toml


def fleet_text(state: Path, port: int) -> str:
    """Node "local": a real agent on `port`, its state in `state`, read every 0.5 s."""
    return fleet_toml(
        fleet={"name": "recorded-live", "refresh_s": 0.5},
        agent={"state_dir": state, "scrape_interval_s": 0.5},
        nodes=[{"name": "local", "agent": f"http://127.0.0.1:{port}",
                "token_env": "ENGINEROOM_TEST_VIEWER"}],
    )  # fmt: skip


def _records(path: Path) -> list[Record]:
    return list(Recording(path).records())


def test_a_recorder_killed_with_sigkill_leaves_a_file_that_replays(agent_factory, tmp_path):
    port = free_port()
    agent = agent_factory(fleet_text(tmp_path / "state", port), "local", port)
    out = tmp_path / "night.rec"
    log = tmp_path / "record.log"
    env = agent_env(ENGINEROOM_TEST_VIEWER="viewer-token-0123")
    with log.open("wb") as sink:
        recorder = subprocess.Popen(
            [sys.executable, "-m", "console.cli", "record", "--fleet", str(agent.fleet),
             "--out", str(out)],
            stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True,
        )  # fmt: skip
    try:

        def snapshots_written() -> int | None:
            if recorder.poll() is not None:
                raise RuntimeError(f"record exited {recorder.returncode}: {log_tail(log)}")
            if not out.exists() or out.stat().st_size == 0:
                return None
            n = sum(
                1
                for r in _records(out)
                if isinstance(r, Diff) or (isinstance(r, Snap) and not r.key)
            )
            return n if n >= 6 else None

        wait_until(snapshots_written, 90, interval=0.3, what="six snapshots recorded")
        killed_at = time.time()
        os.killpg(recorder.pid, signal.SIGKILL)
        recorder.wait(10)
    finally:
        stop(recorder, grace=1)

    recording = Recording(out)
    # Flushed each second: what came more than a second (and the agent's half-second
    # cycle, and a loaded machine's scheduling) before the kill is in the file.
    assert recording.end >= killed_at - 3.0, (recording.end, killed_at)
    assert recording.head["by"] == "record"
    frames = [f.kind for f in recording.frames]
    assert KEY in frames
    # The file carries its fleet: the replay needs nothing else, and shows the node as it was.
    fleet = fleet_of(recording)
    replay = ReplayCollector(fleet, recording=recording, at=recording.end)
    snap = replay.states["local"].snapshot
    assert snap is not None and snap.node.name == "local"
    assert abs(snap.node.time - recording.end) < 3.0
    early = ReplayCollector(fleet, recording=recording, at=recording.start + 0.6)
    late_time = snap.node.time
    early_snap = early.states["local"].snapshot
    assert early_snap is not None and early_snap.node.time < late_time

    # A kill in the middle of a frame: cut the file at every byte of its last frame; the
    # reader keeps every whole frame before the cut and says what it left out.
    data = out.read_bytes()
    last = recording.frames[-1]
    cut_file = tmp_path / "cut.rec"
    whole = len(recording.frames) - 1
    begins = last.offset - HEADER.size
    for cut in range(begins + 1, len(data), max(1, (len(data) - begins) // 40)):
        cut_file.write_bytes(data[:cut])
        torn = Recording(cut_file)
        assert len(torn.frames) == whole, cut
        assert torn.torn is not None and f"at byte {begins}: {cut - begins} bytes" in torn.torn


def test_a_writer_whose_disk_stops_drops_and_counts_and_never_blocks(tmp_path):
    """A FIFO nobody reads stands for a disk that stopped taking writes: the sink blocks
    in write(), the pipe to it fills, the writer's thread waits on it, and the console's
    queue fills to its limit; from then on every put returns at once, refused and
    counted. Once the writes go through again the file says how many were lost."""
    fifo = tmp_path / "stalled.rec"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = RecordingWriter(fifo, fleet_text="", flush_s=0.05, queue_limit=20)
    assert writer.node("n0", {"blob": os.urandom(200_000).hex()}, "up", None)

    def pipe_full() -> bool:
        waiting = bytearray(4)
        fcntl.ioctl(reader, termios.FIONREAD, waiting)
        return int.from_bytes(waiting, sys.byteorder) > 60_000

    wait_until(pipe_full, 30, interval=0.02, what="the sink blocked on a full disk")
    accepted = 0
    for i in range(1, 5000):  # the pipe to the sink holds a few hundred, the queue 20
        if not writer.node(f"n{i}", {"i": i}, "up", None):
            break
        accepted += 1
    assert writer.dropped == 1
    assert [writer.node("late", {"i": -1}, "up", None) for _ in range(10)] == [False] * 10
    assert writer.dropped == 11 and writer._queue.qsize() == 20

    drained = bytearray()
    done = threading.Event()

    def drain() -> None:
        os.set_blocking(reader, True)
        while chunk := os.read(reader, 1 << 20):
            drained.extend(chunk)
        done.set()

    threading.Thread(target=drain, daemon=True).start()
    writer.close(timeout=30)
    assert done.wait(30)
    os.close(reader)
    copy = tmp_path / "copy.rec"
    copy.write_bytes(bytes(drained))
    recording = Recording(copy)
    assert recording.torn is None
    nodes = {r.n for r in recording.records() if isinstance(r, Snap)}
    assert nodes == {f"n{i}" for i in range(accepted + 1)}  # nothing accepted is lost
    gaps = [e for e in recording.events if e["kind"] == "gap"]
    assert [g["message"] for g in gaps] == ["11 updates dropped: the recording queue was full"]


def test_seek_anywhere_matches_reading_from_the_start(tmp_path):
    """Keyframes every 2 s, diffs between: the state at any moment is the same whether
    the cursor jumps there or plays there from the first frame."""
    path = tmp_path / "seek.rec"
    writer = RecordingWriter(path, fleet_text="", keyframe_s=2.0, flush_s=0.05)
    t0 = 1_700_000_000.0
    for i in range(100):
        gpus = [{"index": g, "util": (i * 7 + g) % 100} for g in range(4)]
        extra = {"extra": 1} if i % 3 else {}
        writer.node("a", {"gpus": gpus, "i": i, **extra}, t=t0 + i * 0.1)
        if i % 10 == 0:
            writer.gateway({"models": {"m": {"d1": {"weight": i}}}}, t=t0 + i * 0.1)
        if i % 5 == 4:  # let a frame end, so that blocks hold several
            wait_until(_wrote_more(writer), 10, 0.01, what="a frame")
    writer.close()
    recording = Recording(path)
    assert len(recording.blocks) >= 4
    player = Cursor(recording, recording.start)
    for i in range(0, 100, 7):
        t = t0 + i * 0.1 + 0.01
        player.advance(t)
        jumped = recording.fleet_at(t)
        assert jumped.nodes == player.state.nodes
        assert jumped.nodes["a"]["i"] == i
        assert jumped.gateway == {"models": {"m": {"d1": {"weight": i // 10 * 10}}}}
    kinds = {f.kind for f in recording.frames}
    assert {KEY, MORE} <= kinds and EVENTS not in kinds


def _wrote_more(writer: RecordingWriter) -> Callable[[], bool]:
    written = writer.written_bytes
    return lambda: writer.written_bytes > written


def test_diff_and_patch_round_trip():
    old = {"a": 1, "gpus": [{"u": 1}, {"u": 2}], "gone": {"x": 1}, "list": [1, 2]}
    new = {"a": 2, "gpus": [{"u": 1}, {"u": 3}], "list": [1, 2, 3], "added": None}
    change = diff(old, new)
    assert change is not None and patch(old, msgspec.convert(change, Change)) == new
    assert json.dumps(change).count("gpus") == 1 and '"u": 1' not in json.dumps(change)
    assert diff(new, new) is None


def test_bad_files_and_arguments_say_what_and_where(tmp_path):
    foreign = tmp_path / "notes.txt"
    foreign.write_text("not a recording\n")
    with pytest.raises(RecordingError, match=r"notes\.txt: not an engineroom recording"):
        Recording(foreign)
    result = run_cli("timeline", str(foreign))
    assert result.returncode == 2
    assert "engineroom timeline:" in result.stderr and "notes.txt" in result.stderr
    result = run_cli("record", "--fleet", str(ROOT / "fleet.toml"), "--out", str(foreign))
    assert result.returncode == 2 and "already exists; record into a new file" in result.stderr
    assert foreign.read_text() == "not a recording\n"  # nothing lost
    result = run_cli("record", "--fleet", str(ROOT / "fleet.toml"), "--for", "ten minutes")
    assert result.returncode == 2 and "--for 'ten minutes'" in result.stderr


async def test_the_console_records_what_it_sees(agent_factory, tmp_path, monkeypatch):
    """`engineroom --record FILE`: the console's own snapshots and alerts go to a file a
    replay opens; leaving the console ends the file cleanly."""
    from console.core.config.load import load_fleet
    from console.tui.app import EngineroomApp
    from tests.tui_support import until

    port = free_port()
    agent = agent_factory(fleet_text(tmp_path / "state", port), "local", port)
    monkeypatch.setenv("ENGINEROOM_TEST_VIEWER", "viewer-token-0123")
    # A second node that never answers: its "node down" alert is in the recording.
    text = agent.fleet.read_text() + '\n[[nodes]]\nname = "gone"\nagent = "http://127.0.0.1:9"\n'
    fleet_file = tmp_path / "console.toml"
    fleet_file.write_text(text)
    out = tmp_path / "console.rec"
    app = EngineroomApp(load_fleet(fleet_file), record=out)
    async with app.run_test(size=(100, 30)) as pilot:

        def recorded() -> bool:
            if not out.exists():
                return False
            recording = Recording(out)
            snaps = [r for r in recording.records() if isinstance(r, Snap | Diff)]
            return len(snaps) >= 3 and any(
                "node down" in e["message"] and e["subject"] == "gone" for e in recording.events
            )

        await until(pilot, recorded, timeout=60, what="the console's recording")
    recording = Recording(out)
    assert recording.torn is None and recording.head["by"] == "console"
    down = next(e for e in recording.events if e["subject"] == "gone")
    # Down from the start: it was raised before the recording began (issue 28 #3).
    assert down["kind"] == "active" and "node down" in down["message"]
    replay = ReplayCollector(fleet_of(recording), recording=recording, at=recording.end)
    assert replay.states["local"].snapshot is not None
    assert replay.states["gone"].snapshot is None


def test_alerts_live_when_recording_starts_are_active_at_start_and_later_ones_raised(
    agent_factory, tmp_path
):
    """Issue 28 #3: the timeline listed alerts active for 15 minutes as "alert raised" at
    the recording's first second. A node down from the start is "active at start"; one
    that goes down while recording is "alert raised"."""
    port = free_port()
    agent = agent_factory(fleet_text(tmp_path / "state", port), "local", port)
    fleet = tmp_path / "console.toml"
    fleet.write_text(
        agent.fleet.read_text() + '\n[[nodes]]\nname = "gone"\nagent = "http://127.0.0.1:9"\n'
    )
    out = tmp_path / "night.rec"
    log = tmp_path / "record.log"
    env = agent_env(ENGINEROOM_TEST_VIEWER="viewer-token-0123")
    with log.open("wb") as sink:
        recorder = subprocess.Popen(
            [sys.executable, "-m", "console.cli", "record", "--fleet", str(fleet),
             "--out", str(out)],
            stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True,
        )  # fmt: skip

    def events() -> list[dict]:
        if recorder.poll() is not None:
            raise RuntimeError(f"record exited {recorder.returncode}: {log_tail(log)}")
        return Recording(out).events if out.exists() and out.stat().st_size else []

    try:
        wait_until(lambda: any(e["subject"] == "gone" for e in events()), 60, what="gone recorded")
        stop(agent.process, grace=5)  # "local" goes down while the recording runs
        wait_until(lambda: any(e["subject"] == "local" for e in events()), 60, what="local down")
        recorder.send_signal(signal.SIGTERM)
        recorder.wait(30)
    finally:
        stop(recorder, grace=1)
    kinds = {e["subject"]: e["kind"] for e in Recording(out).events if e["kind"] != "action"}
    assert kinds == {"gone": "active", "local": "raised"}, kinds
    timeline = run_cli("timeline", str(out))
    assert timeline.returncode == 0, timeline.stderr
    lines = timeline.stdout.splitlines()
    assert any("alert active at start" in x and "gone" in x for x in lines), timeline.stdout
    assert any("alert raised" in x and "local" in x for x in lines), timeline.stdout


def test_what_the_first_view_after_every_node_was_read_raises_was_active_at_start(tmp_path):
    """The console's recording of a node down from the start read "alert raised" when its
    first full view came later than a refresh after the nodes' first reads (a loaded CI
    machine); and a node not read yet (status "unknown") counted as read."""
    from console.collect.recordings.recorder import Recorder
    from console.collect.sources.collector import NodeState
    from console.collect.views.alerts import Event, EventLog

    out = tmp_path / "start.rec"
    writer = RecordingWriter(out, fleet_text="", fleet_source="fleet.toml")
    recorder = Recorder(writer, refresh_s=0.5, nodes=["local", "gone"])
    log = EventLog()

    def raised(subject: str, at: float) -> None:
        log.events.appendleft(Event(at, "raised", "critical", subject, "node down"))
        recorder.alerts(log)

    recorder.node_updated(NodeState("local", "agent"))  # not read yet: "unknown"
    recorder.node_updated(NodeState("gone", "agent", failures=1, error="connection refused"))
    assert recorder._warm_at is None  # "local" has not answered yet
    recorder.node_updated(NodeState("local", "agent", failures=1, error="timed out"))
    assert recorder._warm_at is not None
    raised("gone", recorder._warm_at + 5)  # the first view, 5 s late
    raised("local", recorder._warm_at + 6)  # a later one: raised while recording
    writer.close()
    kinds = {e["subject"]: e["kind"] for e in Recording(out).events}
    assert kinds == {"gone": "active", "local": "raised"}


def test_a_diagnosis_is_recorded_as_raised_verified_and_resolved_and_the_timeline_says_so(
    tmp_path,
):
    """What the console names goes into the recording as it changes: raised (or active at
    start), verifying the move made for it, resolved or still there, gone; the timeline
    lists each with its subject, and hostile text reaches the Markdown only escaped."""
    from console.collect.recordings import timeline
    from console.collect.recordings.recorder import Recorder
    from console.collect.sources.collector import NodeState
    from console.core import diagnosis as d
    from console.core.diagnosis import Diagnosis, Evidence

    out = tmp_path / "diag.rec"
    writer = RecordingWriter(out, fleet_text="", fleet_source="fleet.toml")
    recorder = Recorder(writer, refresh_s=0.5, nodes=["local"])
    recorder.node_updated(NodeState("local", "agent", failures=1, error="timed out"))
    warm = recorder._warm_at
    assert warm is not None

    def wedged(state: str = "active", detail: str = "") -> Diagnosis:
        evidence = [Evidence("no token generated for", "9 s", "engine vllm-8000 on local", 1.0)]
        where = {"model": "tiny", "deployment": "a", "engine": "vllm-8000"}
        return Diagnosis(d.ENGINE_WEDGED, "local/vllm-8000", "local", evidence, **where,
                         state=state, detail=detail)  # type: ignore[arg-type]  # fmt: skip

    hostile = Diagnosis(d.KV_PRESSURE, "local/x|\x1b[31mred", "local",
                        [Evidence("KV cache", "95%", "engine x", 1.0)])  # fmt: skip
    steps = [
        (warm, [wedged()]),  # there as the recording began
        (warm + 5, [wedged(), hostile]),
        (warm + 6, [wedged("verifying", "verifying failover (0 s)"), hostile]),
        (warm + 7, [wedged("verifying", "verifying failover (1 s)"), hostile]),  # no change
        (warm + 20, [wedged("resolved", "resolved 14 s after failover")]),  # KV gone
        (warm + 90, []),  # the resolved one is no longer listed: nothing more to say
    ]
    for at, found in steps:
        recorder.diagnoses(found, at)
    writer.close()
    rec = Recording(out)
    said = [(e["kind"], e["subject"], e["severity"]) for e in rec.events]
    assert said == [
        ("diagnosis active at start", "local/vllm-8000", "critical"),
        ("diagnosis raised", "local/x|\x1b[31mred", "warning"),
        ("diagnosis verifying", "local/vllm-8000", "critical"),
        ("diagnosis resolved", "local/vllm-8000", "info"),
        ("diagnosis gone", "local/x|\x1b[31mred", "info"),
    ]
    assert rec.events[0]["message"] == (
        "engine wedged: local/vllm-8000: no token generated for 9 s; first move: failover"
    )
    assert rec.events[3]["message"].endswith("[resolved 14 s after failover]")
    entries = timeline.build(rec)
    assert [e.kind for e in entries] == [k for k, _, _ in said]
    text = timeline.markdown(rec, entries, rec.start, rec.end)
    assert "diagnosis resolved" in text and "\x1b" not in text
