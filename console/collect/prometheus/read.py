"""Prometheus' answers read into nodes, and nodes into the agents' `Snapshot`s.

Which node and engine a series belongs to: an engine's own series by its `instance`
when that is a fleet.toml deployment's endpoint (Prometheus scrapes the engine), else
by the mapping's node labels (`node`, dcgm-exporter's `Hostname`) and the port; the
agent's series by their `node` and `engine` labels. Engine ids are the agent's
("vllm-8000"), so both sources name an engine alike. Unknown stays None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from console.collect.prometheus.check import (
    AGENT_GPU_BOUNDS,
    DCGM_BOUNDS,
    ENGINE_BOUNDS,
    Notes,
    Reading,
    checked,
    disagree,
    gpu_index,
    number,
    reading,
    shown,
)
from console.collect.prometheus.model import agent_model, engine_model
from console.collect.prometheus.promql import (
    AGENT_API_SERVER_CPU,
    AGENT_GPU,
    AGENT_LATENCY,
    AGENT_MODEL,
    AGENT_QUANTILE,
    AGENT_STATS,
    AGENT_WAITING_BY_REASON,
    API_SERVER_CPU,
    DCGM_DRIVER,
    DCGM_MODEL,
    DCGM_READINGS,
    DCGM_UUID,
    TAG,
    WAITING,
    Query,
    Sample,
)
from console.core.config.load import Fleet, PrometheusSection
from console.core.metrics.readings import decode_clock_event_reasons
from console.core.plugin import PromSeries
from console.core.snapshot import (
    GPUS_NOT_READ,
    Engine,
    EngineState,
    Gpu,
    Host,
    NodeInfo,
    Snapshot,
    XidEvent,
)

MIB = 2**20
STATES: dict[str, EngineState] = {s: s for s in ("ready", "loading", "unhealthy", "down")}
MISSING = ["host", "jobs", "engine processes"]  # what Prometheus does not tell the console


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
    models: dict[str, dict[str, Reading]] = field(default_factory=dict)  # direct
    agent_models: dict[str, dict[str, Reading]] = field(default_factory=dict)
    cpu: Reading = None  # the API server's % of a core: from the engine's own series
    agent_cpu: Reading = None  # from the agent's

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Engine) and self.__dict__ == other.__dict__


@dataclass
class NodeReadings:
    """One node's raw readings in one refresh; equal readings keep the old snapshot."""

    gpus: dict[str, dict[str, Reading]] = field(default_factory=dict)  # dcgm-exporter
    gpu_ids: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    agent_gpus: dict[str, dict[str, Reading]] = field(default_factory=dict)
    driver: str | None = None
    engines: dict[str, _Engine] = field(default_factory=dict)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NodeReadings) and self.__dict__ == other.__dict__


def _merged_models(
    old: dict[str, dict[str, Reading]], new: dict[str, dict[str, Reading]]
) -> dict[str, dict[str, Reading]]:
    out = dict(old)
    for name, figures in new.items():
        out[name] = {**old.get(name, {}), **figures}
    return out


def merged(old: NodeReadings | None, new: NodeReadings) -> NodeReadings:
    """A node's readings with a slice's (or the rest of the first read's) on top: what
    was read again replaces what was; the rest stays (new containers, so the old compare
    unequal)."""
    if old is None:
        return new
    engines = dict(old.engines)
    for eid, e in new.engines.items():
        base = engines.get(eid)
        if base is None:
            engines[eid] = e
            continue
        engines[eid] = _Engine(
            base.kind,
            base.endpoint or e.endpoint,
            e.version or base.version,
            e.state or base.state,
            e.reason or base.reason,
            base.deployments or e.deployments,
            _merged_models(base.models, e.models),
            _merged_models(base.agent_models, e.agent_models),
            base.cpu if e.cpu is None else e.cpu,
            base.agent_cpu if e.agent_cpu is None else e.agent_cpu,
        )
    return NodeReadings(
        {**old.gpus, **new.gpus},
        {**old.gpu_ids, **new.gpu_ids},
        {**old.agent_gpus, **new.agent_gpus},
        new.driver or old.driver,
        engines,
    )


def _address(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def engine_id(kind: str, address: str) -> str:
    """The agent's engine id ("vllm-8001"), so Prometheus' engines and the agents' agree."""
    return f"{kind}-{address.rpartition(':')[2]}"


Nodes = dict[str, NodeReadings]  # one refresh, by node name
# Where each of an engine's deployments is read to, by its labels (see _read_engine).
Where = dict[tuple[str | None, ...], dict[str, Reading]]


def _node_in(nodes: Nodes, name: str) -> NodeReadings:
    """`nodes[name]`, made when missing (not `setdefault(name, NodeReadings())`, which
    makes one, five dicts, for every sample read: 900,000 a whole read at 10,000 nodes)."""
    node = nodes.get(name)
    if node is None:
        node = nodes[name] = NodeReadings()
    return node


class FleetReader:
    """Reads one refresh's answers into `NodeReadings`s, and a `NodeReadings` into a Snapshot."""

    def __init__(
        self, fleet: Fleet, section: PrometheusSection, engines: dict[str, PromSeries]
    ) -> None:
        self.fleet, self.section, self.engines = fleet, section, engines
        self.node_labels = list(self.section.labels.node)
        # Samples refused in the snapshots made from the current readings, by node
        # ("": label values that cannot name one): how many, and the first named.
        self.refused: dict[str, tuple[int, str]] = {}
        self._addresses: dict[str, _Address] = {}
        for model in fleet.models:
            for dep in model.deployments:
                eid = engine_id(dep.engine, _address(dep.endpoint))
                for url in {dep.endpoint, dep.metrics_endpoint or dep.endpoint}:
                    key = _address(url)
                    known = self._addresses.get(key)
                    deps = (*known.deployments, dep.id) if known else (dep.id,)
                    self._addresses[key] = _Address(dep.node, dep.engine, eid, dep.endpoint, deps)

    def engine_where(self, labels: dict[str, str], kind: str) -> tuple[str, str]:
        """The node and engine id of one of an engine's own series."""
        found = self._addresses.get(labels.get("instance", ""))
        if found is not None and found.kind == kind:
            return found.node, found.engine_id
        return self._node_of(labels) or "?", engine_id(kind, labels.get("instance", ""))

    def _node_of(self, labels: dict[str, str]) -> str | None:
        for key in self.node_labels:
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

    def node_of(self, query: Query, labels: dict[str, str]) -> str | None:
        """The node a sample of `query` is read into (None: none)."""
        if query.family in ("gpu", "gpu_id"):
            return self._node_of(labels)
        if query.family.startswith("agent_"):
            return labels.get("node")
        if query.family == "up":
            found = self._addresses.get(labels.get("instance", ""))
            return found.node if found else None
        return self._engine_of(labels, query.kind or "?")[0]

    def read(
        self,
        query: Query,
        result: list[Sample],
        nodes: Nodes,
        where: Where | None = None,
    ) -> None:
        """`result` into `nodes`. `where`: kept between the slices of one answer, where
        each of an engine's deployments was read to (see _read_engine)."""
        read = {
            "up": self._read_up,
            "gpu": self._read_gpu,
            "gpu_id": self._read_gpu,
            "agent_gpu": self._read_agent_gpu,
            "agent_engine": self._read_agent,
            "agent_model": self._read_agent,
        }.get(query.family)
        if read is None:
            self._read_engine(query, result, nodes, {} if where is None else where)
            return
        for sample in result:
            value = reading(sample.value.text) if sample.value else None
            read(query, sample.metric, value, nodes)

    def _read_up(
        self,
        query: Query,
        labels: dict[str, str],
        value: Reading,
        nodes: Nodes,
    ) -> None:
        found = self._addresses.get(labels.get("instance", ""))
        if found is not None and value == 0:
            engine = self._engine_at(nodes, found.node, found.engine_id, found.kind, found)
            engine.state = engine.state or "down"
            engine.reason = "Prometheus cannot scrape it (up == 0)"

    def _read_gpu(
        self,
        query: Query,
        labels: dict[str, str],
        value: Reading,
        nodes: Nodes,
    ) -> None:
        name = self._node_of(labels)
        index = labels.get(self.section.labels.gpu, "")  # "": none, refused when read
        if name is None:
            return
        node = _node_in(nodes, name)
        if query.family == "gpu":
            key = DCGM_READINGS.get(labels.get("__name__", ""))
            if key is not None and value is not None:
                gpu = node.gpus.get(index)
                if gpu is None:
                    gpu = node.gpus[index] = {}
                old = gpu.get(key)
                gpu[key] = value if old is None else disagree(old, value)
        else:
            node.gpu_ids[index] = (labels.get(DCGM_UUID), labels.get(DCGM_MODEL))
            node.driver = labels.get(DCGM_DRIVER) or node.driver

    def _read_agent_gpu(
        self,
        query: Query,
        labels: dict[str, str],
        value: Reading,
        nodes: Nodes,
    ) -> None:
        name, index = labels.get("node"), labels.get("gpu", "")
        field_name = AGENT_GPU.get(labels.get("__name__", ""))
        if name and field_name and value is not None:
            node = _node_in(nodes, name)
            gpu = node.agent_gpus.get(index)
            if gpu is None:
                gpu = node.agent_gpus[index] = {}
            old = gpu.get(field_name)
            gpu[field_name] = value if old is None else disagree(old, value)
            node.gpu_ids.setdefault(index, (labels.get("uuid"), None))

    def _read_agent(
        self,
        query: Query,
        labels: dict[str, str],
        value: Reading,
        nodes: Nodes,
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
        metric = labels.get("__name__", "")
        if metric == AGENT_API_SERVER_CPU:
            engine.agent_cpu = value
            return
        model = engine.agent_models.setdefault(labels.get("model", "?"), {})
        if metric in AGENT_MODEL:
            model[AGENT_MODEL[metric]] = value
        elif metric == AGENT_WAITING_BY_REASON:
            model[WAITING + labels.get("reason", "")] = value
        elif metric in AGENT_LATENCY:
            stat = labels.get("stat") or AGENT_QUANTILE.get(labels.get("quantile", ""))
            if stat in AGENT_STATS:
                model[f"{AGENT_LATENCY[metric]}.{stat}"] = value

    def _read_engine(
        self,
        query: Query,
        result: list[Sample],
        nodes: Nodes,
        where: Where,
    ) -> None:
        """An engine's own series, scraped from the engine by Prometheus. A deployment's
        figures come as several samples with the same labels but one (the figure, or its
        name): where they go is worked out once per deployment, not per sample (a sliced
        refresh at 10,000 nodes reads 40,000 of them). `where` holds it for the whole
        answer: read in slices, a deployment's samples are often in different ones (the
        counters' answer at 10,000 nodes had each figure's 20,000 series in a row)."""
        kind = query.kind or "?"
        ps = self.engines[kind]
        model_label = self.section.labels.model.get(kind, ps.model_label)
        node_labels = self.node_labels
        family = query.family
        # A gauge series -> the figures it gives (vLLM's running requests also say that
        # the model is served).
        gauges: dict[str, list[str]] = {}
        for key, series in (
            ("present", ps.present),
            ("requests_running", ps.running),
            ("requests_waiting", ps.waiting),
            ("kv_cache_usage", ps.kv_cache),
        ):
            if series:
                gauges.setdefault(series, []).append(key)
        by_reason, reason_label = ps.waiting_by_reason or (None, "")
        keys: dict[str, str] = {}  # a hist query's tag -> its figure's key ("ttft.p95")
        # A gauge is an exporter's sample; the others are Prometheus' arithmetic, where
        # NaN is no traffic in the window (0/0), not a bad sample.
        value_of = reading if family == "gauges" else number
        for sample in result:
            labels = sample.metric
            value = value_of(sample.value.text) if sample.value else None
            tag = labels.get(TAG, "")
            if tag == API_SERVER_CPU:  # the engine's, with no model label
                node, eid, found = self._engine_of(labels, kind)
                self._engine_at(nodes, node, eid, kind, found).cpu = value
                continue
            at = (labels.get("instance"), labels.get(model_label), *map(labels.get, node_labels))
            model = where.get(at)
            if model is None:
                model = where[at] = self._engine_model(kind, labels, model_label, nodes)
            if family == "gauges":
                name = labels.get("__name__", "")
                if name == by_reason:
                    model[WAITING + labels.get(reason_label, "")] = value
                for key in gauges.get(name, ()):
                    model[key] = value
            elif family == "hist":
                key = keys.get(tag) or keys.setdefault(tag, f"{query.figure}.{tag}")
                scale = 1.0 if tag == "count" else ps.histogram_scale
                model[key] = None if value is None else float(value) * scale
            elif family == "counters":
                scale = ps.mean_scale if tag.startswith("mean:") else 1.0
                model[tag] = None if value is None else float(value) * scale

    def _engine_model(
        self, kind: str, labels: dict[str, str], model_label: str, nodes: Nodes
    ) -> dict[str, Reading]:
        """The figures of the model an engine's series is about, in its node's readings."""
        instance = labels.get("instance", "")
        found = self._addresses.get(instance)
        if found is not None and found.kind == kind:
            engine = self._engine_at(nodes, found.node, found.engine_id, kind, found)
        else:  # not in fleet.toml: named by the node labels and the port
            node = self._node_of(labels) or "?"
            engine = self._engine_at(nodes, node, engine_id(kind, instance), kind, None)
            engine.endpoint = engine.endpoint or (f"http://{instance}" if instance else None)
        return engine.models.setdefault(labels.get(model_label, "?"), {})

    def _engine_at(
        self, nodes: Nodes, node: str, eid: str, kind: str, found: _Address | None
    ) -> _Engine:
        engines = _node_in(nodes, node).engines
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

    def snapshot(
        self, name: str, node: NodeReadings, wall: float, gpus_read: bool = True
    ) -> Snapshot:
        """`gpus_read`: the GPU queries have answered (else the GPUs are not known yet).
        The samples refused on the way are kept in `refused` under the node's name."""
        notes = Notes(f"node {shown(name)}")
        gpus = self._gpus(node, wall, notes)
        engines = [self._engine(eid, e, notes) for eid, e in sorted(node.engines.items())]
        self.note(name, notes)
        if gpus:
            gpu_status = "ok"
        elif gpus_read:
            gpu_status = "no GPU series in Prometheus (dcgm-exporter or agent)"
        else:
            gpu_status = GPUS_NOT_READ
        return Snapshot(
            node=NodeInfo(name=name, agent_version="prometheus", time=wall),
            host=Host(),
            gpu_status=gpu_status,
            driver_version=node.driver,
            gpus=gpus,
            engines=engines,
            source="prometheus",
            missing=MISSING,
            cycle={},
        )

    def note(self, key: str, notes: Notes | None) -> None:
        """What was refused for `key` (a node; "" for the names), replacing what was."""
        if notes is None or not notes.count:
            self.refused.pop(key, None)
        else:
            self.refused[key] = (notes.count, notes.first or "")

    def _gpus(self, node: NodeReadings, wall: float, notes: Notes) -> list[Gpu]:
        out = []
        if node.gpus or not node.agent_gpus:
            # A GPU known by its identity alone (its readings not read yet, or refused)
            # is listed with its readings unknown.
            for label in node.gpus.keys() | node.gpu_ids.keys():
                index = gpu_index(label)
                if index is None:
                    notes.add(f"gpu {shown(label)}", "not a GPU index (0-9999)")
                    continue
                r = checked(node.gpus.get(label, {}), DCGM_BOUNDS.get, notes, f"gpu {index}")
                used, free = r.get("fb_used"), r.get("fb_free")
                total = (
                    None
                    if used is None or free is None
                    else used + free + (r.get("fb_reserved") or 0.0)
                )
                uuid, model = node.gpu_ids.get(label, (None, None))
                xid, ecc, throttle, clock = (
                    r.get("xid"),
                    r.get("ecc"),
                    r.get("throttle"),
                    r.get("sm_clock"),
                )
                out.append(
                    Gpu(
                        index=index,
                        uuid=uuid,
                        name=model,
                        utilization_pct=r.get("util"),
                        memory_used_bytes=None if used is None else int(used * MIB),
                        memory_total_bytes=None if total is None else int(total * MIB),
                        temperature_c=r.get("temp"),
                        power_w=r.get("power"),
                        sm_clock_mhz=None if clock is None else int(clock),
                        ecc_uncorrected=None if ecc is None else int(ecc),
                        xid_events=[XidEvent(time=wall, xid=int(xid))] if xid else [],
                        clock_event_reasons=None
                        if throttle is None
                        else decode_clock_event_reasons(int(throttle)),
                    )
                )
        else:
            for label, values in node.agent_gpus.items():
                index = gpu_index(label)
                if index is None:
                    notes.add(f"gpu {shown(label)}", "not a GPU index (0-9999)")
                    continue
                fields: dict[str, Any] = dict(
                    checked(values, AGENT_GPU_BOUNDS.get, notes, f"gpu {index}")
                )
                for key in ("memory_used_bytes", "memory_total_bytes", "sm_clock_mhz"):
                    if fields.get(key) is not None:
                        fields[key] = int(fields[key])
                if fields.get("ecc_uncorrected") is not None:
                    fields["ecc_uncorrected"] = int(fields["ecc_uncorrected"])
                uuid = node.gpu_ids.get(label, (None, None))[0]
                out.append(Gpu(index=index, uuid=uuid, **fields))
        out.sort(key=lambda g: g.index)
        return out

    def _engine(self, eid: str, e: _Engine, notes: Notes) -> Engine:
        if e.models:
            ps, window_s = self.engines[e.kind], self.section.window_s
            models = [
                engine_model(name, r, ps, window_s, notes) for name, r in sorted(e.models.items())
            ]
        else:
            models = [agent_model(name, r, notes) for name, r in sorted(e.agent_models.items())]
        state = STATES.get(e.state or ("ready" if e.models else "down"), "unhealthy")
        cpu = e.agent_cpu if e.cpu is None else e.cpu
        checked_cpu = checked({API_SERVER_CPU: cpu}, ENGINE_BOUNDS.get, notes, f"engine {eid}")
        return Engine(
            id=eid,
            kind=e.kind,
            endpoint=e.endpoint,
            version=e.version,
            state=state,
            reason=e.reason,
            deployment_ids=list(e.deployments),
            models=models,
            api_server_cpu_pct=checked_cpu[API_SERVER_CPU],
        )
