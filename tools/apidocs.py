"""`python -m tools.apidocs DIR`: write the API reference that the code defines.

The agent's OpenAPI document comes from its FastAPI app (console.agent.api.app), so the
reference cannot drift from the routes and the wire models in console.core.wire:
tests/test_apidocs.py fails when the committed docs/api/agent-openapi.json is not what this
writes. The gateway is an aiohttp server with no generated schema; its hand-written one is
tests/fixtures/gateway-openapi.yaml, which the API fuzzer holds to the real gateway.
"""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path
from typing import Any

AGENT_FILE = "agent-openapi.json"

# The smallest fleet an agent starts on: the routes and schemas do not depend on it.
_ONE_NODE = """
[fleet]
name = "apidocs"

[[nodes]]
name = "apidocs"
agent = "http://127.0.0.1:9"
"""


def agent_openapi() -> dict[str, Any]:
    """The agent's OpenAPI document exactly as its GET /openapi.json serves it: asked of the
    app in process (no socket, no snapshot cycle), with a viewer token made for the call."""
    from starlette.testclient import TestClient  # an in-process ASGI client, not a double

    from console.agent.api.app import create_app
    from console.agent.api.auth import Tokens
    from console.agent.snapshot.node import NodeAgent
    from console.core.config.load import parse_fleet

    token = secrets.token_urlsafe(24)
    tokens = Tokens.from_env("VIEWER", "OPERATOR", {"VIEWER": f"apidocs:{token}"})
    app = create_app(NodeAgent(parse_fleet(_ONE_NODE), "apidocs"), tokens, run_cycle=False)
    answer = TestClient(app).get("/openapi.json", headers={"Authorization": f"Bearer {token}"})
    answer.raise_for_status()
    document: dict[str, Any] = answer.json()
    return document


def agent_openapi_text() -> str:
    return json.dumps(agent_openapi(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tools.apidocs DIR   (e.g. docs/api)", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    (out / AGENT_FILE).write_text(agent_openapi_text())
    print(out / AGENT_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
