"""The gateway's cost on the data path, and how fast it fails over.

    make bench        (or: .venv/bin/python -m bench.gateway_overhead [--requests N])

Upstream: bench/sse_upstream.py (Starlette on uvicorn, 8 SSE chunks, no delay), the
baseline docs/gateway.md compares with. Three paths to it, measured in one run, interleaved:
direct, through `engineroom gateway`, and through nginx (Debian's package; proxy_buffering
off, upstream keepalive) as a plain reverse proxy.

1. TTFT at the client (request sent to first SSE line), one request at a time, N per
   path: p50 and p99, and each proxy's added p50/p99 over direct.
2. Requests per second through each at 64 concurrent streams.
3. Failover: an emergency failover between two upstreams under load; the cutover (command
   to the target's first answer, as the gateway and as a client saw it), then a planned
   failover's duration by step.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.engines.servers import free_ports, wait_until  # noqa: E402

ADMIN = "bench-admin-token"
NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  upstream up {{ server 127.0.0.1:{upstream}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""
FLEET = """
[fleet]
name = "bench"
[gateway]
url = "http://127.0.0.1:{port}"
state_dir = "{dir}/gateway-state"
health_interval_s = 0.5
[[nodes]]
name = "local"
agent = "http://127.0.0.1:9"
[[models]]
name = "bench"
failover = {{ steps = [10, 50, 100], verify_s = 2, warmup_requests = 3, drain_timeout_s = 10 }}
  [[models.deployments]]
  id = "a"
  node = "local"
  engine = "vllm"
  endpoint = "http://127.0.0.1:{a}"
  engine_model = "bench"
  weight = 100
  [[models.deployments]]
  id = "b"
  node = "local"
  engine = "vllm"
  endpoint = "http://127.0.0.1:{b}"
  engine_model = "bench"
  weight = 0
"""
BODY = {"model": "bench", "prompt": "hi", "max_tokens": 8, "stream": True}


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=ROOT, start_new_session=True)  # fmt: skip


def ttft_once(client: httpx.Client, url: str, body: dict = BODY) -> float:
    started = time.perf_counter()
    with client.stream("POST", url + "/v1/completions", json=body) as resp:
        first = None
        for line in resp.iter_lines():
            if first is None and line.startswith("data: "):
                first = time.perf_counter() - started
        assert resp.status_code == 200 and first is not None, url
    return first


async def throughput(url: str, concurrency: int, seconds: float, body: dict = BODY) -> float:
    done = 0
    stop = time.monotonic() + seconds
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), trust_env=False
    ) as http:

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < stop:
                async with http.post(url + "/v1/completions", json=body) as resp:
                    async for _ in resp.content.iter_any():
                        pass
                    done += resp.status == 200

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / seconds


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--only-overhead", action="store_true", help="TTFT and requests/s only, no failover"
    )
    args = parser.parse_args()
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    work = Path(tempfile.mkdtemp(prefix="engineroom-gw-bench-"))
    a, b, gw_port, nginx_port = free_ports(4)
    procs = [
        spawn([sys.executable, "bench/sse_upstream.py", str(a)], work / "a.log"),
        spawn([sys.executable, "bench/sse_upstream.py", str(b)], work / "b.log"),
    ]
    (work / "fleet.toml").write_text(FLEET.format(port=gw_port, dir=work, a=a, b=b))
    env = {**os.environ, "ENGINEROOM_ADMIN_TOKEN": ADMIN}
    gateway_argv = [sys.executable, "-m", "console.cli", "gateway", "--fleet"]
    procs.append(spawn([*gateway_argv, str(work / "fleet.toml")], work / "gateway.log", env))
    (work / "nginx.conf").write_text(NGINX_CONF.format(dir=work, upstream=a, port=nginx_port))
    procs.append(
        spawn([nginx, "-c", str(work / "nginx.conf"), "-p", str(work)], work / "nginx.log")
    )
    paths = {
        "direct": f"http://127.0.0.1:{a}",
        "gateway": f"http://127.0.0.1:{gw_port}",
        "nginx": f"http://127.0.0.1:{nginx_port}",
    }
    try:
        for url in paths.values():
            wait_until(lambda u=url: _answers(u), 30, what=url)
        samples: dict[str, list[float]] = {name: [] for name in paths}
        with httpx.Client(timeout=10, trust_env=False) as client:
            for url in paths.values():  # warm each path's connections
                for _ in range(50):
                    ttft_once(client, url)
            for _ in range(args.requests):
                for name, url in paths.items():  # interleaved: noise hits all alike
                    samples[name].append(ttft_once(client, url))
        print(f"TTFT at the client, {args.requests} requests per path, interleaved (ms):")
        base50, base99 = pct(samples["direct"], 0.5), pct(samples["direct"], 0.99)
        added = {}
        for name, values in samples.items():
            p50, p99 = pct(values, 0.5), pct(values, 0.99)
            added[name] = (p50 - base50, p99 - base99)
            extra = (
                "" if name == "direct"
                else f"   added p50 {added[name][0] * 1000:+.3f}  p99 {added[name][1] * 1000:+.3f}"
            )  # fmt: skip
            print(f"  {name:<8} p50 {p50 * 1000:6.3f}  p99 {p99 * 1000:6.3f}{extra}")
        g50, g99 = added["gateway"]
        n50, n99 = added["nginx"]
        print(
            f"  gateway/nginx added: p50 {g50 / n50 if n50 > 0 else float('nan'):.1f}x, "
            f"p99 {g99 / n99 if n99 > 0 else float('nan'):.1f}x "
            "(target: gateway adds <= 0.3 ms p50, <= 1 ms p99)"
        )
        print(f"\nrequests/s at 64 concurrent streams ({args.seconds:g} s each):")
        for name, url in paths.items():
            rps = asyncio.run(throughput(url, 64, args.seconds))
            print(f"  {name:<8} {rps:8.0f}")
        if not args.only_overhead:
            print()
            failover(paths["gateway"])
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)
    return 0


def _answers(url: str) -> bool:
    try:
        resp = httpx.post(url + "/v1/completions", json=BODY, timeout=2, trust_env=False)
        return resp.status_code == 200
    except httpx.HTTPError:
        return False


def failover(gateway: str) -> None:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    seen: list[tuple[float, str]] = []
    stop = False

    async def load() -> None:
        async with aiohttp.ClientSession(trust_env=False) as http:

            async def worker() -> None:
                while not stop:
                    async with http.post(gateway + "/v1/completions", json=BODY) as resp:
                        async for _ in resp.content.iter_any():
                            pass
                        seen.append(
                            (time.monotonic(), resp.headers.get("X-Engineroom-Deployment", ""))
                        )

            await asyncio.gather(*(worker() for _ in range(8)))

    import threading

    thread = threading.Thread(target=lambda: asyncio.run(load()), daemon=True)
    thread.start()
    time.sleep(1)
    with httpx.Client(base_url=gateway, headers=admin, timeout=30, trust_env=False) as client:
        cutovers = []
        for target in ("b", "a", "b", "a", "b"):
            sent = time.monotonic()
            job = client.post(
                "/admin/failover", json={"model": "bench", "to": target, "mode": "emergency"}
            ).json()
            while (job := client.get(f"/admin/jobs/{job['id']}").json())["state"] == "running":
                time.sleep(0.02)
            first = next((t for t, d in list(seen) if t > sent and d == target), None)
            cutovers.append((job.get("first_served_s"), None if first is None else first - sent))
            time.sleep(0.5)
        gw = [c[0] * 1000 for c in cutovers if c[0] is not None]
        client_side = [c[1] * 1000 for c in cutovers if c[1] is not None]
        print(
            f"emergency cutover, {len(cutovers)} runs under 8 clients, median: "
            f"{statistics.median(gw):.1f} ms in the gateway (command to the target's first "
            f"byte), {statistics.median(client_side):.1f} ms at a client (command sent to a "
            "response from the target done); target < 100 ms"
        )
        job = client.post("/admin/failover", json={"model": "bench", "to": "a"}).json()
        started = time.monotonic()
        while (job := client.get(f"/admin/jobs/{job['id']}").json())["state"] == "running":
            time.sleep(0.1)
        took = time.monotonic() - started
        print(
            f"planned failover: {job['state']} in {took:.1f} s; by step (s): {job.get('timings')}"
        )
        print("  (the verification windows, verify_s = 2 per step here, dominate)")
    stop = True  # the load's workers read it through their closure, and end
    thread.join(10)


if __name__ == "__main__":
    sys.exit(main())
