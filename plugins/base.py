"""The engine plugin interface: one small class per engine kind.

A plugin knows its engine and nothing else about the agent:
- `discover`: is this process one of my engines, and where does it listen?
- `probe`: read version, state, models and metrics within the context's deadline,
  normalized into engine-neutral readings (`console.core.readings`).
Third parties add engines (SGLang, ...) by registering a subclass under the entry-point
group "engineroom.engines".
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import ClassVar

import aiohttp

from console.core.fetch import Response, fetch
from console.core.readings import EngineReading


@dataclass(slots=True)
class Discovered:
    """Where a discovered engine process serves."""

    endpoint: str
    metrics_endpoint: str | None = None


@dataclass(slots=True)
class EngineTarget:
    """One engine to probe: from fleet.toml deployments, discovery, or both."""

    id: str
    kind: str
    endpoint: str
    metrics_endpoint: str | None = None
    engine_models: list[str] = field(default_factory=list)
    pid: int | None = None


@dataclass(slots=True)
class ProbeContext:
    """What the agent lends a probe: a shared HTTP client, a deadline and a size cap."""

    http: aiohttp.ClientSession | None  # set by the agent inside its event loop
    timeout: float
    max_bytes: int

    async def get(self, url: str) -> Response:
        assert self.http is not None
        return await fetch(self.http, url, timeout=self.timeout, max_bytes=self.max_bytes)


class EnginePlugin(abc.ABC):
    kind: ClassVar[str]
    #: Names of the executables or modules that identify this engine's processes.
    process_markers: ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def discover(self, cmdline: list[str], listening: list[int]) -> Discovered | None:
        """If `cmdline` is this engine's server process, where it serves; else None."""

    @abc.abstractmethod
    async def probe(self, target: EngineTarget, ctx: ProbeContext) -> EngineReading:
        """Read the engine once. Never raises for engine trouble: it returns a state
        (`down` when nothing answers, `unhealthy` with a reason when something is wrong)."""

    async def forget(self, target_id: str) -> None:  # noqa: B027 - optional hook
        """Release anything kept for an engine that is gone."""


def flag_value(cmdline: list[str], *names: str) -> str | None:
    """The value of `--name V` or `--name=V` in an argv list."""
    for i, arg in enumerate(cmdline):
        for name in names:
            if arg == name and i + 1 < len(cmdline):
                return cmdline[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def local_url(host: str | None, port: int) -> str:
    """A URL the agent can reach for a server bound to `host`."""
    if not host or host in ("0.0.0.0", "::", "[::]", "localhost"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def port_from(
    cmdline: list[str], names: tuple[str, ...], listening: list[int], default: int | None
) -> int | None:
    value = flag_value(cmdline, *names)
    if value is not None and value.isdigit():
        return int(value)
    if default is not None and (not listening or default in listening):
        return default
    return listening[0] if listening else default
