"""One agent per node state folder: an exclusive lock taken before anything is touched.

A second `engineroom agent` started by mistake on the same node and state folder used to
settle the first one's "interrupted" jobs (killing a running drill step and failing its
job) before it found its port taken. Now the agent takes `STATE_DIR/NODE/agent.lock`
with flock(2) first; a second one is refused at once, naming the pid that holds it.

flock belongs to the open file, so the kernel drops it when the agent dies, even by
`kill -9`: a stale lock file never blocks the next agent. The descriptor is not
inherited (Python opens files non-inheritable), so an engine the agent started, which
outlives it, never keeps the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_NAME = "agent.lock"


class StateLocked(Exception):
    """Another process holds the state folder; str() names the folder and its pid."""


class StateLock:
    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def take(cls, state: Path) -> StateLock:
        """Lock `state` for this process, or raise StateLocked naming the holder."""
        state.mkdir(parents=True, exist_ok=True)
        path = state / LOCK_NAME
        # No O_TRUNC: the holder's pid stays readable until the lock is ours.
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder is not None else "a process that wrote no pid"
            raise StateLocked(
                f"{state} is in use by another agent ({who}); one agent per node and state "
                f"folder: stop that one first, or give this one another agent.state_dir"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return cls(path, fd)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _read_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        return int(text) if text else None
    return None
