"""What vLLM and trtllm-serve share: an OpenAI server with /health, /version and /v1/models.

Both are found the same way (a `--port` and `--host` on the command line) and probed the
same way (health first, then version, models and metrics together); only their metrics
differ, and that stays in each plugin.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from console.core.fetch import FetchError, Response
from console.core.metrics.readings import EngineReading
from plugins.base import Discovered, ProbeContext, flag_value, local_url, port_from

Result = Response | BaseException


def discover(cmdline: list[str], listening: list[int]) -> Discovered | None:
    port = port_from(cmdline, ("--port",), listening, 8000)
    if port is None:
        return None
    return Discovered(local_url(flag_value(cmdline, "--host"), port))


@dataclass(slots=True)
class Answers:
    health: Response
    version: Result
    models: Result
    metrics: Result


async def probe(ctx: ProbeContext, base: str, metrics_path: str) -> Answers | EngineReading:
    """The server's answers, or the reading of a server that does not answer at all."""
    try:
        health = await ctx.get(f"{base}/health")
    except FetchError as exc:
        # Refused: nothing listens (stopped, or still loading). Anything else: it hangs.
        return EngineReading(state="down" if exc.refused else "unhealthy", reason=f"/health: {exc}")
    version, models, metrics = await asyncio.gather(
        ctx.get(f"{base}/version"),
        ctx.get(f"{base}/v1/models"),
        ctx.get(f"{base}{metrics_path}"),
        return_exceptions=True,
    )
    return Answers(health, version, models, metrics)


def version(result: Result) -> str | None:
    """`{"version": "0.32.0"}` from /version, or None."""
    if isinstance(result, Response) and result.status == 200:
        try:
            data = result.json()
        except FetchError:
            return None
        if isinstance(data, dict) and isinstance(data.get("version"), str):
            return str(data["version"])
    return None


def served_models(result: Result, problems: list[str]) -> list[str] | None:
    """The ids in /v1/models; None (with the problem noted) when it cannot be read."""
    if isinstance(result, BaseException):
        problems.append(f"/v1/models: {result}")
        return None
    if result.status != 200:
        problems.append(f"/v1/models answered {result.status}")
        return None
    try:
        data = result.json()
        return [str(card["id"]) for card in data["data"]]
    except (FetchError, KeyError, TypeError) as exc:
        problems.append(f"/v1/models: unexpected shape ({exc.__class__.__name__})")
        return None
