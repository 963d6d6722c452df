"""The API reference in docs/api/ is what the code serves, not what someone remembered."""

from __future__ import annotations

import json

from tests.conftest import ROOT
from tools import apidocs

COMMITTED = ROOT / "docs" / "api" / apidocs.AGENT_FILE


def test_the_committed_agent_openapi_is_current():
    written = apidocs.agent_openapi_text()
    assert COMMITTED.read_text() == written, (
        f"{COMMITTED.relative_to(ROOT)} is out of date with console/agent/api/app.py and "
        "console/core/wire.py: run `.venv/bin/python -m tools.apidocs docs/api` and commit it"
    )


def test_the_agent_openapi_documents_the_routes_consoles_call():
    paths = json.loads(COMMITTED.read_text())["paths"]
    for route in ("/healthz", "/v1/snapshot", "/v1/jobs", "/v1/jobs/{job_id}", "/metrics"):
        assert route in paths, route
    assert "Snapshot" in json.loads(COMMITTED.read_text())["components"]["schemas"]
