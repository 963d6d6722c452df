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

from console.collect.recording import (
    EVENTS,
    FORMAT,
    HEAD,
    HEADER,
    KEY,
    MAGIC,
    MORE,
    VERSION,
    RecordingError,
    diff,
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
        head = {
            "format": FORMAT,
            "version": VERSION,
            "started": time.time(),
            "by": by,
            "keyframe_s": keyframe_s,
            "flush_s": flush_s,
            "fleet_source": fleet_source,
            "fleet_text": fleet_text,
        }
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
        if item[0] == "node":
            _, t, name, snap, status, error = item
            if snap is None:
                raw = msgspec.Raw(b"null")
            elif isinstance(snap, BaseModel):  # the agent's pydantic model
                raw = msgspec.Raw(pydantic_core.to_json(snap))
            else:  # the console's msgspec struct, or a dict: encoded as it is
                raw = msgspec.Raw(_encode(snap))
            return _encode(["node", t, name, status, error, raw])
        return _encode(list(item))

    def _send(self, body: bytes) -> None:
        self._write(_framed(body))

    def _write(self, data: bytes) -> None:
        self._pipe.write(data)
        self._pipe.flush()


def _framed(body: bytes) -> bytes:
    return LENGTH.pack(len(body)) + body


# -- the sink: its own process ----------------------------------------------------------


class Sink:
    """Turns updates into frames: diffs, one zlib stream per keyframe block, a frame a
    second, events apart (console/collect/recording.py reads them)."""

    def __init__(self, file: Any, head: dict[str, Any]) -> None:
        self.file = file
        self.keyframe_s = float(head.get("keyframe_s", 20.0))
        self.flush_s = float(head.get("flush_s", 1.0))
        self._nodes: dict[str, Any] = {}  # the last snapshot written, as JSON
        self._node_seen: dict[str, float] = {}
        self._status: dict[str, tuple[str | None, str | None]] = {}
        self._gateway: dict[str, Any] | None = None
        self._records: list[bytes] = []
        self._events: list[dict[str, Any]] = []
        self._zip: Any = None
        self._block_new = False
        self._block_started = 0.0
        self._dropped_said = 0
        self._first = 0.0
        self._last = 0.0
        self._frame(HEAD, json.dumps(head).encode(), head["started"], head["started"])
        self.file.flush()

    def take(self, message: list[Any]) -> None:
        kind = message[0]
        if kind == "event":
            event = message[1]
            self._events.append(event)
            return
        if kind == "dropped":
            _, t, count = message
            self._events.append(
                {"t": t, "kind": "gap", "severity": "warning", "subject": "recording",
                 "message": f"{count - self._dropped_said} updates dropped: "
                 "the recording queue was full"}
            )  # fmt: skip
            self._dropped_said = count
            return
        t = float(message[1])
        if self._zip is None or t - self._block_started >= self.keyframe_s:
            self._start_block(t)
        self._last = max(self._last, t)
        if kind == "gw":
            snap = message[2]
            if self._gateway is None:
                self._line({"t": t, "k": "gw", "v": snap})
            elif (change := diff(self._gateway, snap)) is not None:
                self._line({"t": t, "k": "gwd", "v": change})
            self._gateway = snap
            return
        _, t, name, status, error, data = message
        if status is not None and (status, error) != self._status.get(name, (None, None)):
            self._status[name] = (status, error)
            self._line({"t": t, "k": "node", "n": name, "status": status, "error": error})
        if data is None:
            return
        old = self._nodes.get(name)
        if old is None:
            self._line({"t": t, "k": "snap", "n": name, "v": data})
        else:
            # An unchanged snapshot is still a sign of life: the replay ages nodes by it.
            self._line({"t": t, "k": "diff", "n": name, "v": diff(old, data) or {}})
        self._nodes[name] = data
        self._node_seen[name] = t

    def _line(self, record: dict[str, Any]) -> None:
        if not self._records:
            self._first = record["t"]
        self._records.append(_encode(record))

    def _start_block(self, t: float) -> None:
        """End the block; the next opens a new zlib stream with everything known, whole."""
        if self._zip is not None:
            self.flush()
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

    def flush(self) -> None:
        if self._records and self._zip is not None:
            raw = b"\n".join(self._records) + b"\n"
            payload = self._zip.compress(raw) + self._zip.flush(zlib.Z_SYNC_FLUSH)
            kind = KEY if self._block_new else MORE
            self._block_new = False
            self._frame(kind, payload, self._first, max(self._last, self._first))
            self._records = []
        if self._events:
            raw = b"\n".join(_encode(e) for e in self._events)
            times = [float(e.get("t") or 0) for e in self._events]
            self._frame(EVENTS, zlib.compress(raw, 6), min(times), max(times))
            self._events = []
        # In the kernel's hands: a kill -9 of this process or the console loses nothing.
        self.file.flush()

    def _frame(self, kind: int, payload: bytes, first: float, last: float) -> None:
        head = HEADER.pack(MAGIC, kind, len(payload), first, last, zlib.crc32(payload))
        self.file.write(head + payload)


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
