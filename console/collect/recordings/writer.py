"""Writing a recording without slowing the console: the work happens in another process.

The console's side (RecordingWriter) puts each update on a bounded queue and returns; a
thread serializes it (a snapshot's JSON straight from pydantic-core) and writes it, length
prefixed, down a pipe to `python -m console.collect.recordings.sink`, the sink, which
diffs each snapshot against the node's last, compresses, and appends a frame to the file
every second (console/collect/recordings/format.py has the format). Measured at 1,000 nodes
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
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pydantic_core
from pydantic import BaseModel

from console.collect.recordings.format import FORMAT, MAX_HEAD_BYTES, VERSION, RecordingError
from console.collect.recordings.sink import LENGTH, MAX_MESSAGE_BYTES

if TYPE_CHECKING:
    from console.core.snapshot import Snapshot

_STOP = object()
BATCH = 2048  # updates sent down the pipe in one write, at most
FEED_EVERY_S = 0.1
_encode = msgspec.json.Encoder().encode


class RecordingWriter:
    """Appends to a recording through a sink process; the caller never waits.

    `node`, `gateway`, `rollouts` and `event` put one item on a queue of `queue_limit` and return at
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
            [sys.executable, "-m", "console.collect.recordings.sink", str(self.path)],
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

    def rollouts(self, value: dict[str, Any], t: float | None = None) -> bool:
        """The gateway's rollouts as a recording keeps them (recording_rollouts.kept)."""
        return self._put(("ro", time.time() if t is None else t, value))

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
                        for body in self._messages(item):
                            out += _framed(body)
                if out:
                    self._write(bytes(out))
                if batch[-1] is _STOP:
                    return
        except (BrokenPipeError, OSError):
            return  # the sink is gone (killed with us): nothing more can be written

    @staticmethod
    def _messages(item: tuple[Any, ...]) -> list[bytes]:
        """The item for the pipe. One that cannot be encoded (a config nested a thousand
        deep) or is over MAX_MESSAGE_BYTES goes as a note that it was left out (the node's
        status still goes), which the sink writes into the file: it never ends this
        thread, nor the sink."""
        kind, t = item[0], item[1] if item[0] != "event" else None
        whose = {"gw": "the gateway", "ro": "the gateway's rollouts"}
        who = item[2] if kind == "node" else whose.get(kind, "an event")
        try:
            if kind == "node":
                _, _, name, snap, status, error = item
                if snap is None:
                    raw = msgspec.Raw(b"null")
                elif isinstance(snap, BaseModel):  # the agent's pydantic model
                    raw = msgspec.Raw(pydantic_core.to_json(snap))
                else:  # the console's msgspec struct, or a dict: encoded as it is
                    raw = msgspec.Raw(_encode(snap))
                body = _encode(["node", t, name, status, error, raw])
            else:
                body = _encode(list(item))
        except (RecursionError, TypeError, ValueError, OverflowError) as exc:
            what = f"an update that does not encode ({exc.__class__.__name__})"
        else:
            if len(body) <= MAX_MESSAGE_BYTES:
                return [body]
            what = f"an update of {len(body):,} bytes, over the {MAX_MESSAGE_BYTES >> 20} MiB"
            what += " the sink takes"
        note = _encode(["left_out", t, str(who), what])
        if kind == "node":  # its status and error, without the snapshot
            return [note, _encode(["node", t, item[2], item[4], item[5], None])]
        return [note]

    def _send(self, body: bytes) -> None:
        self._write(_framed(body))

    def _write(self, data: bytes) -> None:
        self._pipe.write(data)
        self._pipe.flush()


def _framed(body: bytes) -> bytes:
    return LENGTH.pack(len(body)) + body
