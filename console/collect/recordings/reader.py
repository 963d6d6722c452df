"""The recording file: what a fleet looked like, second by second, for replay and timelines.

Append-only frames (docs/recording.md). Each frame is a 29-byte header and a payload:

    magic b"ERF1" | kind (1 byte) | payload length (u32) | first time (f64) |
    last time (f64) | crc32 of the payload (u32)            (big-endian)

Kinds: HEAD (the fleet file and the settings, JSON), KEY (starts a block: a new zlib
stream whose first records are every node's whole snapshot and the gateway's), MORE (the
same block's next second, compressed with the block's dictionary: per-node diffs), and
EVENTS (alerts raised and cleared, operator actions: zlib on its own, so a reader finds
them all without decompressing a single snapshot). The writer ends a frame each second
and flushes it, so a kill -9 loses at most that second; a reader stops at the first torn
or corrupt frame and says where. Seeking decompresses one block: keyframes every
`keyframe_s` (20 s) bound the work.

A recording is outside text: someone else's file. Every record is decoded against the
typed schema of format.py as it is read, and everything the reader inflates or
holds has a bound (its MAX_ names; docs/security.md). What breaks either is a
RecordingError that says which file, where in it and why, never a traceback.
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
import math
import zlib
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import msgspec

from console.collect.recordings.format import (
    EVENTS,
    FORMAT,
    HEAD,
    HEADER,
    KEY,
    MAGIC,
    MAX_BLOCK_VALUES,
    MAX_EVENT_BYTES,
    MAX_EVENTS,
    MAX_EVENTS_INFLATED,
    MAX_EVENTS_PER_FRAME,
    MAX_FRAME_BYTES,
    MAX_FRAMES,
    MAX_HEAD_BYTES,
    MAX_INFLATED_BLOCK,
    MAX_INFLATED_FRAME,
    MAX_RECORD_BYTES,
    MAX_RECORD_DEPTH,
    MAX_TIME,
    MORE,
    VERSION,
    Diff,
    GatewayDiff,
    GatewayShape,
    GatewaySnap,
    Malformed,
    NodeStatus,
    Record,
    RecordingError,
    RolloutsDiff,
    RolloutsSnap,
    Snap,
    decode_event,
    decode_head,
    decode_line,
    decode_record,
    decode_which,
    diff,
    json_depth,
    json_openers,
    misfit,
    one_line,
    patch,
)
from console.collect.recordings.rollouts import Rollouts, checked
from console.core.snapshot import Snapshot, SnapshotError, snapshot_from
from console.core.units import size_from_bytes

# Read from here by the writer, the replay, the timeline and the tests.
__all__ = [
    "EVENTS", "HEAD", "HEADER", "KEY", "MORE", "Cursor", "FleetAt", "Frame", "Record",
    "Recording", "RecordingError", "diff", "patch",
]  # fmt: skip

_CHUNK = 2**20  # inflated at a time: what a frame costs to read is this, not its size
_changes = itertools.count(1)  # FleetAt.version: unique across cursors
_copy = msgspec.json.Encoder().encode


# -- the reader ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Frame:
    offset: int  # of the payload
    kind: int
    length: int
    first: float
    last: float


class Frames(Sequence[Frame]):
    """The frames' index, packed (29 bytes a frame, not a Python object each)."""

    def __init__(self) -> None:
        self.offsets = array("q")
        self.kinds = bytearray()
        self.lengths = array("q")
        self.firsts = array("d")
        self.lasts = array("d")

    def add(self, offset: int, kind: int, length: int, first: float, last: float) -> None:
        self.offsets.append(offset)
        self.kinds.append(kind)
        self.lengths.append(length)
        self.firsts.append(first)
        self.lasts.append(last)

    def __len__(self) -> int:
        return len(self.kinds)

    @overload
    def __getitem__(self, i: int) -> Frame: ...
    @overload
    def __getitem__(self, i: slice) -> list[Frame]: ...
    def __getitem__(self, i: int | slice) -> Frame | list[Frame]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return Frame(self.offsets[i], self.kinds[i], self.lengths[i], self.firsts[i], self.lasts[i])


class _Inflater:
    """One zlib stream, inflated a chunk at a time and cut into lines, within bounds: a
    frame may not inflate past MAX_INFLATED_FRAME, nor the stream past `budget`."""

    def __init__(self, budget: int, what: str) -> None:
        self.unzip = zlib.decompressobj()
        self.left = budget
        self.budget = budget
        self.what = what  # whose bound `budget` is

    def restart(self) -> None:
        """A new zlib stream, on the same budget (each EVENTS frame is one)."""
        self.unzip = zlib.decompressobj()

    def lines(self, data: bytes, max_line: int, whole: bool) -> Iterator[bytes]:
        """The frame's lines. `whole`: the frame is the stream (EVENTS), which must end in
        it; else the frame must end at the end of a line (the writer flushes so)."""
        frame_left = MAX_INFLATED_FRAME
        buf = bytearray()
        tail = data
        while True:
            try:
                out = self.unzip.decompress(tail, _CHUNK)
            except zlib.error as exc:
                raise Malformed(f"not zlib: {exc}") from None
            frame_left -= len(out)
            self.left -= len(out)
            if frame_left < 0:
                raise Malformed(
                    f"inflates past {size_from_bytes(MAX_INFLATED_FRAME)}, the bound for a frame"
                )
            if self.left < 0:
                raise Malformed(
                    f"inflates past {size_from_bytes(self.budget)}, the bound for {self.what}"
                )
            tail = self.unzip.unconsumed_tail
            buf += out
            end = buf.rfind(b"\n")
            if end >= 0:
                done = bytes(buf[:end])
                del buf[: end + 1]
                for line in done.split(b"\n"):
                    if len(line) > max_line:
                        raise Malformed(
                            f"a line over {size_from_bytes(max_line)}, the bound for one"
                        )
                    yield line
            if len(buf) > max_line:
                raise Malformed(f"a line over {size_from_bytes(max_line)}, the bound for one")
            if not tail and len(out) < _CHUNK:
                break
        if whole:
            if not self.unzip.eof or self.unzip.unused_data:
                raise Malformed("its zlib stream is cut short or followed by more")
            if buf:
                yield bytes(buf)
        elif buf:
            raise Malformed("it ends inside a record (its zlib stream is cut short)")


@dataclass
class FleetAt:
    """Everything recorded up to a moment: each node's last snapshot (JSON) and when it
    came, each node's last status and error, the gateway's last snapshot and rollouts.
    `source` names the file in what a bad record raises."""

    t: float
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)  # node -> time of its last snapshot
    status: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    gateway: dict[str, Any] | None = None
    gateway_seen: float | None = None
    # The gateway's rollouts (recording_rollouts.Rollouts: as recorded, and typed).
    rollouts: dict[str, Any] | None = None
    rollouts_typed: Rollouts | None = None
    rollouts_seen: float | None = None
    version: dict[str, int] = field(default_factory=dict)  # node -> changes applied (patched
    # in place: a reader that keeps something made from a node's JSON compares this)
    source: str = "recording"
    _typed: dict[str, tuple[int, Snapshot]] = field(
        default_factory=dict, repr=False, compare=False
    )  # node -> (its version, its snapshot as the console's model)

    def apply(self, record: Record) -> str | None:
        """Take one record in; the node it changed, if any. A record that does not fit
        (a diff for keys the snapshot lacks, a gateway snapshot of the wrong shape) is a
        RecordingError and changes nothing."""
        if isinstance(record, Snap | Diff):
            name = record.n
            if isinstance(record, Snap):
                self.nodes[name] = record.v
                self.version[name] = next(_changes)
            elif name in self.nodes and (record.v.s or record.v.p or record.v.d):
                node = self.nodes[name]
                if (why := misfit(node, record.v)) is not None:
                    raise self._error(record, f"node {name[:80]!r}: {why}")
                patch(node, record.v)
                self.version[name] = next(_changes)
            # A keyframe's copy is no new sign of life: it carries when the node last spoke.
            seen = record.seen if isinstance(record, Snap) else None
            self.seen[name] = record.t if seen is None else seen
            return name
        if isinstance(record, NodeStatus):
            self.status[record.n] = (record.status, record.error)
            return record.n
        if isinstance(record, GatewaySnap | GatewayDiff):
            gateway = self._whole(record, self.gateway, "the gateway's snapshot")
            if gateway is not None:
                self.gateway = self._gateway_checked(record, gateway)
                self.gateway_seen = record.t
        elif isinstance(record, RolloutsSnap | RolloutsDiff):
            value = self._whole(record, self.rollouts, "the gateway's rollouts")
            if value is not None:
                try:
                    self.rollouts_typed = checked(value)
                except ValueError as exc:
                    raise self._error(record, f"not the gateway's rollouts: {exc}") from None
                self.rollouts, self.rollouts_seen = value, record.t
        return None

    def _whole(
        self, record: Record, before: dict[str, Any] | None, what: str
    ) -> dict[str, Any] | None:
        """The value a whole record sets, or a copy of `before` with a diff applied; None
        for a diff with nothing before it (it changes nothing)."""
        if isinstance(record, GatewaySnap | RolloutsSnap):
            return record.v
        assert isinstance(record, GatewayDiff | RolloutsDiff)
        if before is None:
            return None
        if (why := misfit(before, record.v)) is not None:
            raise self._error(record, f"{what}: {why}")
        # A new dict, not patched in place: the console holds the one it showed.
        try:
            copy = msgspec.json.decode(_copy(before))
        except RecursionError:
            raise self._error(record, f"{what} is nested too deep") from None
        return patch(copy, record.v)

    def _gateway_checked(self, record: Record, value: dict[str, Any]) -> dict[str, Any]:
        try:
            msgspec.convert(value, GatewayShape)
        except (msgspec.ValidationError, RecursionError) as exc:
            raise self._error(record, f"not a gateway snapshot: {one_line(exc)}") from None
        return value

    def _error(self, record: Record, why: str) -> RecordingError:
        return RecordingError(f"{self.source}: the record at {_when(record.t)}: {why}")

    def snapshot(self, name: str) -> Snapshot | None:
        """The node's snapshot as the console's model (made again only when it changed);
        RecordingError when what was recorded is not a snapshot."""
        data = self.nodes.get(name)
        if data is None:
            return None
        version = self.version.get(name, 0)
        known = self._typed.get(name)
        if known is not None and known[0] == version:
            return known[1]
        try:
            snap = snapshot_from(data)
        except (SnapshotError, RecursionError) as exc:
            at = _when(self.seen.get(name, self.t))
            raise RecordingError(
                f"{self.source}: node {name[:80]!r} at {at}: {one_line(exc)}"
            ) from None
        self._typed[name] = (version, snap)
        return snap


def _when(t: float) -> str:
    if not math.isfinite(t) or not 0 <= t <= MAX_TIME:
        return "the start"
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _valid_time(t: float) -> bool:
    return math.isfinite(t) and 0.0 <= t <= MAX_TIME


class Recording:
    """A recording opened for reading: its frames indexed, its events loaded.

    A torn or corrupt tail (the writer was killed mid-frame) ends the recording there;
    `torn` says where and how many bytes were left out. A frame that is whole but breaks
    the schema or a bound is a RecordingError (the file was not written by engineroom).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.frames = Frames()
        self.torn: str | None = None
        self.events: list[dict[str, Any]] = []
        with open(self.path, "rb") as f:
            data = f.read(HEADER.size)
            if len(data) < HEADER.size or data[:4] != MAGIC:
                raise RecordingError(f"{self.path}: not an engineroom recording (no {MAGIC!r})")
            f.seek(0)
            self._index(f)
        if not self.frames or self.frames.kinds[0] != HEAD:
            raise RecordingError(f"{self.path}: the recording's header frame is missing")
        self.head = self._head()
        self.blocks = [i for i, kind in enumerate(self.frames.kinds) if kind == KEY]
        self._block_times = [self.frames.firsts[i] for i in self.blocks]
        # The recording spans its snapshots: an event may be older (an audited action the
        # gateway logged before the recording began); replay never opens on a moment it
        # has no data for, where every node would read "down" (issue 28).
        # It ends with whatever came last: the alert a node's last answer raised is written
        # after that answer.
        kinds = self.frames.kinds
        data_frames = [i for i, kind in enumerate(kinds) if kind in (KEY, MORE)]
        firsts, lasts = self.frames.firsts, self.frames.lasts
        self.start = min((firsts[i] for i in data_frames), default=self.head["started"])
        ends = (lasts[i] for i, kind in enumerate(kinds) if kind != HEAD)
        self.end = max(self.start, max(ends, default=self.start))
        self._load_events()

    def _index(self, f: Any) -> None:
        size = self.path.stat().st_size
        offset = 0
        while offset < size:
            raw = f.read(HEADER.size)
            if len(raw) < HEADER.size:
                self.torn = f"torn frame header at byte {offset}: {size - offset} bytes left out"
                return
            magic, kind, length, first, last, crc = HEADER.unpack(raw)
            bound = MAX_HEAD_BYTES if kind == HEAD else MAX_FRAME_BYTES
            if (
                magic != MAGIC
                or kind not in (HEAD, KEY, MORE, EVENTS)
                or length > bound
                or not (_valid_time(first) and _valid_time(last) and first <= last)
            ):
                self.torn = f"no frame at byte {offset}: {size - offset} bytes left out"
                return
            payload = f.read(length)
            if len(payload) < length or zlib.crc32(payload) != crc:
                self.torn = f"torn frame at byte {offset}: {size - offset} bytes left out"
                return
            if len(self.frames) >= MAX_FRAMES:
                raise RecordingError(
                    f"{self.path}: more than {MAX_FRAMES:,} frames (at byte {offset}), "
                    "the bound for a recording"
                )
            self.frames.add(offset + HEADER.size, kind, length, first, last)
            offset += HEADER.size + length

    def _where(self, i: int) -> str:
        return f"{self.path}: frame {i} at byte {self.frames.offsets[i] - HEADER.size}"

    def _head(self) -> dict[str, Any]:
        payload = self._payload(0)
        try:
            head = decode_line(decode_head, payload)
        except Malformed as exc:
            why = str(exc)
            try:
                said = decode_line(decode_which, payload)
            except Malformed:
                said = None
            if said is not None and (said.format != FORMAT or said.version != VERSION):
                raise self._not_this_version(said.format, said.version) from None
            raise RecordingError(f"{self._where(0)}: the header: {why}") from None
        if head.format != FORMAT or head.version != VERSION:
            raise self._not_this_version(head.format, head.version)
        out: dict[str, Any] = msgspec.to_builtins(head)
        return out

    def _not_this_version(self, fmt: object, version: object) -> RecordingError:
        said = (str(fmt)[:40], str(version)[:20])
        return RecordingError(
            f"{self.path}: format {said[0]!r} version {said[1]!r}; this engineroom reads "
            f"{FORMAT} {VERSION}"
        )

    def _load_events(self) -> None:
        events = _Inflater(MAX_EVENTS_INFLATED, "a recording's events")
        for i, kind in enumerate(self.frames.kinds):
            if kind != EVENTS:
                continue
            events.restart()  # each EVENTS frame is a zlib stream; the budget is the file's
            count = 0
            try:
                for line in events.lines(self._payload(i), MAX_EVENT_BYTES, whole=True):
                    count += 1
                    if count > MAX_EVENTS_PER_FRAME:
                        raise Malformed(
                            f"more than {MAX_EVENTS_PER_FRAME:,} events, the bound for a frame"
                        )
                    if len(self.events) >= MAX_EVENTS:
                        raise Malformed(f"more than {MAX_EVENTS:,} events, the bound for a file")
                    try:
                        event = decode_line(decode_event, line)
                    except Malformed as exc:
                        raise Malformed(f"event {count}: {exc}") from None
                    self.events.append(msgspec.to_builtins(event))
            except Malformed as exc:
                raise RecordingError(f"{self._where(i)}: {exc}") from None
        self.events.sort(key=lambda e: e["t"])

    def _payload(self, i: int) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(self.frames.offsets[i])
            return f.read(self.frames.lengths[i])

    @property
    def fleet_text(self) -> str:
        return str(self.head.get("fleet_text", ""))

    def records(self, block: int = 0) -> Iterator[Record]:
        """Every state record from the `block`-th keyframe on, in order; RecordingError
        at the first frame that breaks the schema or a bound."""
        if block >= len(self.blocks):
            return
        block_reader: _Inflater | None = None
        values = 0
        with open(self.path, "rb") as f:
            for i in range(self.blocks[block], len(self.frames)):
                kind = self.frames.kinds[i]
                if kind == KEY:
                    block_reader = _Inflater(MAX_INFLATED_BLOCK, "a keyframe's block")
                    values = 0
                if block_reader is None or kind not in (KEY, MORE):
                    continue
                f.seek(self.frames.offsets[i])
                data = f.read(self.frames.lengths[i])
                n = 0
                try:
                    for line in block_reader.lines(data, MAX_RECORD_BYTES, whole=False):
                        n += 1
                        openers = json_openers(line)
                        if openers > MAX_RECORD_DEPTH and json_depth(line) > MAX_RECORD_DEPTH:
                            raise Malformed(
                                f"record {n}: nested deeper than {MAX_RECORD_DEPTH} levels, "
                                "the bound for one"
                            )
                        values += openers + line.count(b",")
                        if values > MAX_BLOCK_VALUES:
                            raise Malformed(
                                f"record {n}: more than {MAX_BLOCK_VALUES:,} JSON values in "
                                "a keyframe's block, the bound for one"
                            )
                        try:
                            record = decode_line(decode_record, line)
                        except Malformed as exc:
                            raise Malformed(f"record {n}: {exc}") from None
                        yield record
                except Malformed as exc:
                    raise RecordingError(f"{self._where(i)}: {exc}") from None

    def first_round(self) -> float:
        """When every node the first keyframe block records has its first record: a replay
        opens there, not on the first node's answer with the others not read yet (seen:
        three of four nodes shown down for the 26 ms before their first answers)."""
        if not self.blocks:
            return self.start
        block_end = self.start + float(self.head.get("keyframe_s") or 20.0)
        firsts: dict[str, float] = {}
        try:
            for record in self.records(0):
                if record.t > block_end:
                    break
                name = getattr(record, "n", None)
                if isinstance(name, str):
                    firsts.setdefault(name, record.t)
        except RecordingError:
            pass  # the cursor says it where it opens
        return max(firsts.values(), default=self.start)

    def block_for(self, t: float) -> int:
        """The last keyframe at or before `t` (the first one for any earlier `t`)."""
        return max(0, bisect.bisect_right(self._block_times, t) - 1)

    def fleet_at(self, t: float) -> FleetAt:
        """The fleet as recorded at `t`: one block decompressed, not the file."""
        cursor = Cursor(self, t)
        if cursor.error is not None:
            raise cursor.error
        return cursor.state


class Cursor:
    """A position in a recording that moves forward record by record (play, step) and
    jumps anywhere by starting again from the keyframe before (seek).

    A record that breaks the schema or a bound ends the recording for the cursor: it
    stops before that record, `error` says what and where, and `ended_at` is the last
    moment it could show. It does not raise: a replay shows what came before.
    """

    def __init__(self, recording: Recording, t: float) -> None:
        self.recording = recording
        self.state = FleetAt(float("-inf"), source=str(recording.path))
        self._records: Iterator[Record] = iter(())
        self._next: Record | None = None
        self._block = 0
        self.error: RecordingError | None = None
        self.ended_at: float | None = None
        self._applied = float("-inf")  # the time of the last record applied
        self.seek(t)

    def seek(self, t: float) -> set[str]:
        self._block = self.recording.block_for(t)
        self.state = FleetAt(float("-inf"), source=str(self.recording.path))
        self._records = self.recording.records(self._block)
        self._applied = float("-inf")
        self._fetch()
        return self.advance(t)

    def _fetch(self) -> None:
        try:
            self._next = next(self._records, None)
        except RecordingError as exc:
            self._stop(exc)

    def _stop(self, exc: RecordingError) -> None:
        self._next = None
        if self.error is None:
            self.error = exc
            if self._applied > float("-inf"):
                self.ended_at = self._applied
            else:  # nothing read in this block: where the cursor stood, or the start
                before = self.state.t
                self.ended_at = before if math.isfinite(before) else self.recording.start

    def advance(self, t: float) -> set[str]:
        """Apply every record up to `t`; the nodes that changed. Back in time, or past
        the next keyframe, it starts again from the keyframe before `t` instead."""
        moved = self.state.t != float("-inf")
        if moved and (t < self.state.t or self.recording.block_for(t) > self._block):
            return self.seek(t)
        changed: set[str] = set()
        while self._next is not None and self._next.t <= t:
            try:
                name = self.state.apply(self._next)
            except RecordingError as exc:
                self._stop(exc)
                break
            self._applied = self._next.t
            if name is not None:
                changed.add(name)
            self._fetch()
        self.state.t = t if self.ended_at is None else min(t, self.ended_at)
        return changed
