"""The fleet read from Prometheus: the console works against the telemetry a team already
runs, with no agent anywhere, and scales past the point where one console can hold a
stream per node.

Each refresh runs the fixed set of instant queries in `promql` (one per metric family,
across the whole fleet), concurrently, each within the section's deadline and size cap,
over one HTTP client. The answers become the same `Snapshot`s the agents send, one per
node, so every screen and `engineroom check` work unchanged. A node whose readings did
not change since the last refresh keeps its snapshot object, so the view redoes nothing
for it (Prometheus' figures change once a scrape, typically every 15-30 s).

Nodes come from fleet.toml, from the series (`[prometheus] discover`), or both. A node
with an agent keeps its actions: `PromSource` is a `Collector` whose agents are asked only
what our token may do (`roles`), never for snapshots.
"""

from __future__ import annotations

import asyncio
import base64
import math
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import msgspec

from console.collect import apiclient
from console.collect.collector import Collector, NodeState
from console.collect.promql import (
    AGENT_GPU,
    AGENT_LATENCY,
    AGENT_MODEL,
    AGENT_QUANTILE,
    AGENT_STATS,
    ANSWER,
    DCGM_DRIVER,
    DCGM_MODEL,
    DCGM_READINGS,
    DCGM_UUID,
    TAG,
    Query,
    Sample,
    fleet_queries,
)
from console.core.config import Fleet, MissingSecret, PrometheusSection
from console.core.plugin import PromSeries, plugin_kinds
from console.core.wire import (
    Engine,
    Gpu,
    Host,
    Latency,
    ModelStats,
    NodeInfo,
    Percentiles,
    Snapshot,
    XidEvent,
)

MIB = 2**20
FIGURES = ("ttft", "itl", "e2e")
MISSING = ["host", "jobs", "engine processes"]  # what Prometheus does not tell the console


class PromError(Exception):
    """Why Prometheus gave no usable answer, worded for the header and `check`."""


@dataclass
class SourceHealth:
    """How the last refresh went: shown in the header and in `check`."""

    url: str
    ok: bool | None = None  # None: not asked yet
    error: str | None = None
    queries: int = 0  # per refresh
    failed: int = 0
    prometheus_s: float | None = None  # Prometheus' own time, summed over the queries
    wall_s: float | None = None  # the refresh, from the first query out to the last answer
    samples: int = 0
    nodes: int = 0
    last_ok: float | None = None  # monotonic

    def line(self) -> str:
        if self.ok is None:
            return f"prometheus {self.url}: first refresh under way"
        if not self.ok:
            return f"prometheus {self.url}: {self.error}"
        took = (
            ""
            if self.prometheus_s is None
            else f", {self.prometheus_s * 1000:.0f} ms in Prometheus"
        )
        wall = f"{self.wall_s or 0:.2f} s a refresh"
        text = f"prometheus {self.url}: {self.queries} queries{took}, {wall}"
        if self.error:
            text += f"; {self.failed} failed: {self.error}"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "ok": self.ok,
            "error": self.error,
            "queries": self.queries,
            "failed": self.failed,
            "prometheus_s": self.prometheus_s,
            "wall_s": self.wall_s,
            "samples": self.samples,
            "nodes": self.nodes,
        }


@dataclass(frozen=True, slots=True)
class _Address:
    """What a scrape target's `instance` is, from the fleet file's deployments."""

    node: str
    kind: str
    engine_id: str
    endpoint: str
    deployments: tuple[str, ...]


@dataclass
class _Engine:
    kind: str
    endpoint: str | None = None
    version: str | None = None
    state: str | None = None
    reason: str | None = None
    deployments: tuple[str, ...] = ()
    models: dict[str, dict[str, float | None]] = field(default_factory=dict)  # direct
    agent_models: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Engine) and self.__dict__ == other.__dict__


@dataclass
class _Node:
    """One node's raw readings in one refresh; equal readings keep the old snapshot."""

    gpus: dict[str, dict[str, float | None]] = field(default_factory=dict)  # dcgm-exporter
    gpu_ids: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    agent_gpus: dict[str, dict[str, float | None]] = field(default_factory=dict)
    driver: str | None = None
    engines: dict[str, _Engine] = field(default_factory=dict)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Node) and self.__dict__ == other.__dict__


def _float(text: str) -> float | None:
    value = float(text)
    return None if math.isnan(value) or math.isinf(value) else value


def _address(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def engine_id(kind: str, address: str) -> str:
    """The agent's engine id ("vllm-8001"), so Prometheus' engines and the agents' agree."""
    return f"{kind}-{address.rpartition(':')[2]}"


class PromSource(Collector):
    """The fleet from Prometheus; `states`, `history` and `roles` as the Collector's."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        refresh_s: float | None = None,
        timeout_s: float | None = None,
        on_update: Callable[[NodeState], None] | None = None,
    ) -> None:
        super().__init__(fleet, refresh_s=refresh_s, timeout_s=timeout_s, on_update=on_update)
        assert fleet.prometheus is not None, "PromSource needs a [prometheus] section"
        self.section: PrometheusSection = fleet.prometheus
        self.timeout_s = timeout_s or self.section.timeout_s
        self.health = SourceHealth(self.section.url)
        self.engines: dict[str, PromSeries] = {
            kind: cls.prometheus for kind, cls in plugin_kinds().items() if cls.prometheus
        }
        self.queries = fleet_queries(self.section, self.engines)
        self.health.queries = len(self.queries)
        for state in self.states.values():
            state.transport = "prometheus"
        self._node_labels = list(self.section.labels.node)
        self._addresses: dict[str, _Address] = {}
        for model in fleet.models:
            for dep in model.deployments:
                eid = engine_id(dep.engine, _address(dep.endpoint))
                for url in {dep.endpoint, dep.metrics_endpoint or dep.endpoint}:
                    key = _address(url)
                    known = self._addresses.get(key)
                    deps = (*known.deployments, dep.id) if known else (dep.id,)
                    self._addresses[key] = _Address(dep.node, dep.engine, eid, dep.endpoint, deps)
        self._readings: dict[str, _Node] = {}
        self._http: Any = None
        self._headers, self._auth_error = self._auth()

    def _auth(self) -> tuple[dict[str, str], str | None]:
        s = self.section
        try:
            if s.token_env:
                token = self.fleet.secret(s.token_env, ("prometheus", "token_env"))
                return {"Authorization": f"Bearer {token}"}, None
            if s.username_env and s.password_env:
                user = self.fleet.secret(s.username_env, ("prometheus", "username_env"))
                word = self.fleet.secret(s.password_env, ("prometheus", "password_env"))
                pair = base64.b64encode(f"{user}:{word}".encode()).decode()
                return {"Authorization": f"Basic {pair}"}, None
        except MissingSecret as exc:
            return {}, f"no credentials ({exc.short})"
        return {}, None

    def _verify(self) -> ssl.SSLContext | bool | None:
        if not self.section.verify_tls:
            return False
        if self.section.ca_file:
            return ssl.create_default_context(cafile=self.section.ca_file)
        return None

    async def __aenter__(self) -> PromSource:
        await super().__aenter__()
        self._http = apiclient.async_client(
            self.section.url, self._headers, self.timeout_s, verify=self._verify()
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await super().__aexit__(*exc)
        if self._http is not None:
            await self._http.aclose()

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._refresh_loop(), name="prometheus"))

    async def poll_all(self) -> dict[str, NodeState]:
        await self.refresh()
        return self.states

    async def _refresh_loop(self) -> None:
        while True:
            started = time.monotonic()
            await self.refresh()
            await asyncio.sleep(max(0.0, self.refresh_s - (time.monotonic() - started)))

    # -- one refresh ---------------------------------------------------------------------

    async def refresh(self) -> None:
        """Run the queries, then turn the answers into node states. Never raises: a
        Prometheus that is down, slow or erring is said in `health` and on every node."""
        started = time.monotonic()
        if self._auth_error is not None:
            self._all_failed(self._auth_error)
            return
        answers = await asyncio.gather(
            *(self._instant(q.expr) for q in self.queries), return_exceptions=True
        )
        health = self.health
        health.wall_s = time.monotonic() - started
        errors = [
            (q, a)
            for q, a in zip(self.queries, answers, strict=True)
            if isinstance(a, BaseException)
        ]
        for _, failure in errors:
            if not isinstance(failure, PromError):
                raise failure
        if len(errors) == len(self.queries):
            self._all_failed(str(errors[0][1]))
            return
        health.failed = len(errors)
        health.error = f"{errors[0][0].family} query: {errors[0][1]}" if errors else None
        prom_s = 0.0
        samples = 0
        nodes: dict[str, _Node] = {}
        for query, answer in zip(self.queries, answers, strict=True):
            if isinstance(answer, BaseException):
                continue
            result, took = answer
            prom_s += took
            samples += len(result)
            self._read(query, result, nodes)
        health.ok, health.prometheus_s, health.samples = True, prom_s, samples
        health.last_ok = time.monotonic()
        self._apply(nodes)
        health.nodes = len(nodes)

    async def _instant(self, expr: str) -> tuple[list[Sample], float]:
        assert self._http is not None, "use the source as an async context manager"
        try:
            status, body = await apiclient.request(
                self._http,
                "GET",
                "/api/v1/query",
                params={"query": expr, "stats": "all"},
                deadline_s=self.timeout_s,
                max_bytes=self.section.max_response_bytes,
            )
        except apiclient.NoAnswer as exc:
            raise PromError(str(exc)) from None
        return _result(status, body)

    async def range_query(self, expr: str, start: float, end: float, step: float) -> list[Sample]:
        """GET /api/v1/query_range within the deadline and size cap (Model detail's history)."""
        assert self._http is not None, "use the source as an async context manager"
        try:
            status, body = await apiclient.request(
                self._http,
                "GET",
                "/api/v1/query_range",
                params={
                    "query": expr,
                    "start": f"{start:.3f}",
                    "end": f"{end:.3f}",
                    "step": f"{step:g}",
                },
                deadline_s=self.timeout_s,
                max_bytes=self.section.max_response_bytes,
            )
        except apiclient.NoAnswer as exc:
            raise PromError(str(exc)) from None
        return _result(status, body)[0]

    def _all_failed(self, why: str) -> None:
        self.health.ok, self.health.error = False, why
        message = f"Prometheus: {why}"
        for state in self.states.values():
            state.failures += 1
            state.error = message
            if self.on_update is not None:
                self.on_update(state)

    # -- answers into readings -----------------------------------------------------------

    def _node_of(self, labels: dict[str, str]) -> str | None:
        for key in self._node_labels:
            value = labels.get(key)
            if value:
                return value
        instance = labels.get("instance")
        if instance:
            found = self._addresses.get(instance)
            return found.node if found else instance
        return None

    def _engine_of(self, labels: dict[str, str], kind: str) -> tuple[str, str, _Address | None]:
        """The node and engine id of one of an engine's own series: a deployment's when
        its `instance` is one's endpoint, else from the node labels and the port."""
        instance = labels.get("instance", "")
        found = self._addresses.get(instance)
        if found is not None and found.kind == kind:
            return found.node, found.engine_id, found
        return self._node_of(labels) or "?", engine_id(kind, instance), None

    def _read(self, query: Query, result: list[Sample], nodes: dict[str, _Node]) -> None:
        read = {
            "up": self._read_up,
            "gpu": self._read_gpu,
            "gpu_id": self._read_gpu,
            "agent_gpu": self._read_agent_gpu,
            "agent_engine": self._read_agent,
            "agent_model": self._read_agent,
        }.get(query.family, self._read_engine)
        for sample in result:
            value = _float(sample.value[1]) if sample.value else None
            read(query, sample.metric, value, nodes)

    def _read_up(
        self, query: Query, labels: dict[str, str], value: float | None, nodes: dict[str, _Node]
    ) -> None:
        found = self._addresses.get(labels.get("instance", ""))
        if found is not None and value == 0:
            engine = self._engine_at(nodes, found.node, found.engine_id, found.kind, found)
            engine.state = engine.state or "down"
            engine.reason = "Prometheus cannot scrape it (up == 0)"

    def _read_gpu(
        self, query: Query, labels: dict[str, str], value: float | None, nodes: dict[str, _Node]
    ) -> None:
        name = self._node_of(labels)
        index = labels.get(self.section.labels.gpu)
        if name is None or index is None:
            return
        node = nodes.setdefault(name, _Node())
        if query.family == "gpu":
            reading = DCGM_READINGS.get(labels.get("__name__", ""))
            if reading is not None:
                node.gpus.setdefault(index, {})[reading] = value
        else:
            node.gpu_ids[index] = (labels.get(DCGM_UUID), labels.get(DCGM_MODEL))
            node.driver = labels.get(DCGM_DRIVER) or node.driver

    def _read_agent_gpu(
        self, query: Query, labels: dict[str, str], value: float | None, nodes: dict[str, _Node]
    ) -> None:
        name, index = labels.get("node"), labels.get("gpu")
        field_name = AGENT_GPU.get(labels.get("__name__", ""))
        if name and index is not None and field_name:
            node = nodes.setdefault(name, _Node())
            node.agent_gpus.setdefault(index, {})[field_name] = value
            node.gpu_ids.setdefault(index, (labels.get("uuid"), None))

    def _read_agent(
        self, query: Query, labels: dict[str, str], value: float | None, nodes: dict[str, _Node]
    ) -> None:
        """The agent's engine states and model figures (engineroom_*)."""
        name, eid = labels.get("node"), labels.get("engine")
        if not name or not eid:
            return
        engine = self._engine_at(nodes, name, eid, labels.get("kind", "?"), None)
        if query.family == "agent_engine":
            engine.version = labels.get("version")
            engine.state = labels.get("state")
            return
        model = engine.agent_models.setdefault(labels.get("model", "?"), {})
        metric = labels.get("__name__", "")
        if metric in AGENT_MODEL:
            model[AGENT_MODEL[metric]] = value
        elif metric in AGENT_LATENCY:
            stat = labels.get("stat") or AGENT_QUANTILE.get(labels.get("quantile", ""))
            if stat in AGENT_STATS:
                model[f"{AGENT_LATENCY[metric]}.{stat}"] = value

    def _read_engine(
        self, query: Query, labels: dict[str, str], value: float | None, nodes: dict[str, _Node]
    ) -> None:
        """One of an engine's own series, scraped from the engine by Prometheus."""
        kind = query.kind or "?"
        ps = self.engines[kind]
        instance = labels.get("instance", "")
        found = self._addresses.get(instance)
        if found is not None and found.kind == kind:
            engine = self._engine_at(nodes, found.node, found.engine_id, kind, found)
        else:  # not in fleet.toml: named by the node labels and the port
            node = self._node_of(labels) or "?"
            engine = self._engine_at(nodes, node, engine_id(kind, instance), kind, None)
            engine.endpoint = engine.endpoint or (f"http://{instance}" if instance else None)
        model = engine.models.setdefault(
            labels.get(self.section.labels.model.get(kind, ps.model_label), "?"), {}
        )
        tag = labels.get(TAG, "")
        if query.family == "gauges":
            metric = labels.get("__name__", "")
            for key, series in (
                ("present", ps.present),
                ("requests_running", ps.running),
                ("requests_waiting", ps.waiting),
                ("kv_cache_usage", ps.kv_cache),
            ):
                if metric == series:
                    model[key] = value
        elif query.family == "hist":
            scale = 1.0 if tag == "count" else ps.histogram_scale
            model[f"{query.figure}.{tag}"] = None if value is None else value * scale
        elif query.family == "counters":
            scale = ps.mean_scale if tag.startswith("mean:") else 1.0
            model[tag] = None if value is None else value * scale

    def _engine_at(
        self, nodes: dict[str, _Node], node: str, eid: str, kind: str, found: _Address | None
    ) -> _Engine:
        engines = nodes.setdefault(node, _Node()).engines
        engine = engines.get(eid)
        if engine is None:
            engine = engines[eid] = _Engine(kind)
            if found is not None:
                engine.endpoint, engine.deployments = found.endpoint, found.deployments
            else:
                engine.deployments = self._deployments_of(node, eid)
        return engine

    def _deployments_of(self, node: str, eid: str) -> tuple[str, ...]:
        return tuple(
            dep.id
            for _, dep in self.fleet.deployments_on(node)
            if engine_id(dep.engine, _address(dep.endpoint)) == eid
        )

    # -- readings into node states -------------------------------------------------------

    def _apply(self, nodes: dict[str, _Node]) -> None:
        now, wall = time.monotonic(), time.time()
        if self.section.discover:
            for name in sorted(nodes.keys() - self.states.keys()):
                self.states[name] = NodeState(name, "prometheus")
        for name, state in self.states.items():
            reading = nodes.get(name)
            if reading is None:
                state.failures += 1
                labels = ", ".join(self._node_labels)
                state.error = f"no series in Prometheus names this node (labels {labels}, instance)"
            else:
                if state.snapshot is None or self._readings.get(name) != reading:
                    state.snapshot = self._snapshot(name, reading, wall)
                    self._readings[name] = reading
                    self.history.record(name, state.snapshot)
                state.last_ok, state.failures, state.error = now, 0, None
                state.polls += 1
            if self.on_update is not None:
                self.on_update(state)

    def _snapshot(self, name: str, node: _Node, wall: float) -> Snapshot:
        gpus = self._gpus(node, wall)
        engines = [self._engine(eid, e) for eid, e in sorted(node.engines.items())]
        return Snapshot.model_construct(
            node=NodeInfo.model_construct(name=name, agent_version="prometheus", time=wall),
            host=Host(),
            gpu_status="ok" if gpus else "no GPU series in Prometheus (dcgm-exporter or agent)",
            driver_version=node.driver,
            gpus=gpus,
            engines=engines,
            source="prometheus",
            missing=MISSING,
        )

    def _gpus(self, node: _Node, wall: float) -> list[Gpu]:
        out = []
        if node.gpus:
            for index, r in node.gpus.items():
                if not index.isdigit():
                    continue
                used, free = r.get("fb_used"), r.get("fb_free")
                total = (
                    None
                    if used is None or free is None
                    else used + free + (r.get("fb_reserved") or 0.0)
                )
                uuid, model = node.gpu_ids.get(index, (None, None))
                xid, ecc = r.get("xid"), r.get("ecc")
                out.append(
                    Gpu.model_construct(
                        index=int(index),
                        uuid=uuid,
                        name=model,
                        utilization_pct=r.get("util"),
                        memory_used_bytes=None if used is None else int(used * MIB),
                        memory_total_bytes=None if total is None else int(total * MIB),
                        temperature_c=r.get("temp"),
                        power_w=r.get("power"),
                        sm_clock_mhz=None if r.get("sm_clock") is None else int(r["sm_clock"] or 0),
                        ecc_uncorrected=None if ecc is None else int(ecc),
                        xid_events=[XidEvent(time=wall, xid=int(xid))] if xid else [],
                    )
                )
        else:
            for index, r in node.agent_gpus.items():
                if not index.isdigit():
                    continue
                fields: dict[str, Any] = dict(r)
                for key in ("memory_used_bytes", "memory_total_bytes", "sm_clock_mhz"):
                    if fields.get(key) is not None:
                        fields[key] = int(fields[key])
                if fields.get("ecc_uncorrected") is not None:
                    fields["ecc_uncorrected"] = int(fields["ecc_uncorrected"])
                uuid = node.gpu_ids.get(index, (None, None))[0]
                out.append(Gpu.model_construct(index=int(index), uuid=uuid, **fields))
        out.sort(key=lambda g: g.index)
        return out

    def _engine(self, eid: str, e: _Engine) -> Engine:
        if e.models:
            models = [self._model(name, r, e.kind) for name, r in sorted(e.models.items())]
        else:
            models = [_agent_model(name, r) for name, r in sorted(e.agent_models.items())]
        state = e.state or ("ready" if e.models else "down")
        return Engine.model_construct(
            id=eid,
            kind=e.kind,
            endpoint=e.endpoint,
            version=e.version,
            state=state if state in ("ready", "loading", "unhealthy", "down") else "unhealthy",
            reason=e.reason,
            deployment_ids=list(e.deployments),
            models=models,
        )

    def _model(self, name: str, r: dict[str, float | None], kind: str) -> ModelStats:
        ps = self.engines[kind]
        requests, errors = r.get("requests"), r.get("errors")
        latency = {}
        for figure in FIGURES:
            if figure in ps.histograms and f"{figure}.count" in r:
                latency[f"{figure}_s"] = Percentiles.model_construct(
                    p50=r.get(f"{figure}.p50"),
                    p95=r.get(f"{figure}.p95"),
                    p99=r.get(f"{figure}.p99"),
                    mean=r.get(f"{figure}.mean"),
                    count=r.get(f"{figure}.count"),
                    source="histogram",
                )
            elif f"mean:{figure}" in r or f"count:{figure}" in r:
                latency[f"{figure}_s"] = Percentiles.model_construct(
                    mean=r.get(f"mean:{figure}"), count=r.get(f"count:{figure}"), source="mean"
                )
        return ModelStats.model_construct(
            name=name,
            requests_running=r.get("requests_running"),
            requests_waiting=r.get("requests_waiting"),
            kv_cache_usage=r.get("kv_cache_usage"),
            request_rate=requests,
            error_rate=(min(1.0, errors / requests) if requests and errors is not None else None),
            latency=Latency(**latency),
            window_s=self.section.window_s,
        )


def _agent_model(name: str, r: dict[str, float | None]) -> ModelStats:
    """A model from the agent's own series (Prometheus scrapes the agent, not the engine)."""
    latency = {}
    for figure in FIGURES:
        stats: dict[str, Any] = {
            s: r.get(f"{figure}.{s}") for s in AGENT_STATS if f"{figure}.{s}" in r
        }
        if stats:
            source = "histogram" if any(k != "mean" for k in stats) else "mean"
            latency[f"{figure}_s"] = Percentiles.model_construct(**stats, source=source)
    return ModelStats.model_construct(
        name=name,
        requests_running=r.get("requests_running"),
        requests_waiting=r.get("requests_waiting"),
        kv_cache_usage=r.get("kv_cache_usage"),
        request_rate=r.get("request_rate"),
        error_rate=r.get("error_rate"),
        latency=Latency(**latency),
    )


def _result(status: int, body: bytes) -> tuple[list[Sample], float]:
    """An answer's samples and Prometheus' own time, or PromError in Prometheus' words."""
    try:
        answer = ANSWER.decode(body)
    except msgspec.DecodeError:
        raise PromError(f"HTTP {status}, not a Prometheus answer: {body[:120]!r}") from None
    if answer.status != "success" or answer.data is None:
        raise PromError(
            f"HTTP {status}: {answer.errorType or 'error'}: {answer.error or '?'}"[:300]
        )
    took = 0.0
    timings = (answer.data.stats or {}).get("timings")
    if isinstance(timings, dict):
        total = timings.get("execTotalTime")
        took = float(total) if isinstance(total, (int, float)) else 0.0
    return answer.data.result, took


def fleet_source(
    fleet: Fleet,
    *,
    refresh_s: float | None = None,
    timeout_s: float | None = None,
    on_update: Callable[[NodeState], None] | None = None,
) -> Collector:
    """What the console reads the fleet through: Prometheus when fleet.toml has a
    [prometheus] section, else the agents (and SSH) directly."""
    if fleet.prometheus is not None:
        return PromSource(fleet, refresh_s=refresh_s, timeout_s=timeout_s, on_update=on_update)
    return Collector(fleet, refresh_s=refresh_s, timeout_s=timeout_s, on_update=on_update)
