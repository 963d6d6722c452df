"""`engineroom failover MODEL --to DEPLOYMENT [--emergency] [--wait]`: a job on the gateway.

The job runs in the gateway: interrupting this command (or losing the SSH session) does
not stop it. Exit codes: 0 accepted (with --wait: succeeded), 1 refused or failed, 2 the
gateway did not answer, 3 a bad fleet file.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any, TextIO

from console.collect.gateway_client import GatewayClient, GatewayError
from console.core.config import ConfigError, Fleet
from console.core.gateway_wire import JOB_FINAL
from console.core.safetext import say

CALL_DEADLINE_S = 15.0  # one admin call, whole answer included
POLL_S = 0.3  # --wait: how often the job is read


def _show(job: dict[str, Any], printed: set[tuple[str, str]], out: TextIO) -> None:
    for step in job.get("steps", []):
        key = (step["name"], step["state"])
        if step["state"] == "pending" or key in printed:
            continue
        printed.add(key)
        detail = f": {step['detail']}" if step.get("detail") else ""
        say(f"  {step['name']:<12} {step['state']}{detail}", out)


def _wait_limit(fleet: Fleet, model: str) -> float:
    """How long --wait follows a job: every step's verification window, the warm-up and
    the drain, with a margin; past it the job goes on in the gateway and we say so."""
    plan = next((m.failover for m in fleet.models if m.name == model), None)
    if plan is None:
        return 600.0
    return len(plan.steps) * (plan.verify_s + 30) + plan.drain_timeout_s + 120


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
    if fleet.gateway is None:
        raise ConfigError(f"{fleet.source}: no [gateway] section: failovers run in the gateway")
    mode = "emergency" if emergency else "planned"
    return asyncio.run(_run(fleet, model, to, mode, why, wait, as_json, out))


async def _run(
    fleet: Fleet,
    model: str,
    to: str,
    mode: str,
    why: str,
    wait: bool,
    as_json: bool,
    out: TextIO,
) -> int:
    client = GatewayClient(fleet, timeout=CALL_DEADLINE_S)
    try:
        try:
            job = await client.failover(model, to, mode, why)
        except GatewayError as exc:
            if exc.status is None:
                say(f"engineroom: the gateway did not answer: {exc.reason}", sys.stderr)
                return 2
            if exc.status < 400:  # an answer, but not a job: say what came
                say(f"engineroom: the gateway answered {exc.reason}", sys.stderr)
                return 2
            say(f"engineroom: failover refused: {exc.reason}", sys.stderr)
            return 1
        if not as_json:
            say(f"job {job['id']} ({job['kind']}) {model} -> {to}: running", out)
        printed: set[tuple[str, str]] = set()
        limit = _wait_limit(fleet, model)
        give_up = time.monotonic() + limit
        while wait and job["state"] not in JOB_FINAL:
            if time.monotonic() > give_up:
                say(
                    f"engineroom: job {job['id']} still {job['state']} after {limit:.0f} s; "
                    f"it goes on in the gateway (engineroom jobs, or GET /admin/jobs/{job['id']})",
                    sys.stderr,
                )
                return 1
            await asyncio.sleep(POLL_S)
            try:
                job = await client.job(job["id"])
            except GatewayError as exc:
                what = "did not answer" if exc.status is None else "answered"
                say(f"engineroom: job {job['id']}: the gateway {what} {exc.reason}", sys.stderr)
                return 2
            if not as_json:
                _show(job, printed, out)
    finally:
        await client.close()
    if as_json:
        print(json.dumps(job, indent=2), file=out)
    elif wait:
        error = f": {job['error']}" if job.get("error") else ""
        say(f"job {job['id']}: {job['state']}{error}", out)
        say(f"routes before {job.get('before')}  after {job.get('after')}", out)
    return 0 if job["state"] in ("succeeded", "running") else 1
