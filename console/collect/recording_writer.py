"""Writing a recording without slowing the console: the work happens in another process.

The console's side (RecordingWriter) puts each update on a bounded queue and returns; a
thread serializes it (a snapshot's JSON straight from pydantic-core) and writes it, length
prefixed, down a pipe to `python -m console.collect.recording_writer`, the sink. The sink
diffs each snapshot against the node's last, compresses, and appends a frame to the file
every second (console/collect/recording.py has the format). Measured at 1,000 nodes
(bench/recording.py): doing the diff and the compression in the console's own process,
even in a thread, doubled the console's CPU (39 % -> 82 % of a core), because the GIL
makes a thread's Python work the console's.

Back-pressure ends at the queue: a disk that stalls blocks the sink, the pipe fills, the
thread waits, the queue fills, and what comes then is dropped and counted, never waited
for. The sink is told the count and writes it into the file. A console killed with -9
leaves the sink reading end-of-file: it flushes what it has and exits.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import select
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pydantic_core
from pydantic import BaseModel

from console.collect.recording_format import (
    EVENTS,
    FORMAT,
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
    MORE,
    VERSION,
    RecordingError,
    diff,
    json_values,
)

if TYPE_CHECKING:
    from console.core.snapshot import Snapshot

LENGTH = struct.Struct(">I")
MAX_MESSAGE_BYTES = 64 * 2**20  # one snapshot is tens of KB; more is a broken pipe's garbage
_STOP = object()
BATCH = 2048  # updates sent down the pipe in one write, at most
FEED_EVERY_S = 0.1
_encode = msgspec.json.Encoder().encode


class RecordingWriter:
    """Appends to a recording through a sink process; the caller never waits.

    `node`, `gateway` and `event` put one item on a queue of `queue_limit` and return at
    once; a full queue drops the item and counts it in `dropped`.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        fleet_text: str,
        fleet_source: str = "fleet.toml",
        by: str = "record",
        keyframe_s: float = 20.0,
        flush_s: float = 1.0,
        queue_limit: int = 20_000,
    ) -> None:
        self.path = Path(path)
        if self.path.exists() and self.path.stat().st_size > 0:
            raise RecordingError(f"{self.path}: already exists; record into a new file")
        self.queue_limit = queue_limit
        self.dropped = 0  # items the full queue refused
        self._told = 0  # drops the sink has been told of
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_limit)
        self._closing = threading.Event()
        head: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "started": time.time(),
            "by": by,
            "keyframe_s": keyframe_s,
            "flush_s": flush_s,
            "fleet_source": fleet_source,
            "fleet_text": fleet_text,
        }
        if len(_encode(head)) > MAX_HEAD_BYTES:  # the reader's bound for the header frame
            raise RecordingError(
                f"{fleet_source}: a fleet file over {MAX_HEAD_BYTES >> 20} MiB; not recorded"
            )
        self._sink = subprocess.Popen(
            [sys.executable, "-m", "console.collect.recording_writer", str(self.path)],
            stdin=subprocess.PIPE,
            close_fds=True,
        )
        assert self._sink.stdin is not None
        self._pipe = self._sink.stdin
        self._send(_encode(head))
        self._thread = threading.Thread(target=self._feed, name="recording", daemon=True)
        self._thread.start()

    @property
    def written_bytes(self) -> int:
        with contextlib.suppress(OSError):
            return self.path.stat().st_size
        return 0

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
        """Send what is queued, let the sink end the file; waits at most about `timeout`."""
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout)
        self._closing.set()
        self._thread.join(timeout)
        with contextlib.suppress(OSError):
            self._pipe.close()
        try:
            self._sink.wait(timeout)
        except subprocess.TimeoutExpired:
            self._sink.kill()
            self._sink.wait(5)

    # the feeding thread -----------------------------------------------------------------

    def _feed(self) -> None:
        """Send what is queued, up to BATCH at a time, in one write, ten times a second:
        at 1,000 nodes a write per snapshot was a thousand system calls a second."""
        try:
            while True:
                # Gather for a tenth of a second rather than wake for each update: a
                # thread woken a thousand times a second takes the GIL as often.
                self._closing.wait(FEED_EVERY_S)
                batch: list[Any] = []
                with contextlib.suppress(queue.Empty):
                    while len(batch) < BATCH and (not batch or batch[-1] is not _STOP):
                        batch.append(self._queue.get_nowait())
                if not batch:
                    continue
                out = bytearray()
                if self.dropped != self._told:
                    self._told = self.dropped
                    out += _framed(_encode(["dropped", time.time(), self._told]))
                for item in batch:
                    if item is not _STOP:
                        out += _framed(self._message(item))
                if out:
                    self._write(bytes(out))
                if batch[-1] is _STOP:
                    return
        except (BrokenPipeError, OSError):
            return  # the sink is gone (killed with us): nothing more can be written

    @staticmethod
    def _message(item: tuple[Any, ...]) -> bytes:
        """The item for the pipe; one over MAX_MESSAGE_BYTES goes as a note that it was
        left out (the sink writes that into the file), never as a message the sink
        would have to refuse."""
        if item[0] == "node":
            _, t, name, snap, status, error = item
            if snap is None:
                raw = msgspec.Raw(b"null")
            elif isinstance(snap, BaseModel):  # the agent's pydantic model
                raw = msgspec.Raw(pydantic_core.to_json(snap))
            else:  # the console's msgspec struct, or a dict: encoded as it is
                raw = msgspec.Raw(_encode(snap))
            body = _encode(["node", t, name, status, error, raw])
        else:
            body = _encode(list(item))
        if len(body) > MAX_MESSAGE_BYTES:
            who = item[2] if item[0] == "node" else "the gateway" if item[0] == "gw" else "events"
            return _encode(["left_out", item[1] if item[0] != "event" else None, who, len(body)])
        return body

    def _send(self, body: bytes) -> None:
        self._write(_framed(body))

    def _write(self, data: bytes) -> None:
        self._pipe.write(data)
        self._pipe.flush()


def _framed(body: bytes) -> bytes:
    return LENGTH.pack(len(body)) + body


# -- the sink: its own process ----------------------------------------------------------


FRAME_SPLIT = 8 * 2**20  # records end a frame early past this: far under MAX_INFLATED_FRAME
_LAST_FRAMES = 16  # kept for the end: the events of a second fill 8 at most (64 MiB)
_GAP = {"kind": "gap", "severity": "warning", "subject": "recording"}


class Sink:
    """Turns updates into frames: diffs, one zlib stream per keyframe block, a frame a
    second, events apart (console/collect/recording.py reads them).

    What it writes keeps within the reader's bounds (recording_format.py), so a file it
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
        self._gateway: dict[str, Any] | None = None
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
        if kind == "left_out":  # the console's side found it over MAX_MESSAGE_BYTES
            _, t, who, size = message
            self._say_left_out(_time(t), str(who), f"an update of {size:,} bytes")
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
        if kind == "gw":
            snap = message[2]
            if self._gateway is None:
                kept = self._line({"t": t, "k": "gw", "v": snap}, "the gateway")
            elif (change := diff(self._gateway, snap)) is not None:
                kept = self._line({"t": t, "k": "gwd", "v": change}, "the gateway")
            else:
                kept = True
            self._gateway = snap if kept else None  # left out: the next is written whole
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
        body = _encode(record)
        values = json_values(body)
        if (
            len(body) > MAX_RECORD_BYTES
            or self._block_bytes + len(body) + 1 > MAX_INFLATED_BLOCK * share
            or self._block_values + values > MAX_BLOCK_VALUES * share
        ):
            self._say_left_out(record["t"], who, f"an update of {len(body):,} bytes")
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
        if who in self._too_big:
            return
        self._too_big.add(who)
        self._event(
            {**_GAP, "t": t, "subject": who, "message": f"{what} left out: over what a "
             f"recording holds ({MAX_RECORD_BYTES >> 20} MiB a record, "
             f"{MAX_INFLATED_BLOCK >> 20} MiB a block)"}
        )  # fmt: skip

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
        if self._gateway is not None and not self._line(
            {"t": t, "k": "gw", "v": self._gateway}, "the gateway", share
        ):
            self._gateway = None

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
    decode = msgspec.json.Decoder().decode

    def message() -> Any:
        size = _read_exactly(fd, LENGTH.size)
        if size is None:
            return None
        (n,) = LENGTH.unpack(size)
        if n > MAX_MESSAGE_BYTES:
            raise SystemExit(f"recording sink: a message of {n} bytes; the pipe is broken")
        body = _read_exactly(fd, n)
        return None if body is None else decode(body)

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


if __name__ == "__main__":
    sys.exit(run_sink(sys.argv[1]))
