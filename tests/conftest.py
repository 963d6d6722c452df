"""Shared fixtures: real processes on loopback, started once and stopped for sure."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.engines.servers import free_port, free_ports, log_tail, stop, wait_until

pytest_plugins = (
    ["tests.engines.fixtures"]
    if (Path(__file__).parent / "engines" / "fixtures.py").exists()
    else []
)

ROOT = Path(__file__).resolve().parents[1]
VIEWER = "viewer-token-0123"

# Every test talks to loopback: a proxy from the developer's environment must sit in none
# of the tests' own HTTP clients nor in the processes they start (the console's clients
# ignore these anyway; tests/test_hardening_clients.py sets them on purpose).
for _proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
    os.environ.pop(_proxy, None)
OPERATOR = "alice:operator-token-4567"


@dataclass
class Agent:
    process: subprocess.Popen[bytes]
    url: str
    log: Path
    fleet: Path

    def get(self, path: str, token: str | None = VIEWER, timeout: float = 10.0) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(self.url + path, headers=headers, timeout=timeout)

    def snapshot(self) -> dict:
        resp = self.get("/v1/snapshot")
        resp.raise_for_status()
        return resp.json()

    def engine(self, engine_id: str) -> dict:
        for engine in self.snapshot()["engines"]:
            if engine["id"] == engine_id:
                return engine
        raise AssertionError(f"no engine {engine_id} in the snapshot")


def agent_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINEROOM_")}
    env.update(
        ENGINEROOM_VIEWER_TOKEN=VIEWER,
        ENGINEROOM_OPERATOR_TOKEN=OPERATOR,
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`engineroom ARGS...` as a real process, from the repository root; its output."""
    return subprocess.run(
        [sys.executable, "-m", "console.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=agent_env() if env is None else env,
    )


def start_agent(
    workdir: Path, fleet_text: str, node: str, port: int | None = None, **env: str
) -> Agent:
    """`engineroom agent` as a real process, ready when /healthz answers."""
    fleet = workdir / "fleet.toml"
    fleet.write_text(fleet_text)
    port = port or free_port()
    log = workdir / "agent.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "console.cli",
                "agent",
                "--fleet",
                str(fleet),
                "--node",
                node,
                "--listen",
                f"127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=agent_env(**env),
            cwd=ROOT,
            start_new_session=True,
        )
    agent = Agent(process, f"http://127.0.0.1:{port}", log, fleet)

    def up() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"agent exited {process.returncode}:\n{log_tail(log)}")
        try:
            return httpx.get(agent.url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout=60, what="agent /healthz")
    return agent


@pytest.fixture
def agent_factory(tmp_path: Path) -> Iterator:
    started: list[Agent] = []

    def make(fleet_text: str, node: str = "local", port: int | None = None, **env: str) -> Agent:
        workdir = tmp_path / f"agent{len(started)}"
        workdir.mkdir()
        agent = start_agent(workdir, fleet_text, node, port, **env)
        started.append(agent)
        return agent

    yield make
    for agent in started:
        stop(agent.process, grace=5)


@pytest.fixture
def hostile_engines(tmp_path: Path) -> Iterator[dict[str, int]]:
    """The hung, garbage, failing and enormous engines of tests/hostile_engine.py."""
    modes = ["hang", "garbage", "error500", "enormous"]
    ports = dict(zip(modes, free_ports(len(modes)), strict=True))
    log = tmp_path / "hostile.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "tests" / "hostile_engine.py"),
                *(f"{m}:{p}" for m, p in ports.items()),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    wait_until(lambda: "listening" in log.read_text(), timeout=20, what="hostile engines")
    yield ports
    stop(process, grace=2)
