"""The recording's sink: its own process (`python -m console.collect.recordings.sink FILE`),
fed by console/collect/recordings/writer.py down a pipe, length-prefixed JSON messages.

It diffs each snapshot against the node's last, compresses, and appends a frame to the
file every second (console/collect/recordings/format.py has the format). What comes down
the pipe is the fleet's own text (agents' snapshots, the gateway's audit rows), and what
it writes must read: it keeps within the reader's bounds, and an update it cannot hold is
left out with a gap event that says so, never the end of the recording.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import struct
import sys
import time
import zlib
from typing import Any

import msgspec

from console.collect.recordings.format import (
    EVENTS,
    HEAD,
    HEADER,
    KEY,
    MAGIC,
    MAX_BLOCK_VALUES,
    MAX_EVENTS,
    MAX_EVENTS_INFLATED,
    MAX_EVENTS_PER_FRAME,
    MAX_FRAMES,
    MAX_HEAD_BYTES,
    MAX_INFLATED_BLOCK,
    MAX_RECORD_BYTES,
    MAX_TEXT,
    MAX_TIME,
    MAX_VALUE_DEPTH,
    MORE,
    diff,
    json_depth,
    json_openers,
    json_values,
)

LENGTH = struct.Struct(">I")  # each message's length, before it
MAX_MESSAGE_BYTES = 64 * 2**20  # one snapshot is tens of KB; more is a broken pipe's garbage
_encode = msgspec.json.Encoder().encode


FRAME_SPLIT = 8 * 2**20  # records end a frame early past this: far under MAX_INFLATED_FRAME
_LAST_FRAMES = 16  # kept for the end: the events of a second fill 8 at most (64 MiB)
_GAP = {"kind": "gap", "severity": "warning", "subject": "recording"}
# What is recorded as one value and its diffs: its diff's kind, and whose it is.
_WHOLE = {"gw": ("gwd", "the gateway"), "ro": ("rod", "the gateway's rollouts")}


class Sink:
    """Turns updates into frames: diffs, one zlib stream per keyframe block, a frame a
    second, events apart (console/collect/recordings/reader.py reads them).

    What it writes keeps within the reader's bounds (format.py), so a file it
    wrote always reads: a frame ends early past FRAME_SPLIT, a block past half its bounds,
    an update over MAX_RECORD_BYTES is left out (a gap event says so), event fields are
    cut to MAX_TEXT, and at MAX_EVENTS or MAX_FRAMES the file ends with an event saying so.
    """

    def __init__(self, file: Any, head: dict[str, Any]) -> None:
        self.file = file
        self.keyframe_s = float(head.get("keyframe_s", 20.0))
        self.flush_s = float(head.get("flush_s", 1.0))
        self._nodes: dict[str, Any] = {}  # the last snapshot written, as JSON
        self._node_seen: dict[str, float] = {}
        self._status: dict[str, tuple[str | None, str | None]] = {}
        self._whole: dict[str, dict[str, Any] | None] = {}  # "gw", "ro": the last written
        self._records: list[bytes] = []
        self._events: list[tuple[float, bytes]] = []  # (its time, its line)
        self._zip: Any = None
        self._block_new = False
        self._block_started = 0.0
        self._block_bytes = 0  # inflated, in the block so far
        self._block_values = 0  # JSON values, likewise (recording_format.json_values)
        self._pending = 0  # bytes of the records not yet in a frame
        self._too_big: set[str] = set()  # who had an update left out (said once each)
        self._events_kept = 0  # events in the file or on their way to it
        self._events_bytes = 0
        self._events_full = False
        self._frames = 0
        self.full = False  # MAX_FRAMES reached: the file is ended, nothing more is written
        self._dropped_said = 0
        self._first = 0.0
        self._last = 0.0
        body = json.dumps(head).encode()
        if len(body) > MAX_HEAD_BYTES:  # RecordingWriter refused it already
            raise SystemExit(f"recording sink: a header over {MAX_HEAD_BYTES >> 20} MiB")
        self._frame(HEAD, body, head["started"], head["started"])
        self.file.flush()

    def take(self, message: list[Any]) -> None:
        if self.full:
            return
        kind = message[0]
        if kind == "event":
            self._event(message[1])
            return
        if kind == "left_out":  # the console's side could not send it (RecordingWriter)
            _, t, who, what = message
            self._say_left_out(_time(t), str(who), str(what))
            return
        if kind == "dropped":
            _, t, count = message
            self._event(
                {**_GAP, "t": t, "message": f"{count - self._dropped_said} updates dropped: "
                 "the recording queue was full"}
            )  # fmt: skip
            self._dropped_said = count
            return
        t = _time(message[1])
        if (
            self._zip is None
            or t - self._block_started >= self.keyframe_s
            or self._block_bytes >= MAX_INFLATED_BLOCK // 2
            or self._block_values >= MAX_BLOCK_VALUES // 2
        ):
            self._start_block(t)
        self._last = max(self._last, t)
        if kind in _WHOLE:  # the gateway's snapshot, its rollouts: one value each
            value, before = message[2], self._whole.get(kind)
            diff_kind, who = _WHOLE[kind]
            if before is None:
                kept = self._line({"t": t, "k": kind, "v": value}, who)
            elif (change := diff(before, value)) is not None:
                kept = self._line({"t": t, "k": diff_kind, "v": change}, who)
            else:
                kept = True
            self._whole[kind] = value if kept else None  # left out: the next goes whole
            return
        _, _, name, status, error, data = message
        if len(name) > MAX_TEXT:
            self._say_left_out(t, name[:80], f"a node name over {MAX_TEXT} characters")
            return
        status, error = _text(status), _text(error)
        if status is not None and (status, error) != self._status.get(name, (None, None)):
            self._status[name] = (status, error)
            self._line({"t": t, "k": "node", "n": name, "status": status, "error": error}, name)
        if data is None:
            return
        old = self._nodes.get(name)
        if old is None:
            kept = self._line({"t": t, "k": "snap", "n": name, "v": data}, name)
        else:
            # An unchanged snapshot is still a sign of life: the replay ages nodes by it.
            kept = self._line({"t": t, "k": "diff", "n": name, "v": diff(old, data) or {}}, name)
        if kept:
            self._nodes[name] = data
            self._node_seen[name] = t
        else:  # the next one is written whole, against nothing
            self._nodes.pop(name, None)

    def _line(self, record: dict[str, Any], who: str, share: float = 1.0) -> bool:
        """Queue one record for the frame; False (and said once) when it is over the
        record bound, or would take the block past `share` of its bounds."""
        try:
            body = _encode(record)
        except (RecursionError, TypeError, ValueError, OverflowError) as exc:
            # A diff nests twice as deep as its value: it may not encode where the value did.
            self._say_left_out(record["t"], who, f"an update that does not encode ({exc})")
            return False
        values = json_values(body)
        if (
            len(body) > MAX_RECORD_BYTES
            or self._block_bytes + len(body) + 1 > MAX_INFLATED_BLOCK * share
            or self._block_values + values > MAX_BLOCK_VALUES * share
        ):
            self._say_left_out(
                record["t"],
                who,
                f"an update of {len(body):,} bytes, over what a recording "
                f"holds ({MAX_RECORD_BYTES >> 20} MiB a record, {MAX_INFLATED_BLOCK >> 20} MiB "
                f"and {MAX_BLOCK_VALUES:,} values a block)",
            )
            return False
        self._too_big.discard(who)
        if not self._records:
            self._first = record["t"]
        self._records.append(body)
        self._pending += len(body) + 1
        self._block_bytes += len(body) + 1
        self._block_values += values
        if self._pending >= FRAME_SPLIT:
            self._flush_records()
        return True

    def _say_left_out(self, t: float, who: str, what: str) -> None:
        """A gap event: `who`'s update was not recorded, and why (once, until one is)."""
        if who in self._too_big:
            return
        self._too_big.add(who)
        self._event({**_GAP, "t": t, "subject": who, "message": f"{what}: left out"})

    def _event(self, event: dict[str, Any]) -> None:
        """One event, its fields made what the reader takes (a gateway's audit row may
        carry anything); past the file's bound, one last event says so."""
        if self._events_full:
            return
        t = _time(event.get("t"))
        body = _encode(_clean_event(event, t))
        if (
            self._events_kept + 2 > MAX_EVENTS
            or self._events_bytes + len(body) + 2048 > MAX_EVENTS_INFLATED
        ):
            self._events_full = True
            body = _encode(
                {**_GAP, "t": t, "message": f"the recording holds {MAX_EVENTS:,} events "
                 f"({MAX_EVENTS_INFLATED >> 20} MiB) at most: later ones are not recorded"}
            )  # fmt: skip
        self._events.append((t, body))
        self._events_kept += 1
        self._events_bytes += len(body) + 1

    def _start_block(self, t: float) -> None:
        """End the block; the next opens a new zlib stream with everything known, whole.
        A node that no longer fits the block's bound is left out of it (and said)."""
        if self._zip is not None:
            self.flush()
        self._zip = zlib.compressobj(6)
        self._block_started = t
        self._block_new = True
        self._block_bytes = self._block_values = 0
        for name, (status, error) in self._status.items():
            self._line({"t": t, "k": "node", "n": name, "status": status, "error": error}, name)
        share = 0.75  # of the block's bounds: its updates need the rest
        for name, data in list(self._nodes.items()):
            seen = self._node_seen.get(name, t)
            record = {"t": t, "k": "snap", "n": name, "v": data, "key": True, "seen": seen}
            if not self._line(record, name, share):
                self._nodes.pop(name)
        for kind, value in self._whole.items():
            if value is not None and not self._line(
                {"t": t, "k": kind, "v": value}, _WHOLE[kind][1], share
            ):
                self._whole[kind] = None

    def flush(self) -> None:
        if self.full:
            return
        self._flush_records()
        if self._frames + _LAST_FRAMES >= MAX_FRAMES:
            # The last frames: the second's events, as many as a frame holds, a notice.
            t = time.time()
            del self._events[MAX_EVENTS_PER_FRAME - 1 :]
            notice = {
                **_GAP,
                "t": t,
                "message": f"the recording reached its bound of "
                f"{MAX_FRAMES:,} frames: nothing later is recorded; start a new one",
            }
            self._events.append((t, _encode(notice)))
            self.full = True
        self._flush_events()
        # In the kernel's hands: a kill -9 of this process or the console loses nothing.
        self.file.flush()

    def _flush_records(self) -> None:
        if self._records and self._zip is not None:
            raw = b"\n".join(self._records) + b"\n"
            payload = self._zip.compress(raw) + self._zip.flush(zlib.Z_SYNC_FLUSH)
            kind = KEY if self._block_new else MORE
            self._block_new = False
            self._frame(kind, payload, self._first, max(self._last, self._first))
        self._records, self._pending = [], 0

    def _flush_events(self) -> None:
        """Events in frames of their own, each within the reader's bounds for one."""
        i = 0
        while i < len(self._events):
            chunk, size = self._events[i : i + MAX_EVENTS_PER_FRAME], 0
            for n, (_, body) in enumerate(chunk):
                size += len(body) + 1
                if size > FRAME_SPLIT:
                    chunk = chunk[: max(1, n)]
                    break
            i += len(chunk)
            times = [t for t, _ in chunk]
            raw = b"\n".join(body for _, body in chunk)
            self._frame(EVENTS, zlib.compress(raw, 6), min(times), max(times))
        self._events = []

    def _frame(self, kind: int, payload: bytes, first: float, last: float) -> None:
        head = HEADER.pack(MAGIC, kind, len(payload), first, last, zlib.crc32(payload))
        self.file.write(head + payload)
        self._frames += 1


def _time(value: Any) -> float:
    """A time the reader takes (a caller's NaN or a gateway's year 20000 is now)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        t = float(value)
        if math.isfinite(t) and 0.0 <= t <= MAX_TIME:
            return t
    return time.time()


def _text(value: Any) -> str | None:
    """Outside text as the reader takes it: a string of at most MAX_TEXT characters."""
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "\u2026"


def _clean_event(event: dict[str, Any], t: float) -> dict[str, Any]:
    out: dict[str, Any] = {"t": t, "kind": _text(event.get("kind")) or "action"}
    for key in ("severity", "subject", "message", "who", "why", "node", "job", "source"):
        if (value := _text(event.get(key))) is not None:
            out[key] = value
    return out


def _read_exactly(fd: int, n: int) -> bytes | None:
    out = bytearray()
    while len(out) < n:
        chunk = os.read(fd, n - len(out))
        if not chunk:
            return None
        out += chunk
    return bytes(out)


def run_sink(path: str) -> int:
    """Read length-prefixed messages on stdin until it closes; append frames to `path`."""
    fd = sys.stdin.fileno()

    def message() -> Any:
        size = _read_exactly(fd, LENGTH.size)
        if size is None:
            return None
        (n,) = LENGTH.unpack(size)
        if n > MAX_MESSAGE_BYTES:
            raise SystemExit(f"recording sink: a message of {n} bytes; the pipe is broken")
        body = _read_exactly(fd, n)
        return None if body is None else _decode(body)

    head = message()
    if head is None:
        return 0
    with open(path, "ab") as file:
        sink = Sink(file, head)
        next_flush = time.monotonic() + sink.flush_s
        while True:
            wait = max(0.0, next_flush - time.monotonic())
            ready, _, _ = select.select([fd], [], [], wait)
            if ready:
                item = message()
                if item is None:
                    break  # the console closed (or was killed): end the file
                sink.take(item)
            if time.monotonic() >= next_flush:
                sink.flush()
                next_flush = time.monotonic() + sink.flush_s
        sink.flush()
    return 0


_decode_any = msgspec.json.Decoder().decode
# What a too-deep message was (RecordingWriter encodes ["node", t, "name", ...]), read
# without decoding it: any decoder goes as deep as the message.
_WHOSE = re.compile(rb'\["(node|gw|ro|event)",([-+.0-9eE]+|null),("(?:[^"\\]|\\.)*")?')


def _decode(body: bytes) -> Any:
    """A message, if it nests at most MAX_VALUE_DEPTH deep: what the file holds then
    decodes in any reader (an agent's engine config may nest as deep as the console
    decodes). Deeper: a note that the update was left out, with whose it was."""
    if json_openers(body) <= MAX_VALUE_DEPTH or json_depth(body) <= MAX_VALUE_DEPTH:
        return _decode_any(body)
    whose = _WHOSE.match(body)
    kind = whose.group(1) if whose else b"?"
    when = float(whose.group(2)) if whose and whose.group(2) != b"null" else None
    who: Any = _WHOLE[kind.decode()][1] if kind in (b"gw", b"ro") else "an event"
    if kind == b"node" and whose and whose.group(3):
        who = _decode_any(whose.group(3))
    return ["left_out", when, str(who), f"an update nested deeper than {MAX_VALUE_DEPTH} levels"]


if __name__ == "__main__":
    sys.exit(run_sink(sys.argv[1]))
