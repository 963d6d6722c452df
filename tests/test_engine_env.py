"""An engine the agent starts never holds a token the fleet names (issue 27, a sibling of
defect 9): not the agents' and the gateway's, and not the vLLM router's API key nor
Prometheus' credentials either, which the agent's environment may hold when one
environment file serves every engineroom unit on a host.

A real agent starts the launch profile's engine, a python that writes the names of the
variables it was given that hold a secret, then exits (the job fails; its log stays).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx

from tests.conftest import OPERATOR
from tests.engines.servers import free_ports, wait_until

SECRETS = {
    "ROUTER_API_KEY": "secret-router-key-0123456789",
    "PROM_TOKEN": "secret-prometheus-token-0123",
    "GATEWAY_CLIENT_KEYS": "secret-client-key-0123456789",
    "ENGINEROOM_ADMIN_TOKEN": "secret-admin-token-0123456789",
}
ENGINE = (
    "import json, os; "
    "print('HELD', json.dumps(sorted(k for k, v in os.environ.items() if 'secret' in v)))"
)
FLEET = """
[fleet]
name = "env"
[agent]
state_dir = "{state}"
discover = false
[[nodes]]
name = "local"
agent = "http://127.0.0.1:{agent_port}"

[gateway]
url = "http://127.0.0.1:9"
api_keys_env = "GATEWAY_CLIENT_KEYS"

[[dataplanes]]
name = "router"
kind = "vllm-router"
url = "http://127.0.0.1:9"
token_env = "ROUTER_API_KEY"

[prometheus]
url = "http://127.0.0.1:9"
token_env = "PROM_TOKEN"

[profiles.printer]
engine = "vllm"
node = "local"
model = "{model}"
served_model_name = "printer"
port = {port}
command = {command}
"""


def test_an_engine_never_holds_the_routers_key_nor_prometheus_credentials(
    agent_factory, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    agent_port, port = free_ports(2)
    text = FLEET.format(
        state=tmp_path / "state",
        agent_port=agent_port,
        model=model,
        port=port,
        command=json.dumps([sys.executable, "-c", ENGINE]),
    )
    agent = agent_factory(text, port=agent_port, **SECRETS)
    started = httpx.post(
        agent.url + "/v1/jobs",
        json={"kind": "vllm.start", "profile": "printer"},
        headers={"Authorization": f"Bearer {OPERATOR.split(':', 1)[1]}"},
        timeout=30,
    )
    assert started.status_code == 202, started.text
    job = started.json()["id"]

    def printed() -> tuple[list[str]] | None:  # (names,): an empty list is an answer
        lines = agent.get(f"/v1/jobs/{job}/log?tail=50").text.splitlines()
        held = [line for line in lines if line.startswith("HELD ")]
        return (json.loads(held[-1][5:]),) if held else None

    [held] = wait_until(printed, 60, interval=0.5, what="the engine's line in its log")
    assert held == [], held
