"""The collector against real agents: an agent killed goes stale, then down, then recovers.

And `engineroom check`, whose exit code a cron job or an ssh one-liner reads.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time

import pytest

from console.collect.sources.collector import Collector
from console.core.config.load import parse_fleet
from tests.conftest import VIEWER, agent_env, run_cli
from tests.engines.servers import free_port
from tests.support.fleet import deployment, fleet_model, fleet_toml

AGENT_FLEET = """\
[fleet]
name = "t"
[agent]
scrape_interval_s = 0.5
discover = false  # other tests' real engines run on this machine too
[[nodes]]
name = "local"
agent = "http://127.0.0.1:9410"
"""


def console_fleet(*nodes: tuple[str, str], refresh: float = 0.5, extra: str = "") -> str:
    text = f'[fleet]\nname = "t"\nrefresh_s = {refresh}\n'
    for name, url in nodes:
        text += f'[[nodes]]\nname = "{name}"\nagent = "{url}"\ntoken_env = "T_VIEW"\n'
    return text + extra


def run_check(fleet_path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("check", "--fleet", str(fleet_path), *args, env=agent_env(T_VIEW=VIEWER))


async def test_a_killed_agent_goes_stale_then_down_then_recovers(agent_factory, tmp_path):
    agent = agent_factory(AGENT_FLEET)
    port = int(agent.url.rsplit(":", 1)[1])
    fleet = parse_fleet(console_fleet(("local", agent.url)))
    os.environ["T_VIEW"] = VIEWER
    seen: list[str] = []
    async with Collector(fleet, refresh_s=0.5, timeout_s=0.5) as collector:
        collector.start()
        state = collector.states["local"]

        async def until(status: str, timeout: float) -> float:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                current = state.status(collector.refresh_s)
                if not seen or seen[-1] != current:
                    seen.append(current)
                if current == status:
                    return time.monotonic()
                await asyncio.sleep(0.05)
            pytest.fail(f"node never became {status}; went {seen}")

        await until("up", 10)
        assert state.snapshot is not None and state.snapshot.node.name == "local"
        agent.process.send_signal(signal.SIGKILL)
        agent.process.wait()
        await until("stale", 5)
        await until("down", 10)
        assert state.error == "connection refused"
        assert state.snapshot is not None  # the last good values stay, with their age
        assert state.age() > 5 * 0.5

        restarted = agent_factory(AGENT_FLEET.replace("9410", str(port)), port=port)
        assert restarted.url == agent.url
        await until("up", 20)  # backoff is capped, so recovery comes within seconds
    assert seen[:4] == ["unknown", "up", "stale", "down"] or seen[:3] == ["up", "stale", "down"]
    assert seen[-1] == "up"


async def test_a_hung_agent_costs_one_timeout_and_never_piles_up_polls(tmp_path):
    # A listener that accepts and never answers: the hung agent.
    server = await asyncio.start_server(lambda r, w: asyncio.sleep(3600), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    fleet = parse_fleet(console_fleet(("hung", f"http://127.0.0.1:{port}")))
    os.environ["T_VIEW"] = VIEWER
    async with Collector(fleet, refresh_s=0.2, timeout_s=0.5) as collector:
        collector.start()
        await asyncio.sleep(3)
        state = collector.states["hung"]
        assert state.status(collector.refresh_s) == "down"
        assert state.error == "no answer within 0.5 s"
        # Polls wait for the previous one and back off: far fewer than 3 s / 0.2 s.
        assert 1 <= state.failures <= 6
    server.close()


def test_check_exit_codes_healthy_degraded_unreachable(agent_factory, tmp_path):
    agent = agent_factory(AGENT_FLEET)
    path = tmp_path / "console.toml"

    path.write_text(console_fleet(("local", agent.url)))
    healthy = run_check(path)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "HEALTHY" in healthy.stdout

    dead = f"http://127.0.0.1:{free_port()}"
    path.write_text(console_fleet(("local", agent.url), ("gone", dead)))
    degraded = run_check(path)
    assert degraded.returncode == 1
    assert "gone" in degraded.stdout and "connection refused" in degraded.stdout

    path.write_text(console_fleet(("gone", dead)))
    unreachable = run_check(path, "--json")
    assert unreachable.returncode == 2
    report = json.loads(unreachable.stdout)
    assert report["status"] == "unreachable"
    assert report["nodes"][0]["status"] == "down"
    assert report["alerts"][0]["severity"] == "critical"


def test_check_json_has_the_documented_keys(agent_factory, tmp_path):
    agent = agent_factory(AGENT_FLEET)
    path = tmp_path / "console.toml"
    model = fleet_model("m", deployment("m-vllm", "local", "vllm", 1), slo={"ttft_p95_ms": 100})
    path.write_text(console_fleet(("local", agent.url), extra=fleet_toml(models=[model])))
    result = run_check(path, "--json")
    report = json.loads(result.stdout)
    assert set(report) >= {"fleet", "status", "nodes", "models", "alerts"}
    node = report["nodes"][0]
    assert set(node) >= {"name", "status", "transport", "error", "host", "gpus", "engines"}
    assert node["transport"] == "agent"
    [model] = report["models"]
    [dep] = model["deployments"]
    assert set(dep) >= {"id", "node", "engine", "state", "weight", "latency", "slo_ok"}
    assert dep["slo_ok"] is None  # nothing measured: unknown, not "ok"
    assert result.returncode == 1  # the agent reports the deployment's engine down


def test_check_names_an_unset_token_variable(tmp_path):
    path = tmp_path / "console.toml"
    path.write_text(console_fleet(("local", "http://127.0.0.1:1")))
    env = {k: v for k, v in agent_env().items() if k != "T_VIEW"}
    result = run_cli("check", "--fleet", str(path), env=env)
    # The one node is not polled (issue 15: it costs that node, not the fleet); no node
    # answered, so unreachable.
    assert result.returncode == 2
    assert "no token (T_VIEW is not set)" in result.stdout
