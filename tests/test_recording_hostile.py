"""A recording is someone else's file: `engineroom timeline` and `engineroom replay` read
it as hostile (issue 27, defects 5 and 7).

The files here are crafted frame by frame in the writer's own format (the header struct,
zlib streams flushed as the sink flushes them, real CRCs), so the reader takes each one
as a recording and has to judge its content: a decompression bomb costs the reader its
bound, not the bomb's ratio, and every malformed record is one line naming the file and
where, exit 2, through the real CLI. A property test mutates valid recordings and holds
the reader to RecordingError as the only way it fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from console.collect.recordings import reader as reading
from console.collect.recordings.format import MAGIC, MAX_BLOCK_VALUES, MAX_EVENTS_PER_FRAME
from console.collect.recordings.reader import (
    EVENTS,
    HEAD,
    HEADER,
    KEY,
    MORE,
    Recording,
    RecordingError,
)
from console.collect.recordings.replay import ReplayCollector, fleet_of
from console.collect.recordings.timeline import build, markdown
from tests.conftest import ROOT, agent_env

T0 = 1_796_083_200.0  # 2026-12-01 00:00:00 UTC
FLEET_TEXT = """\
[fleet]
name = "hostile"
refresh_s = 1.0

[[nodes]]
name = "a"
agent = "http://127.0.0.1:9"
"""
SNAPSHOT: dict[str, Any] = {
    "node": {"name": "a", "agent_version": "1", "time": T0},
    "host": {"cpu_pct": 3.0},
    "gpu_status": "ok",
    "gpus": [{"index": 0, "utilization_pct": 10.0}, {"index": 1, "utilization_pct": 20.0}],
    "engines": [
        {"id": "e1", "kind": "vllm", "state": "ready",
         "models": [{"name": "m", "latency": {"ttft_s": {"p95": 0.2}}}]},
    ],
}  # fmt: skip
GATEWAY = {"time": T0, "models": {"m": {"d1": {"weight": 100, "up": True}}}}
MIB = 2**20

# -- crafting files in the writer's format ---------------------------------------------


def _frame(kind: int, payload: bytes, first: float = T0, last: float | None = None) -> bytes:
    last = first if last is None else last
    return HEADER.pack(MAGIC, kind, len(payload), first, last, zlib.crc32(payload)) + payload


def _head(**over: Any) -> bytes:
    head = {"format": "engineroom-recording", "version": 1, "started": T0, "by": "record",
            "keyframe_s": 20.0, "flush_s": 1.0, "fleet_source": "fleet.toml",
            "fleet_text": FLEET_TEXT}  # fmt: skip
    head.update(over)
    return json.dumps(head).encode()


def _line(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def _stream(*chunks: bytes, level: int = 6) -> list[bytes]:
    """One block's zlib stream: each chunk (lines, newline-ended) a frame's payload,
    sync-flushed as the sink flushes a frame."""
    z = zlib.compressobj(level)
    return [z.compress(chunk) + z.flush(zlib.Z_SYNC_FLUSH) for chunk in chunks]


def _key(*lines: bytes) -> bytes:
    return _frame(KEY, _stream(b"".join(line + b"\n" for line in lines))[0])


def _events(*lines: bytes) -> bytes:
    return _frame(EVENTS, zlib.compress(b"\n".join(lines)))


def _valid_records() -> list[bytes]:
    return [
        _line(t=T0, k="node", n="a", status="up", error=None),
        _line(t=T0, k="snap", n="a", v=SNAPSHOT),
        _line(t=T0, k="gw", v=GATEWAY),
    ]


def _valid_event() -> bytes:
    return _line(t=T0, kind="action", severity="info", subject="m", message="routes set",
                 who="alice", why="INC-1")  # fmt: skip


def _file(path: Path, *frames: bytes, head: bytes | None = None) -> Path:
    path.write_bytes(_frame(HEAD, _head() if head is None else head) + b"".join(frames))
    return path


# -- running the real CLI, measured ----------------------------------------------------


# Started from a small launcher, not from pytest: Linux carries the parent's peak RSS
# into a forked child's ru_maxrss (through exec), so a child of pytest would report
# pytest's own 200 MiB. The launcher reports what wait4 says of the CLI alone.
_LAUNCH = """
import os, subprocess, sys
fd = int(sys.argv[1])
child = subprocess.Popen([sys.executable, "-m", "console.cli", *sys.argv[2:]], pass_fds=())
_, status, usage = os.wait4(child.pid, 0)
os.write(fd, str(usage.ru_maxrss).encode())
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _cli(*args: str, timeout: float = 90) -> tuple[int, str, str, float]:
    """`engineroom ARGS` as a real process: exit status, stdout, stderr, and the peak
    resident memory of that process alone, in MiB."""
    out, err, peak = os.pipe(), os.pipe(), os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-c", _LAUNCH, str(peak[1]), *args], stdin=subprocess.DEVNULL,
        stdout=out[1], stderr=err[1], pass_fds=(peak[1],), cwd=ROOT, env=agent_env(),
        start_new_session=True,
    )  # fmt: skip
    for fd in (out[1], err[1], peak[1]):
        os.close(fd)
    texts: list[bytes] = [b"", b"", b""]

    def drain(i: int, fd: int) -> None:
        with os.fdopen(fd, "rb") as f:
            texts[i] = f.read(1 * MIB)  # an error is a line; more is a failure anyway
            while f.read(MIB):
                pass

    readers = [
        threading.Thread(target=drain, args=(i, p[0])) for i, p in enumerate((out, err, peak))
    ]
    for r in readers:
        r.start()
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:  # a replay that opened its TUI: a failure
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait(10)
    for r in readers:
        r.join(10)
    peak_kib = int(texts[2] or 0)
    return code, texts[0].decode(), texts[1].decode(), peak_kib / 1024


def _refused(path: Path, *commands: tuple[str, ...]) -> None:
    """Each command on `path` exits 2 with one line on stderr that names the file, and no
    output; the commands run at once."""
    with ThreadPoolExecutor(len(commands)) as pool:
        runs = list(pool.map(lambda c: (c, _cli(*c, str(path))), commands))
    for command, (code, out, err, _) in runs:
        said = f"{' '.join(command)}: exit {code}, stdout {out[:200]!r}, stderr {err[-600:]!r}"
        assert code == 2, said
        assert "Traceback" not in err, said
        lines = err.strip().splitlines()
        assert len(lines) == 1, said
        assert lines[0].startswith(f"engineroom {command[0]}: {path}"), said
        assert out == "", said


# -- defect 5: a decompression bomb -------------------------------------------------------


def _bomb_lines(line_bytes: int, total: int, event: bool) -> bytes:
    """Valid JSON lines padded with spaces: highly compressible, each under the line
    bound, so only the bound on what a frame inflates to can stop them."""
    head = b'{"t":%d,"kind":"action"' % T0 if event else b'{"t":%d,"k":"node","n":"a"' % T0
    line = head + b" " * (line_bytes - len(head) - 1) + b"}"
    z = zlib.compressobj(9)
    parts = [z.compress(line + b"\n") for _ in range(total // line_bytes)]
    return b"".join(parts) + z.flush(zlib.Z_FINISH if event else zlib.Z_SYNC_FLUSH)


@pytest.mark.parametrize("where", ["keyframe", "events"])
def test_a_decompression_bomb_costs_the_reader_its_bound_not_the_bombs_ratio(tmp_path, where):
    """Half a MiB that inflates to 512 MiB. Before: `engineroom timeline` inflated the
    frame whole (a 1.0 MiB file peaked at 2,085 MiB). Now inflation runs a MiB at a time
    and stops at 32 MiB for a frame: one line naming the file, the frame and the bound."""
    if where == "keyframe":
        frame = _frame(KEY, _bomb_lines(8 * MIB, 512 * MIB, event=False))
    else:
        frame = _frame(EVENTS, _bomb_lines(200 * 1024, 512 * MIB, event=True))
    path = _file(tmp_path / f"bomb-{where}.rec", frame)
    assert path.stat().st_size < 1 * MIB
    for command in (("timeline",), ("replay",)):
        code, _, err, peak_mib = _cli(*command, str(path))
        said = f"{command}: exit {code}, peak {peak_mib:.0f} MiB, stderr {err[-500:]!r}"
        assert code == 2, said
        assert err.strip().splitlines() == [
            f"engineroom {command[0]}: {path}: frame 1 at byte {HEADER.size + len(_head())}: "
            "inflates past 32 MiB, the bound for a frame"
        ], said
        # The interpreter and the console's modules take 40-90 MiB; the bomb 512 MiB and
        # more. The bound lets through a frame's 32 MiB, a MiB at a time.
        assert peak_mib < 200, said


def test_a_block_and_a_files_events_are_bounded_across_frames(tmp_path):
    """Frames under the frame bound that together pass the block's (or the events')."""
    filler = b'{"t":%d,"k":"node","n":"a"' % T0 + b" " * (4 * MIB) + b"}\n"
    payloads = _stream(*[filler * 6] * 3)  # three frames of 24 MiB, one block
    path = _file(
        tmp_path / "block.rec", _frame(KEY, payloads[0]), *(_frame(MORE, p) for p in payloads[1:])
    )
    with pytest.raises(RecordingError, match=r"frame 3 at byte \d+: inflates past 64 MiB, "
                       r"the bound for a keyframe's block"):  # fmt: skip
        list(Recording(path).records())

    event = b'{"t":%d,"kind":"action"' % T0 + b" " * (200 * 1024) + b"}"
    frames = [_frame(EVENTS, zlib.compress(b"\n".join([event] * 120))) for _ in range(3)]
    with pytest.raises(RecordingError, match=r"frame 3 at byte \d+: inflates past 64 MiB, "
                       r"the bound for a recording's events"):  # fmt: skip
        Recording(_file(tmp_path / "events.rec", *frames))


def test_lines_values_frames_and_events_each_have_a_bound(tmp_path, monkeypatch):
    line = b'{"t":%d,"k":"node","n":"a","error":"' % T0 + b"x" * (18 * MIB) + b'"}'
    with pytest.raises(RecordingError, match=r"frame 1 at byte \d+: a line over 17 MiB"):
        list(Recording(_file(tmp_path / "line.rec", _key(line))).records())

    # Four million empty objects fit in 12 MiB and would take 290 MiB decoded.
    values = _line(t=T0, k="snap", n="a", v={}).replace(
        b"{}", b'{"x":[' + b"{}," * MAX_BLOCK_VALUES + b"{}]}"
    )
    with pytest.raises(RecordingError, match=r"record 1: more than 4,000,000 JSON values"):
        list(Recording(_file(tmp_path / "values.rec", _key(values))).records())

    many = [_valid_event()] * (MAX_EVENTS_PER_FRAME + 1)
    with pytest.raises(RecordingError, match=r"frame 1 at byte \d+: more than 10,000 events"):
        Recording(_file(tmp_path / "per-frame.rec", _events(*many)))

    frames = [_events(_valid_event()) for _ in range(12)]
    monkeypatch.setattr(reading, "MAX_EVENTS", 10)
    with pytest.raises(RecordingError, match=r"frame 11 at byte \d+: more than 10 events"):
        Recording(_file(tmp_path / "per-file.rec", *frames))

    monkeypatch.setattr(reading, "MAX_FRAMES", 5)
    with pytest.raises(RecordingError, match=r"more than 5 frames \(at byte \d+\)"):
        Recording(_file(tmp_path / "frames.rec", *frames))


# -- defect 7: crafted recordings, one line and exit 2 ---------------------------------


def _deep(depth: int) -> dict[str, Any]:
    change: dict[str, Any] = {"s": {"x": 1}}
    for _ in range(depth):
        change = {"p": {"x": change}}
    return change


def _key_with(bad: bytes) -> bytes:
    """A keyframe: the node's status and snapshot, then `bad`, all at the first moment
    (which the replay opens at)."""
    return _key(*_valid_records()[:2], bad)


CRAFTED: dict[str, bytes] = {
    # the file and its header
    "wrong magic": b"ERF2" + _frame(HEAD, _head())[4:],
    "empty": b"",
    "cut inside the header frame": _frame(HEAD, _head())[:40],
    "header not JSON": _frame(HEAD, b"{format: 1"),
    "header a list": _frame(HEAD, b'["engineroom-recording", 1]'),
    "header version 2": _frame(HEAD, _head(version=2)),
    "header version true": _frame(HEAD, _head(version=True)),
    "header format a dict": _frame(HEAD, _head(format={"x": 1})),
    "header started a string": _frame(HEAD, _head(started="yesterday")),
    "header started NaN": _frame(HEAD, _head().replace(str(T0).encode(), b"NaN", 1)),
    "header started 1e400": _frame(HEAD, _head().replace(str(T0).encode(), b"1e400", 1)),
    "header keyframe_s negative": _frame(HEAD, _head(keyframe_s=-1)),
    "header fleet_text a number": _frame(HEAD, _head(fleet_text=7)),
    "header over 8 MiB": _frame(HEAD, _head(fleet_text="#" * (9 * MIB))),
    "header nested 5000 deep": _frame(HEAD, b"[" * 5000 + b"]" * 5000),
    # records
    "record a list": _key_with(b"[1, 2]"),
    "record a string": _key_with(b'"snap"'),
    "record of an unknown kind": _key_with(_line(t=T0, k="boom", n="a")),
    "record with no kind": _key_with(_line(t=T0, n="a")),
    "record time a string": _key_with(_line(t="03:12", k="node", n="a")),
    "record time a huge int": _key_with(_line(t=10**30, k="node", n="a")),
    "record time negative": _key_with(_line(t=-5, k="node", n="a")),
    "record time NaN": _key_with(b'{"t":NaN,"k":"node","n":"a"}'),
    "record without its node": _key_with(_line(t=T0, k="snap", v=SNAPSHOT)),
    "node name a number": _key_with(_line(t=T0, k="node", n=7)),
    "node name of 5000 characters": _key_with(_line(t=T0, k="node", n="a" * 5000)),
    "status an int": _key_with(_line(t=T0, k="node", n="a", status=5)),
    "error of 5000 characters": _key_with(_line(t=T0, k="node", n="a", error="e" * 5000)),
    "snapshot a list": _key_with(_line(t=T0, k="snap", n="a", v=[SNAPSHOT])),
    "snapshot with engines a string": _key_with(
        _line(t=T0, k="snap", n="a", v={**SNAPSHOT, "engines": "vllm"})
    ),
    "snapshot with a gpu index a string": _key_with(
        _line(t=T0, k="snap", n="a", v={**SNAPSHOT, "gpus": [{"index": "zero"}]})
    ),
    "snapshot with a huge int": _key_with(
        _line(t=T0, k="snap", n="a", v={**SNAPSHOT, "host": {"cpu_pct": 10**400}})
    ),
    "snapshot nested 5000 deep": _key_with(
        b'{"t":%d,"k":"snap","n":"a","v":{"x":' % T0 + b"[" * 5000 + b"]" * 5000 + b"}}"
    ),
    "diff a list": _key_with(_line(t=T0, k="diff", n="a", v=[1])),
    "diff into a key the snapshot lacks": _key_with(
        _line(t=T0, k="diff", n="a", v={"p": {"nothing": {"s": {"x": 1}}}})
    ),
    "diff into a number": _key_with(
        _line(t=T0, k="diff", n="a", v={"p": {"gpu_status": {"s": {"x": 1}}}})
    ),
    "diff past a list's end": _key_with(
        _line(t=T0, k="diff", n="a", v={"p": {"gpus": {"s": {"7": {"index": 7}}}}})
    ),
    "diff with an index not a number": _key_with(
        _line(t=T0, k="diff", n="a", v={"p": {"gpus": {"s": {"first": {}}}}})
    ),
    "diff removing a list's item": _key_with(
        _line(t=T0, k="diff", n="a", v={"p": {"gpus": {"d": ["0"]}}})
    ),
    "diff removing a number": _key_with(_line(t=T0, k="diff", n="a", v={"d": [5]})),
    "diff making a snapshot no snapshot": _key_with(
        _line(t=T0, k="diff", n="a", v={"s": {"node": "gone"}})
    ),
    "diff nested 70 deep": _key_with(_line(t=T0, k="diff", n="a", v=_deep(70))),
    "gateway models a list": _key_with(_line(t=T0, k="gw", v={"models": ["m"]})),
    "gateway weight a string": _key_with(
        _line(t=T0, k="gw", v={"models": {"m": {"d1": {"weight": "max"}}}})
    ),
    "gateway diff that does not fit": _key(
        *_valid_records(), _line(t=T0, k="gwd", v={"p": {"models": {"p": {"z": {"s": {}}}}}})
    ),
    "a line that is not JSON": _key_with(b"{'t': 1}"),
    "an empty line": _key_with(b""),
    "keyframe not zlib": _frame(KEY, b"\x00not zlib at all"),
    "keyframe cut short": _frame(KEY, _stream(b"\n".join(_valid_records()) + b"\n")[0][:-20]),
    # events
    "event a string": _events(b'"raised"'),
    "event without a time": _events(_line(kind="action", message="x")),
    "event message an object": _events(_line(t=T0, kind="action", message={"x": 1})),
    "event kind a number": _events(_line(t=T0, kind=3)),
    "event time infinite": _events(b'{"t":1e999,"kind":"action"}'),
    "events cut short": _frame(EVENTS, zlib.compress(_valid_event())[:-6]),
    "events followed by more": _frame(EVENTS, zlib.compress(_valid_event()) + b"more"),
}


def _crafted(tmp_path: Path, name: str) -> Path:
    body = CRAFTED[name]
    path = tmp_path / "crafted.rec"
    if name in ("wrong magic", "empty") or name.startswith(("cut inside", "header")):
        path.write_bytes(body)  # the header frame is the case
    else:
        path.write_bytes(_frame(HEAD, _head()) + body)
    return path


def test_the_crafted_files_are_whole_frames_around_the_fault(tmp_path):
    """The valid base the cases break: it reads, replays and makes a timeline."""
    path = _file(tmp_path / "valid.rec", _key(*_valid_records()), _events(_valid_event()))
    recording = Recording(path)
    assert recording.torn is None and recording.events[0]["who"] == "alice"
    replay = ReplayCollector(fleet_of(recording), recording=recording)
    snap = replay.states["a"].snapshot
    assert snap is not None and snap.engines[0].models[0].name == "m"
    assert replay.gateway_snapshot == GATEWAY
    assert markdown(recording, build(recording), recording.start, recording.end)
    code, out, err, _ = _cli("timeline", str(path))
    assert code == 0 and "routes set" in out and err == "", err


# `engineroom replay` through the CLI for one case of each kind (it loads Textual: a
# second and a half each); its loading path in-process for every case.
REPLAYED = ("header started NaN", "record a list", "snapshot with engines a string",
            "diff past a list's end", "keyframe cut short", "event message an object")  # fmt: skip


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_a_crafted_recording_is_one_line_and_exit_2_everywhere(tmp_path, name):
    """Before: a list where a record goes, a string where a number goes, a diff for keys
    the snapshot lacks or a cut zlib stream ended `timeline` and `replay` with a
    traceback (TypeError, KeyError, IndexError, zlib.error, OverflowError ...)."""
    path = _crafted(tmp_path, name)
    with pytest.raises(RecordingError) as caught:  # what `engineroom replay` loads
        recording = Recording(path)
        ReplayCollector(fleet_of(recording), recording=recording)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)
    shape = "--json" if sorted(CRAFTED).index(name) % 2 else "--markdown"  # half each
    replay = [("replay",)] if name in REPLAYED else []
    _refused(path, ("timeline",), ("timeline", shape), *replay)


def test_a_fleet_file_that_no_longer_reads_stops_the_replay_not_the_timeline(tmp_path):
    """The replay needs the recorded fleet file; the timeline makes do without it. The
    replay's error names the recording, not the fleet.toml the operator has."""
    path = _file(tmp_path / "fleet.rec", _key(*_valid_records()), head=_head(fleet_text="[x"))
    _refused(path, ("replay",))
    code, out, err, _ = _cli("timeline", str(path))
    assert code == 0 and "| time |" in out and err == "", err


def test_a_fault_later_in_a_recording_ends_the_replay_there(tmp_path):
    """A replay opens at its start; a record further on that breaks the schema stops the
    cursor before it, and says so, rather than ending the console with a traceback."""
    later = [
        _line(t=T0 + i, k="diff", n="a", v={"p": {"host": {"s": {"cpu_pct": float(i)}}}})
        for i in range(1, 6)
    ]
    bad = _line(t=T0 + 6, k="diff", n="a", v={"p": {"nothing": {"s": {}}}})
    payloads = _stream(b"".join(r + b"\n" for r in _valid_records()),
                       b"".join(r + b"\n" for r in [*later, bad]))  # fmt: skip
    path = _file(
        tmp_path / "later.rec",
        _frame(KEY, payloads[0]),
        _frame(MORE, payloads[1], T0 + 1, T0 + 6),
    )
    recording = Recording(path)
    replay = ReplayCollector(fleet_of(recording), recording=recording)
    assert replay.broken is None
    replay.move_to(recording.end)
    assert replay.broken is not None and "'nothing', which holds no object" in replay.broken
    assert replay.last == T0 + 5 and replay.at == T0 + 5
    snap = replay.states["a"].snapshot
    assert snap is not None and snap.host.cpu_pct == 5.0  # every good record applied
    replay.move_to(T0)  # back and forth again: the same, and no exception
    replay.move_to(recording.end)
    assert replay.at == T0 + 5
    code, _, err, _ = _cli("timeline", str(path))
    assert code == 2 and err.count("\n") == 1 and "at 2026-12-01 00:00:06 UTC" in err, err


# -- a property: a mutated recording reads, or is a RecordingError -------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                  max_size=3),
    max_leaves=8,
)  # fmt: skip


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value, as the keys and indexes that lead to it."""
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*at, i))
    return out


def _put(value: Any, at: tuple[Any, ...], new: Any) -> Any:
    if not at:
        return new
    value[at[0]] = _put(value[at[0]], at[1:], new)
    return value


GPU_1 = {"p": {"gpus": {"p": {"1": {"s": {"utilization_pct": 30}}}}}}
WEIGHT_0 = {"p": {"models": {"p": {"m": {"p": {"d1": {"s": {"weight": 0}}}}}}}}
BASE = [
    *_valid_records(),
    _line(t=T0 + 1, k="diff", n="a", v=GPU_1),
    _line(t=T0 + 2, k="gwd", v=WEIGHT_0),
    _line(t=T0 + 3, k="node", n="a", status="down", error="connection refused"),
]
BASE_EVENTS = [_valid_event(), _line(t=T0 + 2, kind="raised", severity="critical", subject="m")]


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())  # fmt: skip
def test_a_mutated_recording_reads_or_is_a_recording_error(tmp_path, data):
    """One value anywhere in a valid recording (a record, an event, the header) replaced
    by any JSON value, or one byte of an inflated frame changed: open, timeline, replay
    from the start and played to the end either work or raise RecordingError."""
    records = [json.loads(r) for r in BASE]
    events = [json.loads(e) for e in BASE_EVENTS]
    head = json.loads(_head())
    which = data.draw(st.sampled_from(["record", "event", "head", "byte"]))
    raw_key: bytes | None = None
    if which == "byte":
        raw_key = bytearray(b"".join(r + b"\n" for r in BASE))  # type: ignore[assignment]
        at = data.draw(st.integers(0, len(raw_key) - 1))  # type: ignore[arg-type]
        raw_key[at] = data.draw(st.integers(0, 255))  # type: ignore[index]
    else:
        target = {"record": records, "event": events, "head": [head]}[which]
        i = data.draw(st.integers(0, len(target) - 1))
        at = data.draw(st.sampled_from(_paths(target[i])))
        target[i] = _put(target[i], at, data.draw(JSON))
    lines = b"".join(msgspec.json.encode(r) + b"\n" for r in records)
    path = tmp_path / "mutated.rec"
    path.write_bytes(
        _frame(HEAD, msgspec.json.encode(head))
        + _frame(KEY, _stream(bytes(raw_key) if raw_key is not None else lines)[0], T0, T0 + 3)
        + _events(*(msgspec.json.encode(e) for e in events))
    )
    try:
        recording = Recording(path)
        build(recording)
        replay = ReplayCollector(fleet_of(recording), recording=recording)
        replay.move_to(recording.end)
        replay.move_to(recording.start)
    except RecordingError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)
