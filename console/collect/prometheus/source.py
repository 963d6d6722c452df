"""The fleet read from Prometheus: the console works against the telemetry a team already
runs, with no agent anywhere, and scales past the point where one console can hold a
stream per node.

Each refresh runs the fixed set of instant queries in `promql` (one per metric family,
across the whole fleet), concurrently, each within the section's deadline and size cap,
over one HTTP client. The answers become the same `Snapshot`s the agents send, one per
node, so every screen and `engineroom check` work unchanged. A node whose readings did
not change since the last refresh keeps its snapshot object, so the view redoes nothing
for it (Prometheus' figures change once a scrape, typically every 15-30 s).

A large fleet is read in slices. A whole read learns, for each query with a large
answer, the label that names its nodes (the one on every sample with the most values)
and splits those values into slices; each refresh in between reads the next slice of
each such query, selected by a label matcher (`node=~"a|b|..."`), so Prometheus touches
only those series (docs/scale.md measured why a timestamp filter does not do this). The
whole fleet again, to find nodes that came or went, at most a tenth of the time.

Nodes come from fleet.toml, from the series (`[prometheus] discover`), or both. A node
with an agent keeps its actions: `PromSource` is a `Collector` whose agents are asked only
what our token may do (`roles`), never for snapshots.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial

from console.collect import collection_paused
from console.collect.prometheus.check import SECONDS, Notes, name_problem, number, shown
from console.collect.prometheus.http import Answered, Budget, OverBudget, PromClient, PromError
from console.collect.prometheus.promql import Query, Sample, fleet_queries, history_queries, matcher
from console.collect.prometheus.read import FleetReader, NodeReadings, Where, merged
from console.collect.sources.collector import Collector, NodeState
from console.collect.sources.source import FleetSource, HistoryLine, SourceHealth
from console.core.config.load import Fleet, PrometheusSection
from console.core.plugin import PromSeries, plugin_kinds

__all__ = ["PromError", "PromSource", "fleet_source"]

HISTORY_POINTS = 240  # a range query's points: an hour at 15 s
# The whole fleet is read again FULL_EVERY_S after the last whole read ended, or WHOLE_SHARE
# times as long as that read took if longer (at 10,000 nodes here: 30 s a whole read).
FULL_EVERY_S = 30.0
WHOLE_SHARE = 10
# A query whose whole answer has this many samples is read in slices in between, each
# slice once in about SLICE_CYCLE_S (under a typical scrape interval). Smaller ones, and
# every query of a small fleet, are read whole each refresh.
SLICE_MIN_SAMPLES = 5_000
SLICE_CYCLE_S = 20.0
FIRST_LOOK_S = 1.0  # the first read shows what has come by then; the rest as it lands
# The first read asks these after the rest has shown the nodes: the GPU readings, the
# latency histograms and the engines' gauges are 95-97 % of a whole read's samples and of
# Prometheus' time (docs/evidence/bench-prom-queries.txt). Asked at once, they held back
# every answer naming a node (1.7-4 s at 10,000 nodes, with half a core left to
# Prometheus); the gauges, asked with the counters, took the core the console needs to
# show what the counters name. A fleet whose other answers name no node asks them at once.
FIRST_HELD = frozenset({"gpu", "gpu_id", "hist", "gauges"})
GPU_FAMILIES = frozenset({"gpu", "gpu_id", "agent_gpu"})
# How much the console does before it may answer a key: 1,000 samples read are 3-8 ms
# here, 50 nodes made into snapshots 5-10 ms (2,500 and 100 held a key press 20-80 ms on
# the loaded bench, with Prometheus on the other core and a half).
READ_SLICE = 1_000
APPLY_SLICE = 50


class PromSource(Collector):
    """The fleet from Prometheus; `states`, `history` and `roles` as the Collector's."""

    refreshes = True  # calls on_refreshed once a refresh is in the node states
    health: SourceHealth  # how the last refresh went

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
        self.reader = FleetReader(fleet, self.section, self.engines)
        self._readings: dict[str, NodeReadings] = {}  # what each snapshot was made from
        self._current: dict[str, NodeReadings] = {}  # the fleet as of the last refresh
        self._whole_end: float | None = None  # monotonic, when the last whole read ended
        self._whole_took = 0.0  # how long it took
        # Per query (by index), the label matchers of its slices, from the last whole read.
        self._slices: dict[int, list[str | None]] = {}
        self._turn = 0  # the refreshes in slices since then: which slice is next
        self._slice_of: dict[str, int] = {}  # each node's slice, from the last whole read
        self._count = 0  # slices in a turn
        self.slice_min_samples = SLICE_MIN_SAMPLES
        self.first_look_s = FIRST_LOOK_S
        self.client = PromClient(fleet, self.section, self.timeout_s)
        # What one refresh's answers may take together; a test may lower it.
        self.refresh_bytes = self.section.max_refresh_bytes
        self._budget = Budget(self.refresh_bytes)  # the refresh under way's

    async def __aenter__(self) -> PromSource:
        await super().__aenter__()
        await self.client.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await super().__aexit__(*exc)
        await self.client.__aexit__(*exc)

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
        """Run the queries, then turn the answers into node states. Never raises (but
        when cancelled): a Prometheus that is down, slow or erring is said in `health`
        and on every node, and so is a fault of the console's own in reading what it
        answered, so that the next refresh still runs and nothing reads as fine."""
        try:
            await self._refresh()
        except Exception as exc:
            why = f"{exc.__class__.__name__}: {exc}".rstrip(": ")
            self._all_failed(f"the console failed to read the answers: {why}"[:300])
        finally:
            self.health.refreshes += 1

    async def _refresh(self) -> None:
        started, at = time.monotonic(), time.time()
        self._budget = Budget(self.refresh_bytes)
        if self.client.auth_error is not None:
            self._all_failed(self.client.auth_error)
            return
        slices = {} if self._whole_due(started) else self._slices
        full = not slices  # every query reads the whole fleet
        first = full and self._whole_end is None
        tasks: list[asyncio.Future[Answered] | None] = [None] * len(self.queries)

        def ask(held: bool) -> list[asyncio.Future[Answered]]:
            """Ask the queries the first read holds back (`held`), or the others."""
            asked: list[asyncio.Future[Answered]] = []
            for i, q in enumerate(self.queries):
                if tasks[i] is None and (first and q.family in FIRST_HELD) == held:
                    task = tasks[i] = asyncio.ensure_future(
                        self._instant(self._expr(i, q, slices), at)
                    )
                    asked.append(task)
            return asked

        ask(held=False)
        try:
            await self._read_all(tasks, started, full, partial(ask, True))
        finally:
            for task in tasks:
                if task is not None:
                    task.cancel()  # those still asking, when the refresh itself is cancelled

    async def _read_all(
        self,
        tasks: list[asyncio.Future[Answered] | None],
        started: float,
        full: bool,
        ask_held: Callable[[], list[asyncio.Future[Answered]]],
    ) -> None:
        """`tasks`: each query's answer to come, None for those the first read holds
        back until `ask_held` asks them."""
        health = self.health
        learnt: dict[int, _Slicer] = {}
        nodes: dict[str, NodeReadings] = {}
        read: dict[int, list[Sample]] = {}  # answers read in the first look, by query
        shown = False
        if full and self._whole_end is None:
            # The first read shows the nodes and what has come after FIRST_LOOK_S, then
            # the rest as it lands: at 10,000 nodes the GPU readings alone take 15-30 s.
            deadline = started + self.first_look_s
            pending = {task for task in tasks if task is not None}
            held = True
            while True:
                if held and not pending and not nodes:  # all in, none named a node
                    pending, held = set(ask_held()), False
                if not pending or (nodes and time.monotonic() >= deadline):
                    break
                # Nothing to show yet: wait for an answer; else no later than the deadline.
                wait = max(0.0, deadline - time.monotonic()) if nodes else None
                done, pending = await asyncio.wait(
                    pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    health.answered += 1
                    if task.exception() is None:
                        i = tasks.index(task)
                        read[i] = task.result()[0]
                        with collection_paused():  # the first look's readings live on
                            await self._read(i, read[i], nodes, None)
            if nodes and (pending or held):  # shown now; the rest as it lands
                self._current, shown = nodes, True
                with collection_paused():  # and so do its snapshots and view parts
                    await self._apply(gpus_read=False)
                nodes = {}
            pending |= set(ask_held())
            for i, result in read.items():  # what slices the answers read so far
                await self._learn(i, result, learnt)
            while shown and pending:  # what is shown is the newest there is until the rest lands
                _, pending = await asyncio.wait(pending, timeout=self.refresh_s)
                if pending:
                    self._still_reading()
        answers = await asyncio.gather(*(t for t in tasks if t is not None), return_exceptions=True)
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
            query, failure = errors[0]
            named = isinstance(failure, OverBudget)  # which query the budget refused
            self._all_failed(f"{query.name} query {failure}" if named else str(failure))
            return
        health.failed = len(errors)
        health.error = None
        if errors:
            (query, failure), rest = errors[0], [q.name for q, _ in errors[1:]]
            also = f"; also failed: {', '.join(rest)}" if rest else ""
            health.error = f"{query.name} query: {failure}{also}"
        prom_s = 0.0
        samples = 0
        for i, answer in enumerate(answers):
            if isinstance(answer, BaseException):
                continue
            result, took = answer
            prom_s += took
            samples += len(result)
            if i not in read:  # a query still read whole learns how to slice
                whole = full or i not in self._slices
                await self._read(i, result, nodes, learnt if whole else None)
        health.ok, health.prometheus_s, health.samples = True, prom_s, samples
        health.full = full
        health.last_ok = time.monotonic()
        if full and not shown:
            self._current = nodes
        else:  # a slice, or the rest of the first read: on top of what is shown
            for name, readings in nodes.items():
                self._current[name] = merged(self._current.get(name), readings)
        if full:
            # Node n (by name) is in slice n % count, in every query.
            count = min(len(self._current), max(2, round(SLICE_CYCLE_S / self.refresh_s)))
            self._slice_of = {name: n % count for n, name in enumerate(sorted(self._current))}
            self._count, self._slices = count, {}
            self._turn = 0
        else:
            self._turn += 1
        # A query that failed or was small at the whole read is read whole each refresh
        # until it is large, then sliced as the others. Before, one whose recorded series
        # were not there yet was read whole, 40,000 samples, every refresh for 4-5 minutes.
        for i, slicer in learnt.items():
            matchers = slicer.matchers(self._slice_of, self._count) if self._count >= 2 else None
            if matchers is not None:
                self._slices[i] = matchers
        await self._apply()
        health.nodes = len(self._current)
        if full:
            self._whole_end = time.monotonic()
            self._whole_took = self._whole_end - started

    async def _read(
        self,
        index: int,
        result: list[Sample],
        nodes: dict[str, NodeReadings],
        learnt: dict[int, _Slicer] | None,
    ) -> None:
        """One answer into `nodes`; with `learnt` (a whole read), what slices it."""
        query = self.queries[index]
        slicer = self._slicer(index, result, learnt)
        where: Where = {}
        # In slices, letting the console answer keys in between: 900,000 samples at
        # 10,000 nodes are a second or two of reading.
        for first in range(0, len(result), READ_SLICE):
            chunk = result[first : first + READ_SLICE]
            self.reader.read(query, chunk, nodes, where)
            if slicer is not None:
                slicer.feed(chunk)
            await asyncio.sleep(0)

    async def _learn(self, index: int, result: list[Sample], learnt: dict[int, _Slicer]) -> None:
        """What slices a query, from its whole answer, apart from reading it: the first
        read learns it after the first look is shown (it was 15 % of reading the answer
        that named 10,000 nodes, and is needed only once the whole read is in)."""
        slicer = self._slicer(index, result, learnt)
        if slicer is not None:
            for first in range(0, len(result), READ_SLICE):
                slicer.feed(result[first : first + READ_SLICE])
                await asyncio.sleep(0)

    def _slicer(
        self, index: int, result: list[Sample], learnt: dict[int, _Slicer] | None
    ) -> _Slicer | None:
        query = self.queries[index]
        if learnt is None or not query.template or len(result) < self.slice_min_samples:
            return None
        learnt[index] = _Slicer(
            [*self.reader.node_labels, "instance"], partial(self.reader.node_of, query)
        )
        return learnt[index]

    def _expr(self, index: int, query: Query, slices: dict[int, list[str | None]]) -> str | None:
        """What `query` asks this refresh: the whole fleet, this turn's slice of it, or
        nothing (None) when it has no series in this turn's slice."""
        if index not in slices:
            return query.expr
        turn = slices[index]
        matcher = turn[self._turn % len(turn)]
        return None if matcher is None else query.sliced(matcher)

    def _whole_due(self, now: float) -> bool:
        if self._whole_end is None:
            return True
        return now - self._whole_end >= max(FULL_EVERY_S, WHOLE_SHARE * self._whole_took)

    async def _instant(self, expr: str | None, at: float) -> Answered:
        if expr is None:  # nothing to ask
            return [], 0.0
        return await self.client.instant(expr, at, self._budget)

    async def range_query(
        self, expr: str, start: float, end: float, step: float, budget: Budget | None = None
    ) -> list[Sample]:
        """GET /api/v1/query_range within the deadline, the size cap and `budget` (a
        history read's, shared by its queries; by default its own)."""
        budget = budget or Budget(self.section.max_refresh_bytes)
        return await self.client.range(expr, start, end, step, budget)

    def history_source(self) -> PromSource:
        return self  # Model detail's past: model_history, from range queries

    async def model_history(self, model: str) -> list[HistoryLine]:
        """The last `history_s` of one model's TTFT and ITL p95 (or mean) per deployment,
        from range queries, so Model detail shows what happened before the console
        started. Raises PromError when Prometheus gives no answer."""
        end = time.time()
        start = end - self.section.history_s
        step = max(15.0, self.section.history_s / HISTORY_POINTS)
        asked = history_queries(self.section, self.engines, model)
        budget = Budget(self.section.max_refresh_bytes)  # the history's answers together
        answers = await asyncio.gather(
            *(self.range_query(expr, start, end, step, budget) for _, _, expr in asked)
        )
        out = []
        for (kind, figure, _), result in zip(asked, answers, strict=True):
            ps = self.engines[kind]
            scale = ps.histogram_scale if figure in ps.histograms else ps.mean_scale
            for sample in result:
                node, eid = self.reader.engine_where(sample.metric, kind)
                low, high, _ = SECONDS
                points = [
                    (t, v * scale)
                    for t, text in sample.values or ()
                    if (v := number(text)) is not None and low <= v * scale <= high
                ]
                out.append(HistoryLine(node, eid, figure, points))
        return out

    def _still_reading(self) -> None:
        """The first read is under way: the nodes it has shown are as fresh as can be."""
        now = time.monotonic()
        for name in self._current:
            state = self.states.get(name)
            if state is not None and state.snapshot is not None:
                state.last_ok = now
                if self.on_update is not None:
                    self.on_update(state)

    def _all_failed(self, why: str) -> None:
        self.health.ok, self.health.error = False, why
        message = f"Prometheus: {why}"
        for state in self.states.values():
            state.failures += 1
            state.error = message
            if self.on_update is not None:
                self.on_update(state)

    # -- answers into readings -----------------------------------------------------------

    async def _apply(self, gpus_read: bool = True) -> None:
        """The current readings into node states; a node whose readings are the same
        object or equal keeps its snapshot, so the view redoes nothing for it.
        `gpus_read`: False for the first read's first look, before the GPU queries."""
        nodes = self._current
        now, wall = time.monotonic(), time.time()
        # A node is stale when its figures are older than two refreshes; a refresh is as
        # long as Prometheus takes (the status reads this, as an agent's slower cycle),
        # and a whole read, every few minutes at 10,000 nodes, can take 30 s on its own.
        cycle = max(self.refresh_s, self.health.wall_s or 0.0, self._whole_took)
        if self.section.discover:
            names = Notes("node names")  # a label value that cannot name a node is not read
            for name in sorted(nodes.keys() - self.states.keys()):
                why = name_problem(name)
                if why is None:
                    self.states[name] = NodeState(name, "prometheus")
                else:
                    names.add(shown(name), f"{why} (not read)")
            self.reader.note("", names)
        for n, (name, state) in enumerate(list(self.states.items())):
            if n % APPLY_SLICE == APPLY_SLICE - 1:
                await asyncio.sleep(0)
            reading = nodes.get(name)
            if reading is None:
                self.reader.note(name, None)
                state.failures += 1
                labels = ", ".join(self.reader.node_labels)
                state.error = f"no series in Prometheus names this node (labels {labels}, instance)"
            else:
                old = self._readings.get(name)
                if state.snapshot is None or (old is not reading and old != reading):
                    state.snapshot = self.reader.snapshot(name, reading, wall, gpus_read)
                    if gpus_read:  # a first look has no GPU or latency figure to keep
                        self.history.record(name, state.snapshot)
                self._readings[name] = reading
                state.snapshot.cycle["interval_s"] = cycle
                state.last_ok, state.failures, state.error = now, 0, None
                state.polls += 1
            if self.on_update is not None:
                self.on_update(state)
        refused = self.reader.refused.values()
        self.health.refused = sum(count for count, _ in refused)
        self.health.refused_first = next((first for _, first in refused), None)
        if self.on_refreshed is not None:
            self.on_refreshed()


class _Slicer:
    """Learns, from a whole answer, the label that splits a query into slices: one on
    every sample (a slice must not miss any), with the most values, and which node each
    value belongs to, so that every query's slice k holds the same nodes."""

    def __init__(self, labels: list[str], node_of: Callable[[dict[str, str]], str | None]):
        self.values: dict[str, dict[str, str]] = {label: {} for label in labels}
        self.node_of = node_of

    def feed(self, samples: list[Sample]) -> None:
        labels = list(self.values)
        for sample in samples:
            node = self.node_of(sample.metric) or "?"
            for label in labels:
                value = sample.metric.get(label)
                if value is None:
                    self.values.pop(label, None)
                else:
                    self.values[label].setdefault(value, node)
            if len(self.values) < len(labels):
                labels = [label for label in labels if label in self.values]

    def matchers(self, slice_of: dict[str, int], count: int) -> list[str | None] | None:
        """A label matcher per slice (None: nothing of this query there), the nodes'
        slices as `slice_of` says; None when no label splits the answer."""
        label, values = max(self.values.items(), key=lambda kv: len(kv[1]), default=("", {}))
        if len(values) < 2:
            return None
        groups: list[list[str]] = [[] for _ in range(count)]
        for value, node in values.items():
            groups[slice_of.get(node, 0)].append(value)
        return [matcher(label, sorted(group)) if group else None for group in groups]


def fleet_source(
    fleet: Fleet,
    *,
    refresh_s: float | None = None,
    timeout_s: float | None = None,
    on_update: Callable[[NodeState], None] | None = None,
) -> FleetSource:
    """What the console reads the fleet through: Prometheus when fleet.toml has a
    [prometheus] section, else the agents (and SSH) directly."""
    if fleet.prometheus is not None:
        return PromSource(fleet, refresh_s=refresh_s, timeout_s=timeout_s, on_update=on_update)
    return Collector(fleet, refresh_s=refresh_s, timeout_s=timeout_s, on_update=on_update)
