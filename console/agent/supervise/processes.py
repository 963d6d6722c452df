"""The agent's processes: stopping them, and reading their logs. One place for both.

Stopping is always the same story: SIGTERM, wait up to a grace for the process (or its
whole group) to go, then SIGKILL the group and wait, a bounded time, for it to be gone.
Every signal goes through console.agent.supervise.signals, which checks the pid (group) still
belongs to the process that started at the recorded time. The grace is a setting: a
profile's `stop_grace_s` for an engine it launched, else `[agent] stop_grace_s`.

Logs are read from their end (`tail`), from an offset (`since`), or as the complete lines
appended since an offset (`new_lines`); each read is bounded in bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from console.agent.snapshot.discovery import alive as process_alive
from console.agent.supervise.signals import group_alive, signal_group, signal_member, signal_process

POLL_S = 0.1
REAP_S = 10.0  # after a SIGKILL, how long to wait for the group to be gone
TAIL_LINES = 30  # what a failed step or load shows of its log
TAIL_MAX_BYTES = 64 * 1024
READ_MAX_BYTES = 4 << 20  # one read of a log's new part


@dataclass(frozen=True, slots=True)
class Group:
    """A process group the agent started: its id (the leader's pid) and the leader's
    start time, so that a pid the kernel handed out again is never mistaken for it."""

    pgid: int
    created: float

    @classmethod
    def of(cls, pid: int) -> Group:
        """The group a child just started in a session of its own leads."""
        return cls(pid, created(pid))

    def alive(self) -> bool:
        return group_alive(self.pgid, self.created)


async def terminate(
    group: Group,
    grace_s: float,
    *,
    main_pid: int | None = None,
    alive: Callable[[], bool] | None = None,
) -> str:
    """SIGTERM, then SIGKILL the whole group after `grace_s`; what happened, in words.

    With `main_pid` only that member gets the SIGTERM (like systemd's KillMode=mixed: an
    engine's own process orchestrates its shutdown; a SIGTERM to all of vLLM reached its
    engine core alongside the API server and, measured here, could leave it waiting 25 s
    for a shutdown the API server then forced). `alive` replaces the group check where
    the caller must also reap the leader (a Popen it holds)."""
    is_alive = alive or group.alive
    if main_pid is None or not signal_member(main_pid, group.pgid, group.created, signal.SIGTERM):
        signal_group(group.pgid, group.created, signal.SIGTERM)
    return await _wait_then_kill(
        is_alive, grace_s, lambda: signal_group(group.pgid, group.created, signal.SIGKILL)
    )


async def terminate_process(pid: int, created: float, grace_s: float) -> str:
    """A process the agent found rather than started (by its pid and the start time it
    was found with): its whole group if it leads one, else just it."""
    if _leads_group(pid):
        if not Group(pid, created).alive():
            return f"process {pid} had already exited (or its pid is another process now)"
        return await terminate(Group(pid, created), grace_s)
    if not signal_process(pid, created, signal.SIGTERM):
        return f"process {pid} had already exited (or its pid is another process now)"
    return await _wait_then_kill(
        lambda: process_alive(pid, created),
        grace_s,
        lambda: signal_process(pid, created, signal.SIGKILL),
    )


async def _wait_then_kill(
    alive: Callable[[], bool], grace_s: float, kill: Callable[[], object]
) -> str:
    started = time.monotonic()
    while time.monotonic() - started < grace_s:
        if not alive():
            return f"exited {time.monotonic() - started:.1f} s after SIGTERM"
        await asyncio.sleep(POLL_S)
    kill()
    while alive() and time.monotonic() - started < grace_s + REAP_S:
        await asyncio.sleep(POLL_S)
    return f"did not exit within {grace_s:g} s of SIGTERM: killed (SIGKILL)"


def kill_now(group: Group) -> bool:
    """SIGKILL a group a killed agent left running (only if it is still that group)."""
    return signal_group(group.pgid, group.created, signal.SIGKILL)


def created(pid: int) -> float:
    """A process's start time (0.0 if it is gone: no group check will then match it)."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return 0.0


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


async def capped_output(
    proc: asyncio.subprocess.Process, limit: int, timeout_s: float
) -> bytes | None:
    """A child's whole stdout once it exits (it leads its own session); None, with its
    group killed, if it writes more than `limit` bytes or runs past `timeout_s`."""
    group = Group.of(proc.pid)
    assert proc.stdout is not None
    stdout = proc.stdout

    async def whole() -> bytes | None:
        data = bytearray()
        while chunk := await stdout.read(64 * 1024):
            data += chunk
            if len(data) > limit:
                return None
        await proc.wait()
        return bytes(data)

    try:
        out = await asyncio.wait_for(whole(), timeout_s)
    except TimeoutError:
        out = None
    if out is None:
        kill_now(group)
        # Read what is left: a pipe whose reading paused at the limit never reports its
        # end, and wait() would wait for it for ever. Its writers are dead: little is left.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.communicate(), REAP_S)
    return out


# -- logs -------------------------------------------------------------------------------


def tail(path: Path, lines: int = TAIL_LINES, max_bytes: int = TAIL_MAX_BYTES) -> list[str]:
    """The last `lines` lines of a log (reads only its last `max_bytes`)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    text = data.decode(errors="replace").splitlines()
    if size > max_bytes and text:
        text = text[1:]  # the first line was cut by the seek
    return text[-lines:]


def since(path: Path, offset: int, limit: int = READ_MAX_BYTES) -> str:
    """What a log holds from `offset` on (at most `limit` bytes)."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(limit).decode(errors="replace")
    except OSError:
        return ""


def tail_since(path: Path, offset: int, lines: int = TAIL_LINES) -> list[str]:
    """The last `lines` lines written from `offset` on: one step's share of a shared log."""
    return since(path, offset).splitlines()[-lines:]


def new_lines(path: Path, offset: int) -> tuple[int, list[str]]:
    """Complete lines appended to `path` since `offset` (restarts at 0 after a rotation)."""
    try:
        size = path.stat().st_size
        if size < offset:
            offset = 0
        if size == offset:
            return offset, []
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read(min(size - offset, READ_MAX_BYTES))
    except OSError:
        return offset, []
    end = data.rfind(b"\n") + 1
    if end == 0 and len(data) == READ_MAX_BYTES:
        end = len(data)  # a line longer than one read: given in pieces, never waited on
    return offset + end, data[:end].decode(errors="replace").splitlines()
