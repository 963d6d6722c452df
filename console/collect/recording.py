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
import itertools
import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

MAGIC = b"ERF1"
HEADER = struct.Struct(">4sBIddI")
HEAD, KEY, MORE, EVENTS = 1, 2, 3, 4
FORMAT = "engineroom-recording"
VERSION = 1
MAX_FRAME_BYTES = 256 * 2**20  # a larger length is a torn or foreign file, not a frame
_changes = itertools.count(1)  # FleetAt.version: unique across cursors
_decode = msgspec.json.Decoder().decode  # a record line: twice as fast as json.loads


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
    """`diff`'s inverse, in place: `value` becomes the new value (and is returned)."""
    is_list = isinstance(value, list)
    for key, v in change.get("s", {}).items():
        value[int(key) if is_list else key] = v
    for key, sub in change.get("p", {}).items():
        k = int(key) if is_list else key
        value[k] = patch(value[k], sub)
    for key in change.get("d", ()):
        value.pop(key, None)
    return value


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
    version: dict[str, int] = field(default_factory=dict)  # node -> changes applied (patched
    # in place: a reader that keeps something made from a node's JSON compares this)

    def apply(self, record: dict[str, Any]) -> str | None:
        """Take one record in; the node it changed, if any."""
        kind, t = record["k"], record["t"]
        if kind in ("snap", "diff"):
            name = record["n"]
            if kind == "snap":
                self.nodes[name] = record["v"]
                self.version[name] = next(_changes)
            elif name in self.nodes and record["v"]:
                patch(self.nodes[name], record["v"])
                self.version[name] = next(_changes)
            # A keyframe's copy is no new sign of life: it carries when the node last spoke.
            self.seen[name] = record.get("seen", t)
            return str(name)
        if kind == "node":
            self.status[record["n"]] = (record.get("status"), record.get("error"))
            return str(record["n"])
        if kind == "gw":
            self.gateway, self.gateway_seen = record["v"], t
        elif kind == "gwd" and self.gateway is not None:
            # A new dict, not patched in place: the console holds the one it showed.
            self.gateway = patch(json.loads(json.dumps(self.gateway)), record["v"])
            self.gateway_seen = t
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
                    yield _decode(line)

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
        self.state = FleetAt(float("-inf"))
        self._records: Iterator[dict[str, Any]] = iter(())
        self._next: dict[str, Any] | None = None
        self._block = 0
        self.seek(t)

    def seek(self, t: float) -> set[str]:
        self._block = self.recording.block_for(t)
        self.state = FleetAt(float("-inf"))
        self._records = self.recording.records(self._block)
        self._next = next(self._records, None)
        return self.advance(t)

    def advance(self, t: float) -> set[str]:
        """Apply every record up to `t`; the nodes that changed. Back in time, or past
        the next keyframe, it starts again from the keyframe before `t` instead."""
        moved = self.state.t != float("-inf")
        if moved and (t < self.state.t or self.recording.block_for(t) > self._block):
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
