"""The gateway under a long, unkind load: does it end as it started?

    make bench        (or: .venv/bin/python -m bench.gateway_soak [--minutes N] [--streams 64])

The real gateway (`engineroom gateway`) in front of two deployments of one model, each an
ENGINE DOUBLE (tests/engine_double.py: a vLLM-shaped server streaming 32 chunks of 2 KiB,
10 ms apart), weights 50/50, auto_failover on. 64 clients keep a stream each open for the
whole run: most read at once and reuse their connection, one in eight reads slowly
through a 4 KiB receive buffer, one in eight vanishes mid-stream (half with a reset).
Every minute one engine is killed with -9 and restarted, the two in turn, so traffic fails
over and back.

Sampled every 5 s: the gateway's RSS and open descriptors (psutil), its in-flight count
per deployment (/admin/snapshot, which the console polls too). The verdict compares the
last quarter of the run with the first quarter after a 45 s warm-up (the gateway's 30 s
measurement windows fill), under the same load: RSS and descriptors must end flat
(at most +10% and +8 MiB; at most +16 descriptors), in-flight must drain to 0 once the
load stops, and no request may fail except the streams an engine kill cut (those get the
gateway's error event). Exit status 1 when the verdict fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.engines.servers import free_ports, log_tail, stop, wait_until  # noqa: E402

ADMIN = "soak-admin-token-0123456789"
MIB = 1024 * 1024
REQUEST_DEADLINE_S = 30.0  # a request that takes longer has hung
SAMPLE_EVERY_S = 5.0
WARMUP_S = 45.0  # the gateway's windows (window_s = 30) fill, its pools grow to the load
FLEET = """
[fleet]
name = "soak"
[gateway]
url = "http://127.0.0.1:{port}"
state_dir = "{dir}/gateway-state"
health_interval_s = 0.5
window_s = 30.0
[[nodes]]
name = "local"
agent = "http://127.0.0.1:9"
[[models]]
name = "tiny"
auto_failover = true
  [[models.deployments]]
  id = "a"
  node = "local"
  engine = "vllm"
  endpoint = "http://127.0.0.1:{a}"
  weight = 50
  [[models.deployments]]
  id = "b"
  node = "local"
  engine = "vllm"
  endpoint = "http://127.0.0.1:{b}"
  weight = 50
"""
BODY = b'{"model": "tiny", "prompt": "hi", "max_tokens": 32, "stream": true}'


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    running: int = 0
    last_failures: list[str] = field(default_factory=list)

    def fail(self, what: str, detail: str) -> None:
        self.outcomes[what] += 1
        if len(self.last_failures) < 10:
            self.last_failures.append(f"{what}: {detail[:200]}")


@dataclass
class Sample:
    t: float
    rss: int
    fds: int
    inflight: int
    running: int


# -- clients ------------------------------------------------------------------------------


class Stream:
    """One client connection speaking just enough HTTP/1.1 for a streamed completion."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, slow: bool) -> Stream:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if slow:  # a small window: the gateway's writes back up quickly
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        except OSError:
            sock.close()
            raise
        reader, writer = await asyncio.open_connection(sock=sock, limit=4096 if slow else 65536)
        return cls(reader, writer)

    async def post(self) -> tuple[int, dict[str, str]]:
        self.writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(BODY)).encode()
            + b"\r\n\r\n"
            + BODY
        )
        await self.writer.drain()
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
        fields = dict(line.split(":", 1) for line in head[1:] if ":" in line)
        return status, {k.strip().lower(): v.strip() for k, v in fields.items()}

    async def chunks(self, fields: dict[str, str]):  # type: ignore[no-untyped-def]
        """The body's chunks (chunked transfer) or the whole body (Content-Length)."""
        if "content-length" in fields:
            yield await self.reader.readexactly(int(fields["content-length"]))
            return
        while True:  # bounded by the stream's end or the request's deadline
            size = int((await self.reader.readline()).split(b";")[0], 16)
            if size == 0:
                await self.reader.readline()
                return
            yield (await self.reader.readexactly(size + 2))[:-2]

    def close(self, reset: bool = False) -> None:
        if reset:  # SO_LINGER 0: the close sends a reset, as a killed client's kernel does
            sock = self.writer.get_extra_info("socket")
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00" * 2)
            self.writer.transport.abort()
        else:
            self.writer.close()


async def one_request(stream: Stream, kind: str, n: int, tally: Tally) -> bool:
    """One streamed completion; True when the connection can carry the next one."""
    status, fields = await stream.post()
    body = b""
    seen = 0
    async for chunk in stream.chunks(fields):
        body += chunk[-200:]  # the end is what is checked
        seen += 1
        if kind == "slow":
            await asyncio.sleep(0.01)
        elif kind == "vanish" and seen == 2 + n % 3:
            stream.close(reset=n % 2 == 0)
            tally.outcomes["vanished (on purpose)"] += 1
            return False
    if status != 200:
        tally.fail(f"HTTP {status}", body.decode(errors="replace"))
        return fields.get("connection", "").lower() != "close"
    if b"stopped mid-answer" in body:
        tally.outcomes["cut by an engine kill"] += 1
        return False
    if not body.rstrip().endswith(b"data: [DONE]"):
        tally.fail("ended without [DONE]", body.decode(errors="replace"))
        return False
    tally.outcomes["ok"] += 1
    return kind == "normal"


async def client(i: int, port: int, until: float, tally: Tally) -> None:
    kind = "slow" if i % 8 == 0 else "vanish" if i % 8 == 1 else "normal"
    stream: Stream | None = None
    n = 0
    while time.monotonic() < until:  # bounded by the run's end
        n += 1
        tally.running += 1
        try:
            if stream is None:
                stream = await asyncio.wait_for(Stream.open(port, kind == "slow"), 10)
            keep = await asyncio.wait_for(one_request(stream, kind, n, tally), REQUEST_DEADLINE_S)
        except TimeoutError:
            tally.fail("hung", f"client {i} ({kind}) request {n}")
            keep = False
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
            tally.fail("broken", f"client {i} ({kind}): {exc.__class__.__name__}: {exc}")
            keep = False
        finally:
            tally.running -= 1
        if not keep and stream is not None:
            stream.close()
            stream = None
    if stream is not None:
        stream.close()


# -- processes -----------------------------------------------------------------------------


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=ROOT, start_new_session=True)  # fmt: skip


def start_engine(port: int, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "tests/engine_double.py", f"vllm:{port}",
            "--chunks", "32", "--delay", "0.01", "--chunk-bytes", "2048"]  # fmt: skip
    log.write_text("")
    process = spawn(argv, log)
    wait_until(lambda: "listening" in log.read_text(), 20, what=f"engine on {port}")
    return process


class Admin:
    def __init__(self, url: str) -> None:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        self.http = httpx.AsyncClient(base_url=url, headers=headers, timeout=10, trust_env=False)

    async def deployments(self) -> dict[str, dict]:
        """Per deployment: weight, up, in flight and the windowed measures. The console
        polls this every refresh; reading it is also what trims the gateway's windows."""
        snapshot = (await self.http.get("/admin/snapshot")).json()
        return dict(snapshot["models"]["tiny"])

    async def wait(self, predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not predicate(await self.deployments()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:g} s")
            await asyncio.sleep(0.2)


async def kill_and_restart(
    engines: dict[str, subprocess.Popen[bytes]], ports: dict[str, int], work: Path,
    admin: Admin, every: float, t0: float, until: float, log: list[str],
) -> None:  # fmt: skip
    """Every `every` s (the first at half of it): kill -9 one engine, the two in turn, and
    start it again once the gateway has seen it go."""
    next_kill = time.monotonic() + every / 2
    turn = 0
    while next_kill < until - 10:  # bounded by the run's end
        await asyncio.sleep(max(0.0, next_kill - time.monotonic()))
        victim = "ab"[turn % 2]
        turn += 1
        started = time.monotonic()
        os.killpg(engines[victim].pid, signal.SIGKILL)
        engines[victim].wait(10)
        await admin.wait(lambda d, v=victim: not d[v]["up"], 15, f"{victim} seen down")
        engines[victim] = await asyncio.to_thread(
            start_engine, ports[victim], work / f"{victim}.log"
        )
        await admin.wait(lambda d, v=victim: d[v]["up"], 30, f"{victim} seen up again")
        weights = {k: v["weight"] for k, v in (await admin.deployments()).items()}
        log.append(
            f"  t={started - t0:5.0f} s: killed {victim}; back in "
            f"{time.monotonic() - started:.1f} s; weights now {weights}"
        )
        next_kill += every


async def sample(gateway: psutil.Process, admin: Admin, tally: Tally, t0: float) -> Sample:
    deployments = await admin.deployments()
    return Sample(
        time.monotonic() - t0,
        gateway.memory_info().rss,
        gateway.num_fds(),
        sum(d["inflight"] for d in deployments.values()),
        tally.running,
    )


async def soak(args: argparse.Namespace, gw_port: int, gateway: psutil.Process,
               engines: dict[str, subprocess.Popen[bytes]], ports: dict[str, int],
               work: Path) -> int:  # fmt: skip
    admin = Admin(f"http://127.0.0.1:{gw_port}")
    tally = Tally()
    samples: list[Sample] = []
    kills: list[str] = []
    t0 = time.monotonic()
    until = t0 + args.minutes * 60
    idle_before = (gateway.memory_info().rss, gateway.num_fds())
    print(f"gateway soak: {args.streams} streams for {args.minutes:g} min, one engine killed "
          f"every {args.kill_every:g} s; gateway pid {gateway.pid}", flush=True)  # fmt: skip
    clients = [asyncio.create_task(client(i, gw_port, until, tally)) for i in range(args.streams)]
    killer = asyncio.create_task(
        kill_and_restart(engines, ports, work, admin, args.kill_every, t0, until, kills)
    )
    while time.monotonic() < until:  # bounded by the run's end
        await asyncio.sleep(min(SAMPLE_EVERY_S, max(0.0, until - time.monotonic())))
        samples.append(await sample(gateway, admin, tally, t0))
        s = samples[-1]
        print(f"  t={s.t:5.0f} s  rss {s.rss / MIB:6.1f} MiB  fds {s.fds:4d}  in flight "
              f"{s.inflight:3d}  ok {tally.outcomes['ok']}", flush=True)  # fmt: skip
    await asyncio.wait_for(asyncio.gather(*clients), REQUEST_DEADLINE_S + 15)
    await killer
    # The load is over: in flight drains, the clients' connections close.
    drained = True
    try:
        await admin.wait(
            lambda d: sum(x["inflight"] for x in d.values()) == 0, 30, "in flight to drain"
        )
    except TimeoutError:
        drained = False
    await asyncio.sleep(1.0)  # a last health round; the closes reach the gateway
    idle_after = (gateway.memory_info().rss, gateway.num_fds())
    inflight_after = sum(d["inflight"] for d in (await admin.deployments()).values())
    await admin.http.aclose()
    return verdict(samples, tally, kills, idle_before, idle_after, inflight_after, drained)


def verdict(samples: list[Sample], tally: Tally, kills: list[str],
            idle_before: tuple[int, int], idle_after: tuple[int, int],
            inflight_after: int, drained: bool) -> int:  # fmt: skip
    loaded = [s for s in samples if s.t >= min(WARMUP_S, samples[-1].t / 4)]
    quarter = max(1, len(loaded) // 4)
    first, last = loaded[:quarter], loaded[-quarter:]
    rss0, rss1 = statistics.mean(s.rss for s in first), statistics.mean(s.rss for s in last)
    fds0, fds1 = max(s.fds for s in first), max(s.fds for s in last)
    failed = sum(n for k, n in tally.outcomes.items() if k not in GOOD)
    cut, vanished = tally.outcomes["cut by an engine kill"], tally.outcomes["vanished (on purpose)"]
    print("engine kills:")
    print("\n".join(kills) or "  none (the run was too short)")
    print("outcomes: " + ", ".join(f"{k} {n}" for k, n in tally.outcomes.most_common()))
    for line in tally.last_failures:
        print(f"  failure: {line}")
    rss_flat = rss1 <= rss0 * 1.10 + 8 * MIB
    fds_flat = fds1 <= fds0 + 16
    checks = [
        (rss_flat, f"RSS under load {rss0 / MIB:.1f} -> {rss1 / MIB:.1f} MiB "
                   f"(first vs last quarter; idle {idle_before[0] / MIB:.1f} -> "
                   f"{idle_after[0] / MIB:.1f} MiB)"),
        (fds_flat, f"open descriptors under load {fds0} -> {fds1} (max of first vs last "
                   f"quarter; idle {idle_before[1]} -> {idle_after[1]})"),
        (drained and inflight_after == 0, f"in flight after the load: {inflight_after}"),
        (failed == 0, f"failed requests: {failed} (besides {cut} streams cut by a kill and "
                      f"{vanished} clients that vanished on purpose) of "
                      f"{sum(tally.outcomes.values())}"),
    ]  # fmt: skip
    for ok, text in checks:
        print(f"  {'ok  ' if ok else 'FAIL'} {text}")
    good = all(ok for ok, _ in checks)
    print(f"verdict: {'FLAT' if good else 'NOT FLAT'}")
    return 0 if good else 1


GOOD = ("ok", "cut by an engine kill", "vanished (on purpose)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--kill-every", type=float, default=60.0, help="seconds between kills")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="engineroom-soak-"))
    a, b, gw_port = free_ports(3)
    ports = {"a": a, "b": b}
    (work / "fleet.toml").write_text(FLEET.format(port=gw_port, dir=work, a=a, b=b))
    engines: dict[str, subprocess.Popen[bytes]] = {}
    gateway = None
    try:
        for name, port in ports.items():
            engines[name] = start_engine(port, work / f"{name}.log")
        env = {**os.environ, "ENGINEROOM_ADMIN_TOKEN": ADMIN}
        argv = [sys.executable, "-m", "console.cli", "gateway", "--fleet", str(work / "fleet.toml")]
        gateway = spawn(argv, work / "gateway.log", env)

        def up() -> bool:
            if gateway is not None and gateway.poll() is not None:
                raise RuntimeError(f"the gateway exited: {log_tail(work / 'gateway.log')}")
            with contextlib.suppress(httpx.HTTPError):
                url = f"http://127.0.0.1:{gw_port}/healthz"
                return httpx.get(url, timeout=1, trust_env=False).status_code == 200
            return False

        wait_until(up, 30, what="the gateway")
        code = asyncio.run(soak(args, gw_port, psutil.Process(gateway.pid), engines, ports, work))
        if gateway.poll() is not None:
            print(f"the gateway died: {log_tail(work / 'gateway.log')}")
            return 1
        return code
    finally:
        for process in [gateway, *engines.values()]:
            if process is not None:
                stop(process, grace=5)


if __name__ == "__main__":
    sys.exit(main())
