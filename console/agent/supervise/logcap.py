"""The log capper: runs one engine and writes its output to a capped, rotated log.

    python -m console.agent.supervise.logcap --max-bytes N --keep K \
        --log PATH --status PATH -- ARGV...

The agent starts this as the leader of a new session, so the engine outlives the agent
(an agent restart or upgrade never kills it) and one signal to the process group reaches
the engine and its workers. The engine writes into a pipe read here rather than into a
pipe held by the agent, whose death would break it.

- SIGTERM, SIGINT and SIGHUP are ignored here: a group SIGTERM stops the engine, and
  this process keeps writing the engine's shutdown lines until it exits.
- `--status` is a JSON file, replaced atomically: `{"engine_pid", "started"}` once the
  engine runs, `first_output` when its first line arrives, then `{"exit_code", "ended"}`
  added when it exits. A restarted agent
  reads an engine's exit code from it; it is not the engine's parent.
- When the log passes `--max-bytes` it becomes PATH.1 (PATH.1 becomes PATH.2 ...), and
  at most `--keep` old files stay. Over-long lines are cut at 64 KiB.

Exits with the engine's exit code, 127 if it could not be started.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

MAX_LINE = 64 * 1024
DRAIN_S = 3.0  # after the engine exits, how long its children may hold the pipe open


def write_status(path: Path, status: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(status))
    os.replace(tmp, path)


class RotatingLog:
    def __init__(self, path: Path, max_bytes: int, keep: int) -> None:
        self.path, self.max_bytes, self.keep = path, max_bytes, keep
        self.file: IO[bytes] = path.open("ab")
        self.size = self.file.tell()

    def write(self, line: bytes) -> None:
        if self.size + len(line) > self.max_bytes and self.size > 0:
            self.rotate()
        self.file.write(line)
        self.file.flush()
        self.size += len(line)

    def rotate(self) -> None:
        self.file.close()
        for i in range(self.keep, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if i == self.keep:
                older.unlink(missing_ok=True)
            else:
                newer = self.path.with_name(f"{self.path.name}.{i + 1}")
                if older.exists():
                    os.replace(older, newer)
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self.file = self.path.open("ab")
        self.size = 0


class Status:
    """The status file, written from the main thread and the reader alike."""

    def __init__(self, path: Path) -> None:
        self.path, self.lock = path, threading.Lock()
        self.data: dict[str, Any] = {}

    def update(self, **values: Any) -> None:
        with self.lock:
            self.data.update(values)
            write_status(self.path, self.data)


def _copy(pipe: IO[bytes], log: RotatingLog, status: Status) -> None:
    first = True
    while True:
        line = pipe.readline(MAX_LINE)
        if not line:
            return
        if first:
            status.update(first_output=time.time())  # a drill step's spawn-to-output time
            first = False
        if not line.endswith(b"\n"):
            line += b"\n"
        log.write(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="engineroom-logcap")
    parser.add_argument("--max-bytes", type=int, required=True)
    parser.add_argument("--keep", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--status", type=Path, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    log = RotatingLog(args.log, args.max_bytes, args.keep)
    status = Status(args.status)
    started = time.time()
    try:
        engine = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            # The engine gets default signal handling back (this process ignores them).
            preexec_fn=_default_signals,
        )
    except OSError as exc:
        log.write(f"engineroom: could not start {command[0]!r}: {exc}\n".encode())
        status.update(engine_pid=None, exit_code=127, error=str(exc), ended=time.time())
        return 127
    status.update(engine_pid=engine.pid, started=started)
    assert engine.stdout is not None
    reader = threading.Thread(target=_copy, args=(engine.stdout, log, status), daemon=True)
    reader.start()
    code = engine.wait()
    reader.join(DRAIN_S)
    status.update(exit_code=code, ended=time.time())
    return code if code >= 0 else 128 - code


def _default_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
