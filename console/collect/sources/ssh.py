"""Agentless nodes: read a host over SSH (asyncssh), as an engineer would by hand.

A node with `ssh = "user@host"` is read by running `engineroom agent --once --json` on
it (the node's `ssh_agent_command`). Where that is not installed (exit 127), the console
falls back to `nvidia-smi --query-gpu=... --format=csv` and a process listing, and the
snapshot says what it cannot show (`missing`).

- One connection per host, kept across refreshes and reopened when it drops.
- At most `fleet.ssh_concurrency` sessions run at once; each refresh of a host has its
  own deadline (`fleet.ssh_timeout_s`, connect included), so a host that hangs before
  its banner costs a timeout, never a stalled console.
- Host keys are checked against `ssh_known_hosts` (default ~/.ssh/known_hosts) with
  asyncssh's own matching (hashed entries, wildcards, @cert-authority, @revoked; see
  ssh_hostkeys.py). An unknown or changed key is an error naming the host and the
  fingerprint it presented. `ssh_trust_on_first_use = true` adds a host that no line of
  the file matches (never one whose key changed).
- A remote command's output is read as it arrives and never kept past `MAX_OUTPUT`: a
  host that prints more gets its session closed and an error naming the cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import os
import shlex
import time
from pathlib import Path

from console.collect.prometheus.check import gpu_index
from console.collect.sources.ssh_hostkeys import HostKeyPolicy
from console.collect.sources.sshlib import asyncssh
from console.core.config.load import Fleet, Node
from console.core.metrics.promtext import finite
from console.core.plugin import plugin_kinds
from console.core.snapshot import (
    Gpu,
    GpuProcess,
    Host,
    NodeInfo,
    Snapshot,
    SnapshotError,
    decode_snapshot,
)
from console.core.units import exact_size_from_bytes

MAX_OUTPUT = 16 * 1024 * 1024  # per stream and read; a snapshot is far smaller
STDERR_TAIL = 4096  # of stderr only the end is kept: its last line is the reason
READ_CHUNK = 64 * 1024
NOT_FOUND = 127  # the shell's "command not found"

GPU_FIELDS = (
    "index,uuid,name,utilization.gpu,utilization.memory,memory.used,memory.total,"
    "temperature.gpu,power.draw,power.limit,clocks.sm,clocks.mem,driver_version"
)
APP_FIELDS = "pid,used_memory,gpu_uuid,process_name"
# One remote command, three parts split by a marker: fewer round trips than three runs.
FALLBACK = (
    f"nvidia-smi --query-gpu={GPU_FIELDS} --format=csv,noheader,nounits; echo '@@exit' $?; "
    f"nvidia-smi --query-compute-apps={APP_FIELDS} --format=csv,noheader,nounits; "
    "echo '@@ps'; ps -eo pid=,args=; echo '@@host'; uname -n"
)


class SshError(Exception):
    """Why an SSH read failed, worded for the node row."""


def _target(node: Node) -> tuple[str | None, str]:
    user, _, host = (node.ssh or "").rpartition("@")
    return user or None, host


class SshReader:
    def __init__(self, fleet: Fleet, node: Node, sessions: asyncio.Semaphore) -> None:
        self.fleet = fleet
        self.node = node
        self.user, self.host = _target(node)
        self.port = node.ssh_port or 22
        self.known_hosts = Path(node.ssh_known_hosts or "~/.ssh/known_hosts").expanduser()
        self.sessions = sessions
        self.timeout_s = fleet.fleet.ssh_timeout_s
        self.max_output = MAX_OUTPUT  # bytes per stream and read (tests lower it)
        self._conn: asyncssh.SSHClientConnection | None = None
        self.command = shlex.join(node.ssh_agent_command)

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            with contextlib.suppress(Exception):
                await self._conn.wait_closed()
            self._conn = None

    async def snapshot(self) -> Snapshot:
        """One reading of the host; raises SshError, within the timeout."""
        async with self.sessions:
            try:
                async with asyncio.timeout(self.timeout_s):
                    return await self._read()
            except TimeoutError:
                await self.close()
                stage = "connect (no SSH banner?)" if self._conn is None else "answer"
                raise SshError(f"ssh {self.host}: no {stage} within {self.timeout_s:g} s") from None

    async def _read(self) -> Snapshot:
        conn = await self._connection()
        status, out, err = await self._run(conn, self.command, f"`{self.command}`")
        if status == 0:
            return self._parse(out)
        if status == NOT_FOUND:
            return await self._fallback(conn)
        lines = _text(err).strip().splitlines()
        raise SshError(
            f"ssh {self.host}: `{self.command}` exited {status}"
            + (f": {lines[-1][:200]}" if lines else "")
        )

    async def _run(
        self, conn: asyncssh.SSHClientConnection, command: str, what: str
    ) -> tuple[int | None, bytes, bytes]:
        """Run `command`; its exit status, its stdout and the tail of its stderr.

        Output is read as it arrives, never more than `max_output` bytes of either
        stream: past that, the session is closed (the remote command gets SIGPIPE on its
        next write) and SshError names the host and the cap."""
        try:
            async with conn.create_process(command, encoding=None) as process:
                out = asyncio.create_task(_drain(process.stdout, self.max_output))
                err = asyncio.create_task(_drain(process.stderr, self.max_output, STDERR_TAIL))
                try:
                    pending = {out, err}
                    while pending:
                        done, pending = await asyncio.wait(
                            pending, return_when=asyncio.FIRST_COMPLETED
                        )
                        if any(task.result()[1] for task in done):
                            with contextlib.suppress(asyncssh.Error, OSError):
                                process.kill()  # where the server honours signals
                            process.close()
                            raise SshError(
                                f"ssh {self.host}: {what} printed over "
                                f"{exact_size_from_bytes(self.max_output)} "
                                "(the output cap): stopped reading and closed the session"
                            )
                finally:
                    for task in (out, err):
                        task.cancel()
                completed = await process.wait()
        except (asyncssh.Error, OSError) as exc:
            await self.close()  # the next refresh reconnects
            raise SshError(f"ssh {self.host}: session failed: {_why(exc)}") from None
        return completed.exit_status, out.result()[0], err.result()[0]

    def _parse(self, out: bytes) -> Snapshot:
        try:
            snap = decode_snapshot(out)
        except SnapshotError as exc:
            raise SshError(
                f"ssh {self.host}: `{self.command}` printed no snapshot "
                f"({exc}; starts {_text(out[:40])!r})"
            ) from None
        snap.node.name = self.node.name
        snap.source = "ssh"
        snap.cycle["interval_s"] = self.fleet.fleet.ssh_refresh_s
        return snap

    async def _connection(self) -> asyncssh.SSHClientConnection:
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        self._conn = None
        try:
            policy = HostKeyPolicy.load(self.known_hosts, self.node.ssh_trust_on_first_use)
        except ValueError as exc:
            raise SshError(f"ssh {self.host}: {exc}") from None
        try:
            self._conn = await asyncssh.connect(
                self.host,
                port=self.port,
                username=self.user,
                client_keys=[os.path.expanduser(self.node.ssh_key)] if self.node.ssh_key else (),
                known_hosts=policy.known,
                client_factory=lambda: policy,
                agent_path=None,
                config=None,
                keepalive_interval=30,
            )
        except asyncssh.HostKeyNotVerifiable as exc:
            raise SshError(f"ssh {self.host}:{self.port}: {policy.refusal or _why(exc)}") from None
        except asyncssh.PermissionDenied:
            raise SshError(f"ssh {self.node.ssh}: permission denied (key refused)") from None
        except (asyncssh.Error, OSError) as exc:
            hint = policy.certificate_only(self.host, self.port)
            raise SshError(
                f"ssh {self.host}:{self.port}: {_why(exc)}" + (f" ({hint})" if hint else "")
            ) from None
        return self._conn

    async def _fallback(self, conn: asyncssh.SSHClientConnection) -> Snapshot:
        """No engineroom on the host: GPUs from nvidia-smi, engines from the process list."""
        _, raw, _ = await self._run(conn, FALLBACK, "the fallback commands (nvidia-smi, ps)")
        out = _text(raw)
        gpu_part, _, rest = out.partition("@@exit ")
        code, _, rest = rest.partition("\n")
        apps_part, _, rest = rest.partition("@@ps\n")
        ps_part, _, hostname = rest.partition("@@host\n")
        processes = _processes(ps_part)
        gpus, driver, gpu_status = _gpus(gpu_part, code.strip(), apps_part, processes)
        engines = sorted(
            f"{kind} pid {pid}"
            for pid, args in processes.items()
            for kind, plugin in plugin_kinds().items()
            if any(m in args for m in plugin.process_markers)
        )
        missing = [
            f"engines: `{self.node.ssh_agent_command[0]}` is not installed on {self.host}, so "
            "no engine is probed"
            + (f" (running: {', '.join(engines[:6])})" if engines else " (none running)"),
            "host CPU, memory and disks",
            "GPU ECC, clock reasons and XID events",
        ]
        return Snapshot(
            node=NodeInfo(
                name=self.node.name,
                agent_version="none (nvidia-smi over SSH)",
                time=time.time(),
                hostname=hostname.strip() or self.host,
            ),
            host=Host(),
            gpu_status=gpu_status,
            driver_version=driver,
            gpus=gpus,
            cycle={"interval_s": self.fleet.fleet.ssh_refresh_s},
            source="ssh nvidia-smi",
            missing=missing,
        )


def _processes(text: str) -> dict[int, str]:
    out = {}
    for line in text.splitlines():
        pid, _, args = line.strip().partition(" ")
        if (number := _pid(pid)) is not None:
            out[number] = args.strip()
    return out


# What the host prints is outside text: a cell that is not a number in range is unknown.
# Before, "²" as a GPU index or a pid (a digit to str.isdigit, not to int) and "inf" or
# 1e308 MiB (past any int) raised out of the read, and the node's refresh loop died.
MAX_READING = 1e12
MAX_MIB = 2**30  # a PiB


def _num(value: str) -> float | None:
    """A reading: unknown for "[N/A]", "[Not Supported]", and anything that is not a
    finite number from 0 to MAX_READING, never 0."""
    number = finite(value)
    return number if number is not None and 0 <= number <= MAX_READING else None


def _mib(value: str) -> int | None:
    """MiB as bytes (None: unknown)."""
    number = _num(value)
    return None if number is None or number > MAX_MIB else int(number * 2**20)


def _pid(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 10 else None


def _gpus(
    text: str, code: str, apps: str, processes: dict[int, str]
) -> tuple[list[Gpu], str | None, str]:
    if code != "0":
        status = "nvidia-smi not found" if code == "127" else f"nvidia-smi exited {code}"
        first = text.strip().splitlines()[:1]
        return [], None, status + (f": {first[0][:160]}" if first and code != "127" else "")
    by_uuid: dict[str, list[GpuProcess]] = {}
    for row in csv.reader(io.StringIO(apps)):
        pid = _pid(row[0].strip()) if len(row) >= 3 else None
        if pid is None:
            continue
        name = processes.get(pid, row[3].strip() if len(row) > 3 else "").split(" ")[0]
        by_uuid.setdefault(row[2].strip(), []).append(
            GpuProcess(
                pid=pid,
                used_memory_bytes=_mib(row[1]),
                name=os.path.basename(name) or None,
            )
        )
    gpus, driver = [], None
    for row in csv.reader(io.StringIO(text)):
        row = [c.strip() for c in row]
        index = gpu_index(row[0]) if len(row) >= 13 else None
        if index is None:
            continue
        sm, mem = _num(row[10]), _num(row[11])
        gpus.append(
            Gpu(
                index=index,
                uuid=row[1],
                name=row[2],
                utilization_pct=_num(row[3]),
                memory_utilization_pct=_num(row[4]),
                memory_used_bytes=_mib(row[5]),
                memory_total_bytes=_mib(row[6]),
                temperature_c=_num(row[7]),
                power_w=_num(row[8]),
                power_limit_w=_num(row[9]),
                sm_clock_mhz=None if sm is None else int(sm),
                mem_clock_mhz=None if mem is None else int(mem),
                processes=by_uuid.get(row[1], []),
            )
        )
        driver = row[12] or driver
    if not gpus:
        return [], driver, f"nvidia-smi printed no GPU rows ({text.strip()[:80]!r})"
    return gpus, driver, "ok"


async def _drain(stream: asyncssh.SSHReader[bytes], cap: int, keep: int = 0) -> tuple[bytes, bool]:
    """Read `stream` to its end: (what was kept, whether it went over `cap` bytes).

    `keep` > 0 keeps only the last `keep` bytes (stderr: the last line is the reason)."""
    data = bytearray()
    total = 0
    while chunk := await stream.read(READ_CHUNK):
        total += len(chunk)
        if total > cap:
            return bytes(data), True
        data += chunk
        if keep and len(data) > keep:
            del data[:-keep]
    return bytes(data), False


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) else ""


def _why(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    text = str(exc) or exc.__class__.__name__
    return text[:200]
