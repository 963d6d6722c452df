"""A large fleet is read from Prometheus in slices (issue 16's 10,000 nodes).

A real Prometheus on loopback scrapes three dcgm-exporter TEST DOUBLEs (dcgm-exporter
needs a GPU and DCGM), one per host, every second. The console is told to slice even
this small fleet, and must then read one host a refresh, selected by a label matcher,
and still see every host's new readings within one turn of the slices.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from console.collect import collection_paused
from console.collect.prometheus.promql import SLICE, Sample, fleet_queries, matcher
from console.collect.prometheus.read import FleetReader
from console.collect.prometheus.source import PromSource, _Slicer
from console.core.config.load import parse_fleet
from console.core.plugin import plugin_kinds
from tests.engines.servers import free_port, stop, wait_until
from tests.prometheus_proc import PrometheusProc, promtool, start_prometheus, stop_prometheus

pytestmark = pytest.mark.engines

# Sorted, one a slice. A matcher that forgot to escape "." would take gpuX1 with gpu.1.
HOSTS = ("gpu-2", "gpu.1", "gpuX1")
GPUS_PER_HOST = 2


def prometheus_only(url: str, **extra: str) -> str:
    settings = "".join(f"{k} = {v}\n" for k, v in extra.items())
    return f'[fleet]\nname = "p"\n[prometheus]\nurl = "{url}"\n{settings}'


def listening(port: int, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise RuntimeError(f"a dcgm-exporter double exited with {process.returncode}")
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def write_gpus(path: Path, temp: int) -> None:
    """The double's readings, replaced whole (it reads the file at each scrape)."""
    gpus = [{"util": 50, "fb_used": 1000, "fb_free": 9000, "temp": temp + i, "power": 100}
            for i in range(GPUS_PER_HOST)]  # fmt: skip
    path.with_suffix(".tmp").write_text(json.dumps(gpus))
    os.replace(path.with_suffix(".tmp"), path)


@pytest.fixture(scope="module")
def three_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusProc, dict]]:
    work = tmp_path_factory.mktemp("slices")
    files = {host: work / f"{host}.json" for host in HOSTS}
    doubles: list[subprocess.Popen[bytes]] = []
    prom = None
    try:
        jobs = []
        for host, path in files.items():
            write_gpus(path, 40)
            port = free_port()
            log = work / f"{host}.log"
            argv = [sys.executable, "-m", "tests.dcgm_exporter_double", "--port", str(port),
                    "--hostname", host, "--gpus", str(path)]  # fmt: skip
            with log.open("wb") as out:
                double = subprocess.Popen(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=Path(__file__).parents[1],
                    start_new_session=True,
                )
            doubles.append(double)
            wait_until(partial(listening, port, double), 30, what=f"the double of {host}")
            jobs.append({"job_name": host, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]})
        prom = start_prometheus(work / "prometheus", jobs)
        prom.wait_targets_up(len(HOSTS), timeout=60)
        yield prom, files
    finally:
        if prom is not None:
            stop_prometheus(prom)
        for process in doubles:
            stop(process, grace=5)


def temps(source: PromSource) -> dict[str, list[float | None]]:
    return {
        name: [g.temperature_c for g in state.snapshot.gpus]
        for name, state in source.states.items()
        if state.snapshot is not None
    }


def test_a_large_fleet_is_read_one_slice_a_refresh_and_every_slice_in_turn(three_hosts):
    prom, files = three_hosts
    fleet = parse_fleet(prometheus_only(prom.url))

    async def go() -> None:
        async with PromSource(fleet, refresh_s=2.0) as source:
            source.slice_min_samples = 1  # slice this small fleet as a large one
            await source.refresh()
            health = source.health
            assert health.ok and health.full and not health.failed, health.line()
            whole = health.samples
            assert temps(source) == {h: [40.0, 41.0] for h in HOSTS}

            for _ in range(len(HOSTS)):  # one host a refresh; the others are kept
                await source.refresh()
                assert source.health.full is False, source.health.line()
                assert source.health.line().endswith("(a slice of the fleet)")
                assert source.health.samples * len(HOSTS) == whole
                assert temps(source) == {h: [40.0, 41.0] for h in HOSTS}

            for path in files.values():
                write_gpus(path, 70)
            prom.wait_query(
                "DCGM_FI_DEV_GPU_TEMP >= 70",
                accept=lambda r: len(r) == len(HOSTS) * GPUS_PER_HOST,
            )
            for turn in range(1, len(HOSTS) + 1):
                await source.refresh()
                assert source.health.full is False
                now = temps(source)
                fresh = [h for h in HOSTS if now[h] == [70.0, 71.0]]
                assert len(fresh) == turn, now  # exactly one more host each refresh
                assert all(now[h] == [40.0, 41.0] for h in HOSTS if h not in fresh), now

    asyncio.run(go())


def test_a_small_fleet_is_read_whole_every_refresh(three_hosts):
    prom, _ = three_hosts
    fleet = parse_fleet(prometheus_only(prom.url))

    async def go() -> None:
        async with PromSource(fleet, refresh_s=2.0) as source:
            for _ in range(3):
                await source.refresh()
                assert source.health.full is True, source.health.line()
                assert sorted(source.states) == sorted(HOSTS)

    asyncio.run(go())


def test_a_query_that_failed_at_the_whole_read_is_sliced_once_it_answers(three_hosts):
    """Until the next whole read (4-5 minutes at 10,000 nodes), a query that failed or
    was empty then is read whole every refresh: it must learn its slices from the first
    whole answer it gives, not go on costing the whole fleet each refresh."""
    from console.collect.prometheus.source import PromError

    prom, _ = three_hosts
    fleet = parse_fleet(prometheus_only(prom.url))

    async def go() -> None:
        async with PromSource(fleet, refresh_s=2.0) as source:
            source.slice_min_samples = 1
            readings = next(q for q in source.queries if q.family == "gpu")
            asked: list[str | None] = []
            real = source._instant
            fail = [True]

            async def ask(expr: str | None, at: float):
                if expr is not None and expr.startswith(readings.expr[:40]):
                    asked.append(expr)
                    if fail[0]:
                        raise PromError("HTTP 503: unavailable: overloaded (from the test)")
                return await real(expr, at)

            source._instant = ask  # type: ignore[method-assign]
            await source.refresh()
            assert source.health.full and source.health.failed == 1
            fail[0] = False
            await source.refresh()  # sliced: the readings still whole, and learnt
            assert source.health.full is False
            assert asked[-1] == readings.expr
            read = temps(source)  # every host's readings, from the whole answer
            assert sorted(read) == sorted(HOSTS) and all(None not in t for t in read.values())
            await source.refresh()
            assert asked[-1] != readings.expr and "Hostname=~" in asked[-1], asked[-1]

    asyncio.run(go())


@pytest.mark.parametrize("recorded", [False, True])
def test_every_sliced_query_is_promql_that_promtool_accepts(recorded, tmp_path):
    """Each query the console slices, with a matcher in every selector, as promtool
    parses it; the whole query is the same text without it."""
    fleet = parse_fleet(prometheus_only("http://127.0.0.1:1", recorded=str(recorded).lower()))
    assert fleet.prometheus is not None
    engines = {k: c.prometheus for k, c in plugin_kinds().items() if c.prometheus}
    queries = fleet_queries(fleet.prometheus, engines)
    sliced = [q for q in queries if q.template is not None]
    assert len(sliced) == len(queries) - 1  # all but `up == 0`
    values = ["10.0.0.1:8000", 'a"b\\c', "x|y"]
    rules = []
    for n, q in enumerate(sliced):
        assert SLICE not in q.expr
        text = q.sliced(matcher("instance", values))
        assert text.count('instance=~"') == q.template.count(SLICE) >= 1
        rules.append({"record": f"t:{n}", "expr": text})
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "t", "rules": rules}]}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_slice_k_of_every_query_holds_the_same_nodes():
    """The GPU series name a node by `Hostname`, vLLM's by `instance` (two a node): each
    query's slice k selects the same nodes, so a refresh rebuilds a k-th of the fleet's
    snapshots, not a k-th for each query."""
    fleet = parse_fleet(prometheus_only("http://127.0.0.1:1"))
    assert fleet.prometheus is not None
    engines = {k: c.prometheus for k, c in plugin_kinds().items() if c.prometheus}
    reader = FleetReader(fleet, fleet.prometheus, engines)
    queries = fleet_queries(fleet.prometheus, engines)
    gpu = next(q for q in queries if q.family == "gpu")
    ttft = next(q for q in queries if q.family == "hist" and q.figure == "ttft")
    nodes = [f"gpu-{i}.dc1" for i in range(7)]
    gpu_samples = [
        Sample({"__name__": "DCGM_FI_DEV_GPU_TEMP", "Hostname": n, "gpu": str(g),
                "instance": f"10.0.0.{i}:9400"}, (0.0, "40"))
        for i, n in enumerate(nodes) for g in range(2)
    ]  # fmt: skip
    vllm_samples = [
        Sample({"node": n, "instance": f"10.0.1.{6 - i}:{8000 + d}", "model_name": "m",
                "er_figure": "p95"}, (0.0, "0.1"))
        for i, n in enumerate(nodes) for d in range(2)
    ]  # fmt: skip
    slice_of = {n: k % 3 for k, n in enumerate(sorted(nodes))}
    picked = []
    for query, samples in ((gpu, gpu_samples), (ttft, vllm_samples)):
        slicer = _Slicer(["node", "Hostname", "instance"], partial(reader.node_of, query))
        slicer.feed(samples)
        matchers = slicer.matchers(slice_of, 3)
        assert matchers is not None and None not in matchers
        chosen = []
        for m in matchers:
            label, _, quoted = m.partition("=~")
            pattern = json.loads(quoted)
            chosen.append({reader.node_of(query, s.metric) for s in samples
                           if re.fullmatch(pattern, s.metric[label])})  # fmt: skip
        assert set().union(*chosen) == set(nodes)
        picked.append(chosen)
    assert picked[0] == picked[1]
    assert picked[0] == [{n for n in nodes if slice_of[n] == k} for k in range(3)]


def test_the_first_read_shows_what_came_then_the_rest_with_nothing_lost(three_hosts):
    """The GPU readings are held back (at 10,000 nodes they take 15-30 s here): the
    nodes show at once with their GPUs known and the readings unknown, not 0; then the
    readings land on top and the result is what a whole read gives."""
    prom, files = three_hosts
    for path in files.values():
        write_gpus(path, 40)
    prom.wait_query(
        "DCGM_FI_DEV_GPU_TEMP < 70", accept=lambda r: len(r) == len(HOSTS) * GPUS_PER_HOST
    )
    fleet = parse_fleet(prometheus_only(prom.url))

    async def go() -> None:
        async with PromSource(fleet, refresh_s=2.0) as source:
            readings = next(q for q in source.queries if q.family == "gpu")
            gate = asyncio.Event()
            asked = source._instant

            async def held(expr: str | None, at: float):  # the real query, answered later
                if expr == readings.expr:
                    await gate.wait()
                return await asked(expr, at)

            source._instant = held  # type: ignore[method-assign]
            # Whether the garbage collector may run as each node is made: not in the first
            # look (its objects live on and are frozen), again after it.
            collecting: list[tuple[bool, bool]] = []  # (GPU readings in, collector on)
            source.on_update = lambda state: collecting.append(
                (source.health.ok is not None, gc.isenabled())
            )
            assert source.first_look_s == 1.0  # the default: shown 1 s in, the rest held
            frozen = gc.get_freeze_count()
            first = asyncio.create_task(source.refresh())
            await asyncio.wait_for(_until(lambda: len(temps(source)) == len(HOSTS)), 30)
            assert source.health.ok is None  # still reading
            assert collecting and {on for _, on in collecting} == {False}
            assert gc.isenabled()
            assert gc.get_freeze_count() > frozen
            assert "first read under way" in source.health.line()
            for state in source.states.values():
                assert state.snapshot is not None
                assert [g.uuid is not None for g in state.snapshot.gpus] == [True, True]
                assert [g.temperature_c for g in state.snapshot.gpus] == [None, None]
                # A first look keeps no history: it has no GPU or latency figure yet.
                assert source.history.gpu(state.name, 0) is None
            # While the rest is read, what is shown stays up, not stale (at 10,000 nodes
            # the rest took 20-30 s, ten refreshes).
            stamped = {name: state.last_ok or 0.0 for name, state in source.states.items()}
            await asyncio.wait_for(
                _until(
                    lambda: all((s.last_ok or 0) > stamped[s.name] for s in source.states.values())
                ),
                30,
            )
            assert {s.status(source.refresh_s) for s in source.states.values()} == {"up"}
            gate.set()
            await asyncio.wait_for(first, 30)
            assert source.health.ok and source.health.full
            assert temps(source) == {h: [40.0, 41.0] for h in HOSTS}
            assert collecting[-1] == (True, True)  # the whole read's nodes: collector on
            for state in source.states.values():  # and what came first is still there
                assert state.snapshot is not None
                assert all(g.uuid is not None for g in state.snapshot.gpus)
                temp = (source.history.gpu(state.name, 0) or {}).get("temp")
                assert temp is not None and temp.values()[-1:] == [40.0]

    asyncio.run(go())


async def _until(ready) -> None:
    while not ready():
        await asyncio.sleep(0.01)


def test_the_console_draws_a_refresh_as_it_lands_not_at_its_next_tick(three_hosts):
    """The console's timer ticks once a refresh; a read that lands just after a tick
    waited up to a whole refresh to be drawn (at 10,000 nodes, the first screen). Here
    the refresh is 60 s: only a draw on landing shows the hosts within the wait."""
    from console.tui.app import EngineroomApp

    prom, _ = three_hosts
    fleet = parse_fleet(f'[fleet]\nname = "p"\nrefresh_s = 60\n[prometheus]\nurl = "{prom.url}"\n')

    async def go() -> None:
        app = EngineroomApp(fleet)
        async with app.run_test(size=(120, 40)):
            assert isinstance(app.collector, PromSource)
            await asyncio.wait_for(
                _until(lambda: app.view is not None and app.view.summary.nodes_up == len(HOSTS)),
                30,
            )
            assert app.screen.query_one("#nodes").row_count == len(HOSTS)

    asyncio.run(go())


def test_collection_paused_turns_the_collector_back_on_and_freezes_what_lived_even_on_error():
    frozen = gc.get_freeze_count()
    made: list[list[int]] = []
    try:
        with pytest.raises(RuntimeError), collection_paused():
            assert not gc.isenabled()
            made.extend([i] for i in range(1000))
            raise RuntimeError("a read that failed")
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen + 1000
    finally:
        gc.unfreeze()
