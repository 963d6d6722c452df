"""Signals only to the process the agent means: pid AND start time, checked every time.

A pid is a number the kernel hands out again. The agent keeps pids for a long time (an
engine's record outlives the agent; a dead engine stays listed for minutes), so before
every signal it checks that the pid still belongs to the process that started at the
recorded time (psutil's create_time). For one process the check and the signal go
through a pidfd, which pins the process: if the pid is reused after the check, the
signal fails instead of reaching the newcomer.

A process group has no pidfd. Its id is its leader's pid; the group is the agent's
while that leader runs with the recorded start time, or, once the leader is gone, while
any member is left (the kernel does not hand out a pid that is still a live group's id).
Between that check and killpg there is a window of microseconds in which the last member
would have to exit and a new session leader take the same pid; that is accepted.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable

import psutil

SAME_START_S = 0.01  # create_time is read from /proc in clock ticks; 10 ms apart is another


def same_process(pid: int, created: float) -> bool:
    """True while `pid` is the process that started at `created` (zombies included)."""
    try:
        return abs(psutil.Process(pid).create_time() - created) < SAME_START_S
    except psutil.Error:
        return False


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) members of a process group."""
    pids = []
    for proc in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                pids.append(proc.pid)
    return pids


def group_is_ours(pgid: int, leader_created: float) -> bool:
    """The group led by the process that started at `leader_created` still exists."""
    try:
        leader = psutil.Process(pgid)
        return abs(leader.create_time() - leader_created) < SAME_START_S
    except psutil.NoSuchProcess:
        return bool(group_pids(pgid))  # the leader exited; its group lives on in members
    except psutil.Error:
        return False


def group_alive(pgid: int, leader_created: float) -> bool:
    """Some process of the agent's group `pgid` still runs (zombies do not count).

    Cheap while the leader runs (one /proc read); the scan of every process for members
    only once it has exited (the job runner asks ten times a second during a load)."""
    try:
        leader = psutil.Process(pgid)
        if abs(leader.create_time() - leader_created) >= SAME_START_S:
            return False  # the pid leads another process's group now
        if leader.status() != psutil.STATUS_ZOMBIE:
            return True
    except psutil.NoSuchProcess:
        pass
    except psutil.Error:
        return False
    return bool(group_pids(pgid))


def signal_process(pid: int, created: float, sig: signal.Signals) -> bool:
    """Send `sig` to `pid` if it is still the process that started at `created`.

    False when it is gone or is another process now: nothing was sent."""
    return _through_pidfd(pid, sig, lambda: same_process(pid, created))


def signal_member(pid: int, pgid: int, leader_created: float, sig: signal.Signals) -> bool:
    """Send `sig` to `pid` if it is a member of the agent's group `pgid`."""

    def ours() -> bool:
        try:
            return os.getpgid(pid) == pgid and group_is_ours(pgid, leader_created)
        except OSError:
            return False

    return _through_pidfd(pid, sig, ours)


def signal_group(pgid: int, leader_created: float, sig: signal.Signals) -> bool:
    """Send `sig` to the whole group `pgid` if it is still the agent's; False if not."""
    if not group_is_ours(pgid, leader_created):
        return False
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _through_pidfd(pid: int, sig: signal.Signals, check: Callable[[], bool]) -> bool:
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return False  # no such process
    try:
        # The pidfd holds this process: checked now, it is the one the signal reaches.
        if not check():
            return False
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except OSError:  # ProcessLookupError (it exited), PermissionError
        return False
    finally:
        os.close(pidfd)
