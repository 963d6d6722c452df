"""Finding engine processes on the node, and which engine owns a GPU process.

A full process scan costs milliseconds, so it runs every few seconds, not every cycle;
between scans the agent only checks that the pids it knows are still the same processes
(a pid can be reused, so the start time must match too).
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from plugins.base import Discovered, EnginePlugin


@dataclass(slots=True)
class EngineProcess:
    kind: str
    pid: int
    create_time: float
    cmdline: list[str]
    where: Discovered


def _listening_ports(proc: psutil.Process) -> list[int]:
    try:
        conns = proc.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return []
    return sorted({c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN and c.laddr})


def scan(plugins: dict[str, EnginePlugin]) -> list[EngineProcess]:
    """Every process on the node that one of the plugins recognises as its server."""
    markers = {kind: p.process_markers for kind, p in plugins.items()}
    found: list[EngineProcess] = []
    for proc in psutil.process_iter(["pid", "cmdline", "create_time"]):
        cmdline = proc.info.get("cmdline") or []
        if not cmdline:
            continue
        joined = " ".join(cmdline[:4])
        for kind, plugin in plugins.items():
            if not any(m in joined for m in markers[kind]):
                continue
            where = plugin.discover(cmdline, _listening_ports(proc))
            if where is not None:
                found.append(
                    EngineProcess(kind, proc.info["pid"], proc.info["create_time"], cmdline, where)
                )
                break
    # A server that forks workers with the same command line: keep the outermost.
    pids = {p.pid for p in found}
    outer = []
    for p in found:
        try:
            parents = {a.pid for a in psutil.Process(p.pid).parents()}
        except psutil.Error:
            parents = set()
        if not parents & pids:
            outer.append(p)
    return outer


def alive(pid: int, create_time: float) -> bool:
    """True while `pid` is still the process that started at `create_time`."""
    try:
        proc = psutil.Process(pid)
        return (
            abs(proc.create_time() - create_time) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
        )
    except psutil.Error:
        return False


class Owners:
    """Maps GPU process pids to the engine whose process tree holds them, and names them.

    Cached per pid (checked against the start time), so a steady GPU costs no psutil work.
    """

    def __init__(self) -> None:
        self._cache: dict[int, tuple[float, list[int], str | None]] = {}

    def _lookup(self, pid: int) -> tuple[list[int], str | None]:
        try:
            proc = psutil.Process(pid)
            created = proc.create_time()
        except psutil.Error:
            return [], None  # another PID namespace (a container), or already gone
        kept = self._cache.get(pid)
        if kept is not None and kept[0] == created:
            return kept[1], kept[2]
        try:
            chain = [pid, *(p.pid for p in proc.parents())]
            name: str | None = proc.name()
        except psutil.Error:
            chain, name = [pid], None
        self._cache[pid] = (created, chain, name)
        return chain, name

    def owner(self, pid: int, engines: dict[int, str]) -> tuple[str | None, str | None]:
        """(engine id, process name) for a GPU process; None where unknown."""
        chain, name = self._lookup(pid)
        for ancestor in chain:
            if ancestor in engines:
                return engines[ancestor], name
        return None, name

    def forget_except(self, pids: set[int]) -> None:
        for pid in list(self._cache):
            if pid not in pids:
                del self._cache[pid]
