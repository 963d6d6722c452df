"""`engineroom failover MODEL --to DEPLOYMENT [--emergency] [--wait]`: a job on the gateway.

The job runs in the gateway: interrupting this command (or losing the SSH session) does
not stop it. Exit codes: 0 accepted (with --wait: succeeded), 1 refused or failed, 2 the
gateway did not answer, 3 a bad fleet file.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

import httpx

from console.collect import apiclient
from console.core.config import ConfigError, Fleet

FINAL = ("succeeded", "failed", "cancelled")


def _client(fleet: Fleet) -> httpx.Client:
    if fleet.gateway is None:
        raise ConfigError(f"{fleet.source}: no [gateway] section: failovers run in the gateway")
    token = fleet.secret(fleet.gateway.token_env, ("gateway", "token_env"))
    # No proxy or other settings from the environment: the admin token goes to this URL only.
    return apiclient.client(
        fleet.gateway.url.rstrip("/"), {"Authorization": f"Bearer {token}"}, timeout=10
    )


def _show(job: dict[str, Any], printed: set[tuple[str, str]], out: TextIO) -> None:
    for step in job.get("steps", []):
        key = (step["name"], step["state"])
        if step["state"] == "pending" or key in printed:
            continue
        printed.add(key)
        detail = f": {step['detail']}" if step.get("detail") else ""
        print(f"  {step['name']:<12} {step['state']}{detail}", file=out, flush=True)


def run_failover(
    fleet: Fleet,
    model: str,
    to: str,
    *,
    emergency: bool = False,
    why: str = "",
    wait: bool = False,
    as_json: bool = False,
    out: TextIO = sys.stdout,
) -> int:
    body = {"model": model, "to": to, "mode": "emergency" if emergency else "planned", "why": why}
    try:
        with _client(fleet) as client:
            resp = client.post("/admin/failover", json=body)
            if resp.status_code != 202:
                print(f"engineroom: failover refused: {resp.json().get('error')}", file=sys.stderr)
                return 1
            job = resp.json()
            if not as_json:
                print(f"job {job['id']} ({job['kind']}) {model} -> {to}: running", file=out)
            printed: set[tuple[str, str]] = set()
            while wait and job["state"] not in FINAL:
                time.sleep(0.3)
                job = client.get(f"/admin/jobs/{job['id']}").json()
                if not as_json:
                    _show(job, printed, out)
    except httpx.HTTPError as exc:
        print(f"engineroom: the gateway did not answer: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(job, indent=2), file=out)
    elif wait:
        error = f": {job['error']}" if job.get("error") else ""
        print(f"job {job['id']}: {job['state']}{error}", file=out)
        print(f"routes before {job.get('before')}  after {job.get('after')}", file=out)
    return 0 if job["state"] in ("succeeded", "running") else 1
