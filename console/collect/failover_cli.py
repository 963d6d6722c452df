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
CALL_DEADLINE_S = 15.0  # one admin call, whole answer included


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


def _wait_limit(fleet: Fleet, model: str) -> float:
    """How long --wait follows a job: every step's verification window, the warm-up and
    the drain, with a margin; past it the job goes on in the gateway and we say so."""
    plan = next((m.failover for m in fleet.models if m.name == model), None)
    if plan is None:
        return 600.0
    return len(plan.steps) * (plan.verify_s + 30) + plan.drain_timeout_s + 120


def _error_of(status: int, body: bytes) -> str:
    data = apiclient.json_object(body)
    if data is not None and data.get("error"):
        return str(data["error"])
    return f"HTTP {status}: {body[:200].decode('utf-8', 'replace').strip() or 'no body'}"


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
            status, raw = apiclient.call(
                client, "POST", "/admin/failover", json=body, deadline_s=CALL_DEADLINE_S
            )
            job = apiclient.json_object(raw) if status == 202 else None
            if job is None:
                print(f"engineroom: failover refused: {_error_of(status, raw)}", file=sys.stderr)
                return 1
            if not as_json:
                print(f"job {job['id']} ({job['kind']}) {model} -> {to}: running", file=out)
            printed: set[tuple[str, str]] = set()
            give_up = time.monotonic() + _wait_limit(fleet, model)
            while wait and job["state"] not in FINAL:
                if time.monotonic() > give_up:
                    print(
                        f"engineroom: job {job['id']} still {job['state']} after "
                        f"{_wait_limit(fleet, model):.0f} s; it goes on in the gateway "
                        f"(engineroom jobs, or GET /admin/jobs/{job['id']})",
                        file=sys.stderr,
                    )
                    return 1
                time.sleep(0.3)
                status, raw = apiclient.call(
                    client, "GET", f"/admin/jobs/{job['id']}", deadline_s=CALL_DEADLINE_S
                )
                fresh = apiclient.json_object(raw) if status == 200 else None
                if fresh is None:
                    print(
                        f"engineroom: job {job['id']}: the gateway answered "
                        f"{_error_of(status, raw)}",
                        file=sys.stderr,
                    )
                    return 2
                job = fresh
                if not as_json:
                    _show(job, printed, out)
    except (httpx.HTTPError, apiclient.NoAnswer) as exc:
        print(f"engineroom: the gateway did not answer: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(job, indent=2), file=out)
    elif wait:
        error = f": {job['error']}" if job.get("error") else ""
        print(f"job {job['id']}: {job['state']}{error}", file=out)
        print(f"routes before {job.get('before')}  after {job.get('after')}", file=out)
    return 0 if job["state"] in ("succeeded", "running") else 1
