"""The engine plugin interface, and the one place plugins are loaded.

An engine plugin is one small class per engine kind (plugins/vllm.py, triton.py,
trtllm.py), found through the entry-point group "engineroom.engines". It owns everything
the console knows about its engine:

- `discover`: is this process one of my engines, and where does it listen?
- `probe`: read version, state, models and metrics within the context's deadline,
  normalized into engine-neutral readings (`console.core.metrics.readings`);
- `launch`: the argv that starts a fleet.toml profile (engines the agent can start);
- `ready_phases`: the log lines that mark its cold start's phases;
- capability flags, read wherever the console would otherwise branch on a kind.

Third parties add engines (SGLang, ...) by registering a subclass under the group. The
interface lives in the core so that every layer (agent, collect, gateway, config) reads
plugins through it and none imports a plugin module by name.
"""

from __future__ import annotations

import abc
import importlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, ClassVar

import aiohttp

from console.core.config.model import Profile
from console.core.fetch import Response, fetch
from console.core.launch import Launch, LaunchError
from console.core.metrics.readings import EngineReading

log = logging.getLogger(__name__)

GROUP = "engineroom.engines"
# The built-in plugins load even from a source checkout without installed metadata.
BUILTIN = {
    "vllm": "plugins.vllm:VllmPlugin",
    "triton": "plugins.triton:TritonPlugin",
    "trtllm": "plugins.trtllm:TrtllmPlugin",
}
# (phase, log-line markers): the first line holding one of the markers starts the phase.
Phases = tuple[tuple[str, tuple[str, ...]], ...]


@dataclass(frozen=True, slots=True)
class PromSeries:
    """This engine's own /metrics as Prometheus holds them, for a console that reads the
    fleet from Prometheus (console.collect.prometheus.source). Exposed names (with `_total`);
    a None is a figure the engine does not export, shown as unknown."""

    model_label: str  # the label that names the model
    present: str  # a series every served model has: the engine serves it
    running: str | None = None  # gauges
    waiting: str | None = None
    kv_cache: str | None = None  # 0..1
    # ttft/itl/e2e -> a histogram's name without _bucket, and what turns its unit into s
    histograms: Mapping[str, str] = field(default_factory=dict)
    histogram_scale: float = 1.0
    # ttft/itl/e2e -> (sum counter, count counter): a windowed mean, where no histogram
    means: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    mean_scale: float = 1.0
    requests: tuple[str, ...] = ()  # counters of finished requests, summed
    errors: tuple[str, ...] = ()  # selectors of failed ones, summed
    generation_tokens: str | None = None  # counters
    preemptions: str | None = None
    prefix_cache: tuple[str, str] | None = None  # (hits, queries) counters
    # a gauge of waiting requests with a label naming why: (series, that label)
    waiting_by_reason: tuple[str, str] | None = None
    # a counter of the API server process's CPU seconds, exported by the engine itself
    # (the same process `api_server_cpu` names: then both sources give one figure)
    process_cpu: str | None = None


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
    #: The agent can start it from a fleet.toml profile (`launch`).
    can_launch: ClassVar[bool] = False
    #: It does not speak the OpenAI API: the gateway translates for it.
    needs_translation: ClassVar[bool] = False
    #: It serves TensorRT-LLM engines, so a rebuild drill can target it.
    serves_trtllm_engines: ClassVar[bool] = False
    #: A drill that names no baseline validates against a deployment of this kind.
    drill_baseline: ClassVar[bool] = False
    #: Its cold start's phases, read from its log as it starts (`can_launch` engines).
    ready_phases: ClassVar[Phases] = ()
    #: Its series in Prometheus, when the console reads the fleet from there.
    prometheus: ClassVar[PromSeries | None] = None

    @abc.abstractmethod
    def discover(self, cmdline: list[str], listening: list[int]) -> Discovered | None:
        """If `cmdline` is this engine's server process, where it serves; else None."""

    @abc.abstractmethod
    async def probe(self, target: EngineTarget, ctx: ProbeContext) -> EngineReading:
        """Read the engine once. Never raises for engine trouble: it returns a state
        (`down` when nothing answers, `unhealthy` with a reason when something is wrong)."""

    def api_server_process(self, cmdline: list[str]) -> bool:
        """Whether the engine process found with `cmdline` is its API server alone, its
        compute in other processes (vLLM's EngineCore child), so that the process's CPU
        is the API server's (`Engine.api_server_cpu_pct`). Where one process does both
        (Triton), or it is not known, False: the API server's CPU is unknown."""
        return False

    async def forget(self, target_id: str) -> None:  # noqa: B027 - optional hook
        """Release anything kept for an engine that is gone."""

    def launch(self, profile: Profile, overrides: Mapping[str, Any]) -> Launch:
        """The argv and environment that start `profile` with `overrides` applied;
        LaunchError names the key and says why when the profile does not allow it."""
        raise LaunchError(f"engine: the agent does not start {self.kind} engines")


@dataclass(frozen=True, slots=True)
class PluginFailure:
    """A registered plugin that could not be loaded; the others carry on without it."""

    kind: str
    source: str  # "module:Class"
    error: str

    def __str__(self) -> str:
        return f"engine plugin {self.kind!r} ({self.source}) did not load: {self.error}"


@dataclass(slots=True)
class Plugins:
    loaded: dict[str, type[EnginePlugin]]
    failed: dict[str, PluginFailure]


_cache: Plugins | None = None


def load_plugins() -> dict[str, EnginePlugin]:
    """A fresh instance of every engine plugin that loads, by kind. The modules are
    imported once a process; each caller (an agent, the gateway) gets its own instances,
    since a plugin may keep per-engine clients bound to the caller's event loop."""
    return {kind: cls() for kind, cls in plugins().loaded.items()}


def plugin_kinds() -> dict[str, type[EnginePlugin]]:
    """The plugin classes that loaded, by kind: their capability flags, no instance."""
    return dict(plugins().loaded)


def plugin_failures() -> list[PluginFailure]:
    """The registered plugins that did not load, each with its error."""
    return list(plugins().failed.values())


def plugins() -> Plugins:
    global _cache
    if _cache is None:
        _cache = load_from(entry_points(group=GROUP))
    return _cache


def load_from(registered: Iterable[EntryPoint]) -> Plugins:
    """The built-in plugins and those `registered` adds (a built-in kind is not replaced).
    A plugin that raises on import, or is not an EnginePlugin, is logged and left out: one
    broken third-party engine costs its own kind, never the console."""
    sources = dict(BUILTIN)
    for ep in registered:
        sources.setdefault(ep.name, ep.value)
    out = Plugins({}, {})
    for kind, source in sources.items():
        try:
            cls = _plugin_class(source)
            if cls.kind != kind:
                raise TypeError(f"its kind is {cls.kind!r}, registered as {kind!r}")
        except Exception as exc:  # a third party's import can raise anything
            failure = PluginFailure(kind, source, f"{type(exc).__name__}: {exc}")
            log.error("%s", failure)
            out.failed[kind] = failure
            continue
        out.loaded[kind] = cls
    return out


def _plugin_class(source: str) -> type[EnginePlugin]:
    module, _, attr = source.partition(":")
    found: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        found = getattr(found, part)
    if not (isinstance(found, type) and issubclass(found, EnginePlugin)):
        raise TypeError(f"{source} is not an EnginePlugin subclass")
    return found
