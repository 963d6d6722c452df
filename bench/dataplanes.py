"""The data planes side by side: what each adds to TTFT, what it serves at 64 streams, and
how fast an emergency failover cuts over through it.

    make bench        (or: .venv/bin/python -m bench.dataplanes [--requests N])

One run, one SSE upstream (bench/sse_upstream.py: Starlette on uvicorn, 8 chunks, no
delay; a second one as the failover target), five paths to it, measured interleaved so
the machine's noise hits all alike:

  direct    the upstream itself
  gateway   `engineroom gateway` (the built-in data plane)
  nginx     Debian's nginx as a plain reverse proxy (proxy_buffering off, keepalive)
  haproxy   Debian's HAProxy 2.6 with the configuration `engineroom haproxy render` writes
            (routing by the JSON body's model: the request is buffered)
  router    the vLLM router 0.1.17 (PyPI vllm-router), round robin
  pipe      bench/pipe_floor.py: a TCP pipe in Python on uvloop, no HTTP parsed; not a
            data plane, the floor that no Python proxy on this loop can go under

1. TTFT at the client (request sent to the first SSE line), one request at a time: p50,
   p99, and what each proxy adds over direct; the built-in gateway's added time as a
   ratio of each other's.
2. Requests per second through each at 64 concurrent streams.
3. Emergency cutover on each data plane under 8 clients, from the command to the target's
   first answer: `POST /admin/failover` (mode emergency) for the gateway, HAProxy and the
   router (the job's own figure, from the data plane's counters, and the first answer from
   the target a client saw); for nginx, which engineroom does not drive, the upstream
   rewritten and a graceful reload (SIGHUP).

The output goes to stdout and to docs/evidence/bench-dataplanes.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import grp
import io
import os
import pwd
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

import aiohttp
import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gateway_overhead import (  # noqa: E402
    ADMIN,
    NGINX_CONF,
    pct,
    spawn,
    throughput,
    ttft_once,
)
from console.core.config.load import parse_fleet  # noqa: E402
from console.gateway.dataplanes.haproxy_config import render  # noqa: E402
from tests.engines.servers import free_ports, wait_until  # noqa: E402

OUT = ROOT / "docs" / "evidence" / "bench-dataplanes.txt"
FLEET = """
[fleet]
name = "bench"
[gateway]
url = "http://127.0.0.1:{gw}"
state_dir = "{dir}/gateway-state"
health_interval_s = 0.5
[[nodes]]
name = "local"
agent = "http://127.0.0.1:9"
[[dataplanes]]
name = "edge"
kind = "haproxy"
admin_socket = "{dir}/haproxy.sock"
config = "{dir}/haproxy.cfg"
listen = "127.0.0.1:{haproxy}"
socket_user = "{user}"
socket_group = "{group}"
[[dataplanes]]
name = "router"
kind = "vllm-router"
url = "http://127.0.0.1:{router}"
metrics_url = "http://127.0.0.1:{router_metrics}/metrics"
{models}
"""
MODEL = """
[[models]]
name = "{name}"
dataplane = "{plane}"
  [[models.deployments]]
  id = "{prefix}a"
  node = "local"
  engine = "vllm"
  endpoint = "http://127.0.0.1:{a}"
  engine_model = "bench"
  weight = 100
  [[models.deployments]]
  id = "{prefix}b"
  node = "local"
  engine = "vllm"
  endpoint = "http://127.0.0.1:{b}"
  engine_model = "bench"
  weight = 0
"""
# The model each path is asked for (HAProxy and the gateway route by it), and its
# deployments' id prefix (ids are fleet-wide).
MODELS = {"gateway": "bench", "haproxy": "bench-edge", "router": "bench-router"}
PREFIX = {"bench": "", "bench-edge": "e", "bench-router": "r"}


def body(model: str) -> dict:
    return {"model": model, "prompt": "hi", "max_tokens": 8, "stream": True}


def router_binary() -> str:
    return os.environ.get("ENGINEROOM_VLLM_ROUTER") or str(
        ROOT / ".engines" / "router" / "bin" / "vllm-router"
    )


class Clients:
    """N streaming clients looping on one path, noting when each answer's head came and
    from which upstream (X-Upstream, or the gateway's X-Engineroom-Deployment)."""

    def __init__(self, url: str, model: str, ports: dict[str, str], n: int = 8) -> None:
        self.url, self.body, self.ports, self.n = url, body(model), ports, n
        self.seen: list[tuple[float, str]] = []
        self.failed: Counter[str] = Counter()  # why, e.g. "ServerDisconnectedError", "HTTP 503"
        self.stop = False
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        async with aiohttp.ClientSession(trust_env=False) as http:

            async def one() -> None:
                while not self.stop:
                    try:
                        async with http.post(self.url + "/v1/completions", json=self.body) as r:
                            at = time.monotonic()
                            who = r.headers.get("X-Upstream") or self.ports.get(
                                r.headers.get("X-Engineroom-Deployment", ""), "?"
                            )
                            async for _ in r.content.iter_any():
                                pass
                            if r.status == 200:
                                self.seen.append((at, who))
                            else:
                                self.failed[f"HTTP {r.status}"] += 1
                    except aiohttp.ClientError as exc:
                        self.failed[exc.__class__.__name__] += 1

            await asyncio.gather(*(one() for _ in range(self.n)))

    def first_from(self, port: str, after: float) -> float | None:
        return next((t for t, who in list(self.seen) if t > after and who == port), None)

    def __enter__(self) -> Clients:
        self.thread.start()
        wait_until(lambda: len(self.seen) > 20, 30, what=f"traffic on {self.url}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop = True
        self.thread.join(30)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=700, help="TTFT samples per path")
    parser.add_argument("--seconds", type=float, default=5.0, help="each requests/s run")
    parser.add_argument("--cutovers", type=int, default=6, help="emergency cutovers per plane")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N",
        help="also: N requests through a second gateway under cProfile, its top functions",
    )  # fmt: skip
    args = parser.parse_args()
    report = io.StringIO()

    def say(line: str = "") -> None:
        print(line, flush=True)
        report.write(line + "\n")

    work = Path(tempfile.mkdtemp(prefix="engineroom-dp-bench-"))
    a, b, gw, ngx, hap, rtr, rtr_metrics, pipe = free_ports(8)
    ports = {"a": str(a), "b": str(b)}
    models = "".join(
        MODEL.format(name=name, plane=plane, a=a, b=b, prefix=PREFIX[name])
        for name, plane in (
            ("bench", "gateway"),
            ("bench-edge", "edge"),
            ("bench-router", "router"),
        )
    )
    # The stats socket is the bench's user's (the rendered default, engineroom, is a service's).
    owner = {"user": pwd.getpwuid(os.getuid()).pw_name, "group": grp.getgrgid(os.getgid()).gr_name}
    fleet_text = FLEET.format(gw=gw, dir=work, haproxy=hap, router=rtr,
                              router_metrics=rtr_metrics, models=models, **owner)  # fmt: skip
    (work / "fleet.toml").write_text(fleet_text)
    fleet = parse_fleet(fleet_text, work / "fleet.toml")
    (work / "haproxy.cfg").write_text(render(fleet, fleet.dataplanes[0]))
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    nginx_conf = work / "nginx.conf"
    nginx_conf.write_text(NGINX_CONF.format(dir=work, upstream=a, port=ngx))
    env = {**os.environ, "ENGINEROOM_ADMIN_TOKEN": ADMIN}
    procs = [
        spawn([sys.executable, "bench/sse_upstream.py", str(a)], work / "a.log"),
        spawn([sys.executable, "bench/sse_upstream.py", str(b)], work / "b.log"),
    ]
    paths = {
        "direct": f"http://127.0.0.1:{a}",
        "gateway": f"http://127.0.0.1:{gw}",
        "nginx": f"http://127.0.0.1:{ngx}",
        "haproxy": f"http://127.0.0.1:{hap}",
        "router": f"http://127.0.0.1:{rtr}",
        "pipe": f"http://127.0.0.1:{pipe}",
    }
    try:
        wait_until(lambda: _answers(paths["direct"], "bench"), 30, what="upstream a")
        wait_until(lambda: _answers(f"http://127.0.0.1:{b}", "bench"), 30, what="upstream b")
        procs.append(spawn([nginx, "-c", str(nginx_conf), "-p", str(work)], work / "nginx.log"))
        procs.append(spawn(["haproxy", "-db", "-f", str(work / "haproxy.cfg")], work / "hap.log"))
        procs.append(
            spawn(
                [
                    router_binary(),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(rtr),
                    "--worker-urls",
                    paths["direct"],
                    "--policy",
                    "round_robin",
                    "--prometheus-host",
                    "127.0.0.1",
                    "--prometheus-port",
                    str(rtr_metrics),
                    "--log-level",
                    "warning",
                ],
                work / "router.log",
            )
        )  # fmt: skip
        gw_argv = [
            sys.executable,
            "-m",
            "console.cli",
            "gateway",
            "--fleet",
            str(work / "fleet.toml"),
        ]
        procs.append(spawn(gw_argv, work / "gateway.log", env))
        pipe_argv = [sys.executable, "bench/pipe_floor.py", str(pipe), str(a)]
        procs.append(spawn(pipe_argv, work / "pipe.log"))
        for name, url in paths.items():
            model = MODELS.get(name, "bench")
            wait_until(partial(_answers, url, model), 30, what=name)
        say(f"bench.dataplanes, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"load average {os.getloadavg()[0]:.2f} at start ({os.cpu_count()} CPUs)")  # fmt: skip
        say(f"  {_versions()}")
        pids = {"gateway": procs[-2].pid, "pipe": procs[-1].pid}
        ttft(paths, args.requests, say, pids)
        say(f"\nrequests/s at 64 concurrent streams ({args.seconds:g} s each):")
        for name, url in paths.items():
            rps = asyncio.run(throughput(url, 64, args.seconds, body(MODELS.get(name, "bench"))))
            say(f"  {name:<8} {rps:8.0f}")
        say(f"\nemergency cutover under 8 clients, {args.cutovers} runs each, median (min-max):")
        say("  (job: the command to the target's first request as the data plane counted it;")
        say("   client: the command sent to the first answer from the target a client saw)")
        with httpx.Client(base_url=paths["gateway"], timeout=30, trust_env=False,
                          headers={"Authorization": f"Bearer {ADMIN}"}) as admin:  # fmt: skip
            for name in ("gateway", "haproxy", "router"):
                cutovers(name, paths[name], MODELS[name], ports, args.cutovers, say,
                         partial(_emergency, admin, MODELS[name]))  # fmt: skip
        nginx_pid = procs[2].pid

        def reload_nginx(to: str) -> dict:
            nginx_conf.write_text(NGINX_CONF.format(dir=work, upstream=ports[to], port=ngx))
            os.kill(nginx_pid, signal.SIGHUP)  # a graceful reload: old workers finish
            return {}

        cutovers("nginx", paths["nginx"], "bench", ports, args.cutovers, say, reload_nginx)
        if args.profile:
            profile_gateway(work, fleet_text, args.profile, say)
        say(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            with contextlib.suppress(Exception):
                proc.wait(10)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report.getvalue())
    print(f"\nwritten: {args.out}")
    return 0


def ttft(paths: dict[str, str], n: int, say: Callable[[str], None], pids: dict[str, int]) -> None:
    """`pids`: processes whose CPU per request is reported (each serves only its path)."""
    samples: dict[str, list[float]] = {name: [] for name in paths}
    procs = {name: psutil.Process(pid) for name, pid in pids.items()}
    with httpx.Client(timeout=10, trust_env=False) as client:
        for name, url in paths.items():  # warm each path's connections
            for _ in range(50):
                ttft_once(client, url, body(MODELS.get(name, "bench")))
        # What each process spends with no request (the gateway's health checks), to take
        # off: CPU over an idle second, before the loop.
        idle_from = {name: _cpu(p) for name, p in procs.items()}
        time.sleep(IDLE_S)
        idle = {name: (_cpu(p) - idle_from[name]) / IDLE_S for name, p in procs.items()}
        cpu_before = {name: p.cpu_times() for name, p in procs.items()}
        loop_started = time.monotonic()
        for _ in range(n):
            for name, url in paths.items():  # interleaved: noise hits all alike
                samples[name].append(ttft_once(client, url, body(MODELS.get(name, "bench"))))
        cpu_after = {name: p.cpu_times() for name, p in procs.items()}
        loop_s = time.monotonic() - loop_started
    say(f"\nTTFT at the client, {n} requests per path, interleaved (ms):")
    base50, base99 = pct(samples["direct"], 0.5), pct(samples["direct"], 0.99)
    added: dict[str, tuple[float, float]] = {}
    for name, values in samples.items():
        p50, p99 = pct(values, 0.5), pct(values, 0.99)
        added[name] = (p50 - base50, p99 - base99)
        extra = (
            "" if name == "direct"
            else f"   added p50 {added[name][0] * 1000:+.3f}  p99 {added[name][1] * 1000:+.3f}"
        )  # fmt: skip
        say(f"  {name:<8} p50 {p50 * 1000:6.3f}  p99 {p99 * 1000:6.3f}{extra}")
    g50 = added["gateway"][0]
    ratios = ", ".join(
        f"{g50 / added[o][0]:.2f}x {o}" if added[o][0] > 0 else f"? {o} (added nothing)"
        for o in ("nginx", "haproxy", "router")
    )
    say(f"  the gateway's added p50 is {ratios}")
    verdict = "met" if added["nginx"][0] > 0 and g50 <= added["nginx"][0] else "MISSED"
    ahead = "ahead of" if g50 < added["router"][0] else "NOT ahead of"
    say(f"  target (no more than nginx at p50): {verdict}; the gateway is {ahead} the vLLM router")
    floor = added["pipe"][0]
    say(f"  the Python floor (pipe, no HTTP) adds p50 {floor * 1000:+.3f}: "
        f"{floor / added['nginx'][0]:.2f}x nginx; the gateway's own work is "
        f"{(g50 - floor) * 1000:+.3f} over it")  # fmt: skip
    for name in procs:
        user = (cpu_after[name].user - cpu_before[name].user) / n * 1e6
        system = (cpu_after[name].system - cpu_before[name].system) / n * 1e6
        background = idle[name] * loop_s / n * 1e6
        say(f"  {name} process CPU a request: user {user:.0f} us, system {system:.0f} us, "
            f"less {background:.0f} us it spends idle (health checks): "
            f"{user + system - background:.0f} us")  # fmt: skip


IDLE_S = 2.0


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def cutovers(
    name: str, url: str, model: str, ports: dict[str, str], runs: int,
    say: Callable[[str], None], command: Callable[[str], dict],
) -> None:  # fmt: skip
    job_ms: list[float] = []
    client_ms: list[float] = []
    with Clients(url, model, {"a": ports["a"], "b": ports["b"]}) as clients:
        for i in range(runs):
            to = "b" if i % 2 == 0 else "a"
            sent = time.monotonic()
            job = command(to)
            first = wait_until(partial(clients.first_from, ports[to], sent), 10,
                               interval=0.001, what=f"{name}: an answer from {to}")  # fmt: skip
            client_ms.append((first - sent) * 1000)
            if job.get("first_served_s") is not None:
                job_ms.append(job["first_served_s"] * 1000)
            # The next run starts once the source has stopped answering new requests.
            settled = time.monotonic()
            wait_until(partial(_only_from, clients, ports[to], settled), 10,
                       interval=0.01, what=f"{name}: all answers from {to}")  # fmt: skip
        failed = clients.failed
    why = ", ".join(f"{n} {k}" for k, n in failed.most_common()) or "none"
    say(f"  {name:<8} job {_spread(job_ms)}   client {_spread(client_ms)}   failed: {why}")


def profile_gateway(work: Path, fleet_text: str, n: int, say: Callable[[str], None]) -> None:
    """Where the built-in gateway's time goes: a second gateway (own port and state) under
    cProfile, started and stopped once with no request and once with `n` requests one at a
    time; the difference, per request, by group and by function."""
    idle = _profiled_run(work, fleet_text, 0, "idle")
    busy = _profiled_run(work, fleet_text, n, "busy")
    delta = {
        key: (calls - idle.get(key, (0, 0.0, 0.0))[0], own - idle.get(key, (0, 0.0, 0.0))[1],
              total - idle.get(key, (0, 0.0, 0.0))[2])
        for key, (calls, own, total) in busy.items()
    }  # fmt: skip
    groups: dict[str, float] = {}
    for (path, _, func), (_, own, _) in delta.items():
        groups[_group(path, func)] = groups.get(_group(path, func), 0.0) + own
    say(f"\nthe gateway under cProfile, {n} requests one at a time, less a run with none:")
    say("  own time by group, ms a request")
    for group, own in sorted(groups.items(), key=lambda kv: -kv[1]):
        say(f"  {own / n * 1000:7.3f}  {group}")
    say("  engineroom's own functions, by own time:")
    ours = sorted(
        ((own, total, calls, path, line, func)
         for (path, line, func), (calls, own, total) in delta.items() if "/console/" in path),
        reverse=True,
    )  # fmt: skip
    for own, total, calls, path, line, func in ours[:12]:
        where = f"{Path(path).parent.name}/{Path(path).name}:{line} {func}"
        say(f"  {own / n * 1000:7.3f} own {total / n * 1000:7.3f} cum {calls:>7} calls  {where}")


Key = tuple[str, int, str]


def _profiled_run(
    work: Path, fleet_text: str, n: int, tag: str
) -> dict[Key, tuple[int, float, float]]:
    import pstats

    port = free_ports(1)[0]
    fleet = work / f"profile-{tag}.toml"
    fleet.write_text(fleet_text.replace(f"{work}/gateway-state", f"{work}/profile-{tag}"))
    out = work / f"gateway-{tag}.prof"
    env = {**os.environ, "ENGINEROOM_ADMIN_TOKEN": ADMIN}
    proc = spawn([sys.executable, "-m", "cProfile", "-o", str(out), "-m", "console.cli",
                  "gateway", "--fleet", str(fleet), "--listen", f"127.0.0.1:{port}"],
                 work / f"profile-{tag}.log", env)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(partial(_up, url), 30, what="the profiled gateway")
        with httpx.Client(timeout=10, trust_env=False) as client:
            for _ in range(n):
                ttft_once(client, url, body("bench"))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # a clean exit: cProfile writes its file
        proc.wait(30)
    rows = pstats.Stats(str(out)).stats.items()  # type: ignore[attr-defined]
    return {key: (calls, own, total) for key, (_, calls, own, total, _) in rows}


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=2, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _group(path: str, func: str) -> str:
    if "/console/" in path:
        return "engineroom (console/)"
    if path == "~" and "method" in func and ("send" in func or "recv" in func):
        return "socket sends and receives"
    if path.endswith("runners.py") or "run_forever" in func or "_run_once" in func:
        return "the event loop itself (uvloop in C: polling, callbacks; waiting included)"
    for lib in ("aiohttp", "httptools", "asyncio", "json", "multidict", "yarl"):
        if f"/{lib}/" in path or f"{lib}." in func:
            return lib
    return "other (startup and imports included)"


def _only_from(clients: Clients, port: str, after: float) -> bool:
    recent = [who for t, who in list(clients.seen) if t > after]
    return len(recent) >= 16 and all(who == port for who in recent[-16:])


def _spread(values: list[float]) -> str:
    if not values:
        return "?".rjust(24)
    return f"{statistics.median(values):7.1f} ms ({min(values):.1f}-{max(values):.1f})".ljust(24)


def _emergency(admin: httpx.Client, model: str, to: str) -> dict:
    to = PREFIX[model] + to
    resp = admin.post("/admin/failover", json={"model": model, "to": to, "mode": "emergency"})
    resp.raise_for_status()
    job = resp.json()
    deadline = time.monotonic() + 30
    while job["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.01)
        job = admin.get(f"/admin/jobs/{job['id']}").json()
    if job["state"] != "succeeded":
        raise RuntimeError(f"emergency failover of {model} to {to}: {job.get('error')}")
    return dict(job)


def _answers(url: str, model: str) -> bool:
    try:
        resp = httpx.post(url + "/v1/completions", json=body(model), timeout=2, trust_env=False)
        return resp.status_code == 200
    except httpx.HTTPError:
        return False


def _versions() -> str:
    import subprocess

    def first_line(argv: list[str]) -> str:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        except OSError:
            return "?"
        return (
            (done.stdout or done.stderr).strip().splitlines()[0]
            if (done.stdout or done.stderr)
            else "?"
        )

    nginx = first_line(["nginx", "-v"]).replace("nginx version: ", "")
    hap = " ".join(first_line(["haproxy", "-v"]).split()[:3])
    return f"{nginx}; {hap}; vllm-router 0.1.17"


if __name__ == "__main__":
    sys.exit(main())
