"""The recording file: what a fleet looked like, second by second, for replay and timelines.

Append-only frames (docs/recording.md). Each frame is a 33-byte header and a payload:

    magic b"ERF1" | kind (1 byte) | payload length (u32) | first time (f64) |
    last time (f64) | crc32 of the payload (u32)            (big-endian)

Kinds: HEAD (the fleet file and the settings, JSON), KEY (starts a block: a new zlib
stream whose first records are every node's whole snapshot and the gateway's), MORE (the
same block's next second, compressed with the block's dictionary: per-node diffs), and
EVENTS (alerts raised and cleared, operator actions: zlib on its own, so a reader finds
them all without decompressing a single snapshot). The writer ends a frame each second
and flushes it, so a kill -9 loses at most that second; a reader stops at the first torn
or corrupt frame and says where. Seeking decompresses one block: keyframes every
`keyframe_s` (60 s) bound the work.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import queue
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from console.core.wire import Snapshot

MAGIC = b"ERF1"
HEADER = struct.Struct(">4sBIddI")
HEAD, KEY, MORE, EVENTS = 1, 2, 3, 4
FORMAT = "engineroom-recording"
VERSION = 1
MAX_FRAME_BYTES = 256 * 2**20  # a larger length is a torn or foreign file, not a frame
_STOP = object()


class RecordingError(Exception):
    """The file is not a recording, or not one this version reads; says which and where."""


# -- per-node diffs: {"s": {key: new value}, "p": {key: nested diff}, "d": [removed keys]} -


def diff(old: Any, new: Any) -> dict[str, Any] | None:
    """What turns `old` into `new`; None when they are equal. Lists of the same length
    are diffed element by element (a GPU's utilization changes, not the GPU list)."""
    if old == new:
        return None
    if isinstance(old, dict) and isinstance(new, dict):
        items_new, items_old = new.items(), old
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        items_new = ((str(i), v) for i, v in enumerate(new))  # type: ignore[assignment]
        items_old = {str(i): v for i, v in enumerate(old)}
    else:
        return None  # the caller replaces the value whole
    out: dict[str, Any] = {}
    for key, value in items_new:
        if key not in items_old:
            out.setdefault("s", {})[key] = value
        elif items_old[key] != value:
            sub = diff(items_old[key], value)
            if sub is None:
                out.setdefault("s", {})[key] = value
            else:
                out.setdefault("p", {})[key] = sub
    if isinstance(new, dict):
        gone = [k for k in old if k not in new]
        if gone:
            out["d"] = gone
    return out


def patch(value: Any, change: dict[str, Any]) -> Any:
    """`diff`'s inverse: a new value (the old one is left as it was)."""
    if isinstance(value, list):
        out_list = list(value)
        for key, v in change.get("s", {}).items():
            out_list[int(key)] = v
        for key, sub in change.get("p", {}).items():
            out_list[int(key)] = patch(out_list[int(key)], sub)
        return out_list
    out = dict(value)
    for key, v in change.get("s", {}).items():
        out[key] = v
    for key, sub in change.get("p", {}).items():
        out[key] = patch(out[key], sub)
    for key in change.get("d", ()):
        out.pop(key, None)
    return out


# -- the writer ---------------------------------------------------------------------------


class RecordingWriter:
    """Appends to a recording from a thread of its own; the caller never waits.

    `node`, `gateway` and `event` put one item on a queue of `queue_limit` and return at
    once. A full queue (the disk stalls, the machine is overloaded) drops the item and
    counts it in `dropped`; the file says how many were lost, and when. The thread turns
    snapshots into diffs, compresses, and ends a frame every `flush_s`.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        fleet_text: str,
        fleet_source: str = "fleet.toml",
        by: str = "record",
        keyframe_s: float = 60.0,
        flush_s: float = 1.0,
        queue_limit: int = 20_000,
    ) -> None:
        self.path = Path(path)
        if self.path.exists() and self.path.stat().st_size > 0:
            raise RecordingError(f"{self.path}: already exists; record into a new file")
        self.keyframe_s = keyframe_s
        self.flush_s = flush_s
        self.queue_limit = queue_limit
        self.dropped = 0  # items the full queue refused (read from any thread)
        self.written_bytes = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_limit)
        self._file = open(self.path, "ab")  # noqa: SIM115 - closed by the thread
        self._nodes: dict[str, dict[str, Any]] = {}  # the last snapshot written, as JSON
        self._node_seen: dict[str, float] = {}  # when each node's last snapshot came
        self._status: dict[str, tuple[str | None, str | None]] = {}
        self._gateway: dict[str, Any] | None = None
        self._records: list[bytes] = []  # this second's lines, not yet compressed
        self._events: list[dict[str, Any]] = []
        self._zip: Any = None
        self._block_started = 0.0
        self._first: float | None = None
        self._last = 0.0
        self._reported_drops = 0
        started = time.time()
        head = {
            "format": FORMAT,
            "version": VERSION,
            "started": started,
            "by": by,
            "keyframe_s": keyframe_s,
            "fleet_source": fleet_source,
            "fleet_text": fleet_text,
        }
        payload = json.dumps(head).encode()
        self._frame(HEAD, payload, started, started)
        self._file.flush()
        self._thread = threading.Thread(target=self._run, name="recording", daemon=True)
        self._thread.start()

    # what callers do: put and go ------------------------------------------------------

    def _put(self, item: tuple[Any, ...]) -> bool:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def node(
        self,
        name: str,
        snapshot: Snapshot | dict[str, Any] | None,
        status: str | None = None,
        error: str | None = None,
        t: float | None = None,
    ) -> bool:
        """A node's newest snapshot (None when only its status changed); False if dropped."""
        return self._put(("node", time.time() if t is None else t, name, snapshot, status, error))

    def gateway(self, snap: dict[str, Any], t: float | None = None) -> bool:
        """The gateway's routes, weights and measures (GET /admin/snapshot)."""
        return self._put(("gw", time.time() if t is None else t, snap))

    def event(self, event: dict[str, Any]) -> bool:
        """An alert raised or cleared, or an operator action: {"t", "kind", "subject",
        "message", "severity", optional "who", "why", "node"}."""
        return self._put(("event", event))

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued and end the file; waits at most `timeout`."""
        if self._thread.is_alive():
            with contextlib.suppress(queue.Full):
                self._queue.put(_STOP, timeout=timeout)
            self._thread.join(timeout)

    # the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_s
        try:
            while True:
                try:
                    item = self._queue.get(timeout=max(0.0, next_flush - time.monotonic()))
                except queue.Empty:
                    item = None
                if item is _STOP:
                    break
                if item is not None:
                    self._take(item)
                if time.monotonic() >= next_flush:
                    self._flush()
                    next_flush = time.monotonic() + self.flush_s
            self._flush()
        finally:
            self._file.close()

    def _take(self, item: tuple[Any, ...]) -> None:
        kind = item[0]
        if kind == "event":
            event = item[1]
            self._events.append(event)
            self._seen(float(event.get("t") or time.time()))
            return
        t = item[1]
        if self._zip is None or t - self._block_started >= self.keyframe_s:
            self._start_block(t)
        self._seen(t)
        if kind == "gw":
            snap = item[2]
            if self._gateway is None:
                self._line({"t": t, "k": "gw", "v": snap})
            elif (change := diff(self._gateway, snap)) is not None:
                self._line({"t": t, "k": "gwd", "v": change})
            self._gateway = snap
            return
        _, t, name, snapshot, status, error = item
        if (status, error) != self._status.get(name, (None, None)) and status is not None:
            self._status[name] = (status, error)
            self._line({"t": t, "k": "node", "n": name, "status": status, "error": error})
        if snapshot is None:
            return
        data = snapshot if isinstance(snapshot, dict) else snapshot.model_dump(mode="json")
        old = self._nodes.get(name)
        if old is None:
            self._line({"t": t, "k": "snap", "n": name, "v": data})
        else:
            change = diff(old, data)
            # An unchanged snapshot is still a sign of life: the replay ages nodes by it.
            self._line({"t": t, "k": "diff", "n": name, "v": change or {}})
        self._nodes[name] = data
        self._node_seen[name] = t

    def _seen(self, t: float) -> None:
        self._first = t if self._first is None else min(self._first, t)
        self._last = max(self._last, t)

    def _line(self, record: dict[str, Any]) -> None:
        self._records.append(json.dumps(record, separators=(",", ":")).encode())

    def _start_block(self, t: float) -> None:
        """End the block: a new zlib stream opens with everything known, whole."""
        if self._zip is not None:
            self._flush()
        self._zip = zlib.compressobj(6)
        self._block_started = t
        self._block_new = True
        for name, (status, error) in self._status.items():
            self._line({"t": t, "k": "node", "n": name, "status": status, "error": error})
        for name, data in self._nodes.items():
            seen = self._node_seen.get(name, t)
            self._line({"t": t, "k": "snap", "n": name, "v": data, "key": True, "seen": seen})
        if self._gateway is not None:
            self._line({"t": t, "k": "gw", "v": self._gateway})

    def _flush(self) -> None:
        if self.dropped != self._reported_drops:  # say what the full queue cost, and when
            lost = self.dropped - self._reported_drops
            self._reported_drops = self.dropped
            now = max(self._last, time.time())
            self._events.append(
                {"t": now, "kind": "gap", "severity": "warning", "subject": "recording",
                 "message": f"{lost} updates dropped: the recording queue was full"}
            )  # fmt: skip
        if self._records and self._zip is not None:
            raw = b"\n".join(self._records) + b"\n"
            payload = self._zip.compress(raw) + self._zip.flush(zlib.Z_SYNC_FLUSH)
            kind = KEY if self._block_new else MORE
            self._block_new = False
            first = json.loads(self._records[0])["t"]
            self._frame(kind, payload, first, self._last)
            self._records = []
        if self._events:
            raw = b"\n".join(json.dumps(e, separators=(",", ":")).encode() for e in self._events)
            times = [float(e.get("t") or 0) for e in self._events]
            self._frame(EVENTS, zlib.compress(raw, 6), min(times), max(times))
            self._events = []
        self._file.flush()  # in the kernel's hands: a kill -9 of this process loses nothing

    def _frame(self, kind: int, payload: bytes, first: float, last: float) -> None:
        head = HEADER.pack(MAGIC, kind, len(payload), first, last, zlib.crc32(payload))
        self._file.write(head + payload)
        self.written_bytes += len(head) + len(payload)


# -- the reader ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Frame:
    offset: int  # of the payload
    kind: int
    length: int
    first: float
    last: float


@dataclass
class FleetAt:
    """Everything recorded up to a moment: each node's last snapshot (JSON) and when it
    came, each node's last status and error, the gateway's last snapshot."""

    t: float
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)  # node -> time of its last snapshot
    status: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    gateway: dict[str, Any] | None = None
    gateway_seen: float | None = None

    def apply(self, record: dict[str, Any]) -> str | None:
        """Take one record in; the node it changed, if any."""
        kind, t = record["k"], record["t"]
        if kind in ("snap", "diff"):
            name = record["n"]
            if kind == "snap":
                self.nodes[name] = record["v"]
            elif name in self.nodes and record["v"]:
                self.nodes[name] = patch(self.nodes[name], record["v"])
            # A keyframe's copy is no new sign of life: it carries when the node last spoke.
            self.seen[name] = record.get("seen", t)
            return str(name)
        if kind == "node":
            self.status[record["n"]] = (record.get("status"), record.get("error"))
            return str(record["n"])
        if kind == "gw":
            self.gateway, self.gateway_seen = record["v"], t
        elif kind == "gwd" and self.gateway is not None:
            self.gateway, self.gateway_seen = patch(self.gateway, record["v"]), t
        return None


class Recording:
    """A recording opened for reading: its frames indexed, its events loaded.

    A torn or corrupt tail (the writer was killed mid-frame) ends the recording there;
    `torn` says where and how many bytes were left out.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.frames: list[Frame] = []
        self.torn: str | None = None
        self.events: list[dict[str, Any]] = []
        with open(self.path, "rb") as f:
            data = f.read(HEADER.size)
            if len(data) < HEADER.size or data[:4] != MAGIC:
                raise RecordingError(f"{self.path}: not an engineroom recording (no {MAGIC!r})")
            f.seek(0)
            self._index(f)
        if not self.frames or self.frames[0].kind != HEAD:
            raise RecordingError(f"{self.path}: the recording's header frame is missing")
        self.head = json.loads(self._payload(self.frames[0]))
        if self.head.get("format") != FORMAT or self.head.get("version") != VERSION:
            raise RecordingError(
                f"{self.path}: format {self.head.get('format')!r} version "
                f"{self.head.get('version')!r}; this engineroom reads {FORMAT} {VERSION}"
            )
        self.blocks = [i for i, fr in enumerate(self.frames) if fr.kind == KEY]
        self._block_times = [self.frames[i].first for i in self.blocks]
        data_frames = [fr for fr in self.frames if fr.kind in (KEY, MORE, EVENTS)]
        self.start = min((fr.first for fr in data_frames), default=self.head["started"])
        self.end = max((fr.last for fr in data_frames), default=self.start)
        for fr in self.frames:
            if fr.kind == EVENTS:
                for line in zlib.decompress(self._payload(fr)).splitlines():
                    self.events.append(json.loads(line))
        self.events.sort(key=lambda e: e.get("t") or 0)

    def _index(self, f: Any) -> None:
        size = self.path.stat().st_size
        offset = 0
        while offset < size:
            raw = f.read(HEADER.size)
            if len(raw) < HEADER.size:
                self.torn = f"torn frame header at byte {offset}: {size - offset} bytes left out"
                return
            magic, kind, length, first, last, crc = HEADER.unpack(raw)
            if magic != MAGIC or kind not in (HEAD, KEY, MORE, EVENTS) or length > MAX_FRAME_BYTES:
                self.torn = f"no frame at byte {offset}: {size - offset} bytes left out"
                return
            payload = f.read(length)
            if len(payload) < length or zlib.crc32(payload) != crc:
                self.torn = f"torn frame at byte {offset}: {size - offset} bytes left out"
                return
            self.frames.append(Frame(offset + HEADER.size, kind, length, first, last))
            offset += HEADER.size + length

    def _payload(self, frame: Frame) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(frame.offset)
            return f.read(frame.length)

    @property
    def fleet_text(self) -> str:
        return str(self.head.get("fleet_text", ""))

    def records(self, block: int = 0) -> Iterator[dict[str, Any]]:
        """Every state record from the `block`-th keyframe on, in order."""
        if block >= len(self.blocks):
            return
        unzip: Any = None
        with open(self.path, "rb") as f:
            for fr in self.frames[self.blocks[block] :]:
                if fr.kind not in (KEY, MORE):
                    continue
                if fr.kind == KEY:
                    unzip = zlib.decompressobj()
                if unzip is None:
                    continue
                f.seek(fr.offset)
                for line in unzip.decompress(f.read(fr.length)).splitlines():
                    yield json.loads(line)

    def block_for(self, t: float) -> int:
        """The last keyframe at or before `t` (the first one for any earlier `t`)."""
        return max(0, bisect.bisect_right(self._block_times, t) - 1)

    def fleet_at(self, t: float) -> FleetAt:
        """The fleet as recorded at `t`: one block decompressed, not the file."""
        return Cursor(self, t).state


class Cursor:
    """A position in a recording that moves forward record by record (play, step) and
    jumps anywhere by starting again from the keyframe before (seek)."""

    def __init__(self, recording: Recording, t: float) -> None:
        self.recording = recording
        self.state = FleetAt(t)
        self._records: Iterator[dict[str, Any]] = iter(())
        self._next: dict[str, Any] | None = None
        self.seek(t)

    def seek(self, t: float) -> set[str]:
        self.state = FleetAt(t)
        self._records = self.recording.records(self.recording.block_for(t))
        self._next = next(self._records, None)
        return self.advance(t)

    def advance(self, t: float) -> set[str]:
        """Apply every record up to `t`; the nodes that changed."""
        if t < self.state.t:
            return self.seek(t)
        changed: set[str] = set()
        while self._next is not None and self._next["t"] <= t:
            name = self.state.apply(self._next)
            if name is not None:
                changed.add(name)
            self._next = next(self._records, None)
        self.state.t = t
        return changed

    def next_time(self) -> float | None:
        """When the next record is (for stepping one recorded moment at a time)."""
        return None if self._next is None else float(self._next["t"])
