"""One scraped series must not blind the console that reads Prometheus (issue 27, defect 2).

A real Prometheus on loopback scrapes two hostile exporters (tests/hostile_exporter.py:
real HTTP servers in this process serving crafted Prometheus text) every second: odd GPU
labels (`²`, empty, huge, unicode digits, an escape sequence, a leading zero), node
names with control, bidi and zero-width characters or 300 and 65,536 characters long,
NaN, ±Inf, 1e308, negative gauges, a counter that runs negative and backwards, a
counter that goes back to 0 and up again, and one GPU's reading claimed by both
exporters with different values. Next to them, good nodes.

Before the fix, the GPU label `²` (`isdigit()` but not `int()`) and 1e308 MiB (past any
int) raised in every refresh: the refresh loop died, every node went down with no
reason, the header said Prometheus was fine, and `engineroom check` printed a traceback.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator

import pytest

from console.collect.prometheus.source import PromSource
from console.core.config.load import parse_fleet
from console.core.snapshot import Gpu
from tests.conftest import run_cli
from tests.hostile_exporter import Exporter, series
from tests.prometheus_proc import PrometheusProc, start_prometheus, stop_prometheus

pytestmark = pytest.mark.engines

BAD_NAMES = (
    "evil\x1b]0;pwned\x07",  # an OSC sequence that retitles the terminal
    "rtl\u202egnp",  # a bidi override
    "zero\u200bwidth",
    "x" * 300,
    "y" * 65536,  # Prometheus takes a label value this long
)


def dcgm(host: str, gpu: str, name: str, value: str) -> str:
    return series(f"DCGM_FI_DEV_{name}", {"Hostname": host, "gpu": gpu}, value)


def good_gpus(host: str, temp: int = 50) -> str:
    return "".join(
        dcgm(host, str(i), name, value)
        for i in range(2)
        for name, value in (
            ("GPU_UTIL", "40"),
            ("FB_USED", "1000"),
            ("FB_FREE", "9000"),
            ("GPU_TEMP", str(temp + i)),
            ("POWER_USAGE", "100"),
        )
    )


def hostile_page(scrape: int) -> str:
    text = good_gpus("good-1") + good_gpus("good-2", 60)
    # Odd GPU labels; the node's GPU 0 is good and stays.
    text += dcgm("odd-gpus", "0", "GPU_TEMP", "55")
    for label in ("²", "", "١", "99999999999999999999", "1\x1b[2J", "01"):
        text += dcgm("odd-gpus", label, "GPU_TEMP", "56")
    # Bad values, one per GPU, next to a good temperature on each.
    bad = (
        ("FB_USED", "1e308"),
        ("GPU_TEMP", "NaN"),
        ("POWER_USAGE", "+Inf"),
        ("GPU_UTIL", "-Inf"),
        ("FB_FREE", "-5"),
        ("XID_ERRORS", "1.5"),
        ("CLOCKS_EVENT_REASONS", "1e30"),
    )
    for i, (name, value) in enumerate(bad):
        if name != "GPU_TEMP":
            text += dcgm("bad-values", str(i), "GPU_TEMP", "60")
        text += dcgm("bad-values", str(i), name, value)
        text += dcgm("bad-values", str(i), "FB_USED" if name == "FB_FREE" else "FB_FREE", "10")
    # Node names that cannot be one, and one with unicode digits, which can.
    for host in (*BAD_NAMES, "١٢٣"):
        text += dcgm(host, "0", "GPU_TEMP", "50")
    # Two exporters claim dup/gpu0: equal memory readings, different temperatures.
    text += dcgm("dup", "0", "GPU_TEMP", "50") + dcgm("dup", "0", "FB_USED", "1000")
    # The agent's own series, for a node Prometheus reads only through them.
    agent = {"node": "agent-node", "gpu": "0"}
    text += series("engineroom_gpu_temperature_celsius", agent, "45")
    text += series("engineroom_gpu_memory_used_bytes", agent, "1e308")
    text += series("engineroom_gpu_utilization_percent", {**agent, "gpu": "²"}, "5")
    engine = {"node": "agent-node", "engine": "vllm-8000", "kind": "vllm"}
    text += series("engineroom_engine_state", {**engine, "version": "0.1", "state": "ready"}, "1")
    model = {**engine, "model": "m"}
    text += series("engineroom_model_kv_cache_usage_ratio", model, "7")
    text += series("engineroom_model_requests_running", model, "NaN")
    text += series("engineroom_model_ttft_seconds", {**model, "stat": "p95"}, "0.25")
    # vLLM's own series (the node from Hostname, the engine from the port).
    vllm = {"Hostname": "vnode", "model_name": "m"}
    text += series("vllm:num_requests_running", vllm, "1e308")
    text += series("vllm:num_requests_waiting", vllm, "-3")
    # A counter below 0 that runs further down: rate() of it is negative.
    done = {**vllm, "finished_reason": "stop"}
    text += series("vllm:request_success_total", done, str(-5 * scrape))
    # A counter that goes back to 0 every other scrape (a reset, to Prometheus).
    back = {"Hostname": "vnode", "model_name": "back", "finished_reason": "stop"}
    text += series("vllm:num_requests_running", {"Hostname": "vnode", "model_name": "back"}, "2")
    text += series("vllm:request_success_total", back, str(1e6 * (scrape % 2)))
    return text


def twin_page(scrape: int) -> str:
    return dcgm("dup", "0", "GPU_TEMP", "70") + dcgm("dup", "0", "FB_USED", "1000")


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusProc]:
    work = tmp_path_factory.mktemp("hostile")
    with Exporter(hostile_page) as hostile, Exporter(twin_page) as twin:
        prom = start_prometheus(work / "prometheus", [hostile.job("hostile"), twin.job("twin")])
        try:
            prom.wait_targets_up(2, timeout=60)
            # A rate needs two scrapes of the counter; and both exporters' GPU are in.
            prom.wait_query('rate(vllm:request_success_total{model_name="m"}[60s]) < 0')
            prom.wait_query('DCGM_FI_DEV_GPU_TEMP{Hostname="dup"}', accept=lambda r: len(r) == 2)
            yield prom
        finally:
            stop_prometheus(prom)


def fleet_text(url: str) -> str:
    return f'[fleet]\nname = "h"\nrefresh_s = 0.5\n[prometheus]\nurl = "{url}"\n'


async def until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(0.05)


def gpus(source: PromSource, node: str) -> dict[int, Gpu]:
    snapshot = source.states[node].snapshot
    assert snapshot is not None, (node, source.states[node].error)
    return {g.index: g for g in snapshot.gpus}


def test_hostile_series_cost_their_own_figures_and_the_console_keeps_refreshing(prom):
    async def go() -> None:
        async with PromSource(parse_fleet(fleet_text(prom.url)), refresh_s=0.5) as source:
            source.start()
            good = source.states

            def refreshed(times: int) -> bool:
                state = good.get("good-1")
                return state is not None and state.polls >= times

            await until(lambda: refreshed(3), 30, "three refreshes that read good-1")
            health = source.health
            assert health.ok is True and health.refreshes >= 3, health.line()
            assert not source._tasks[-1].done()  # the refresh loop lives on

            # The good nodes keep their values.
            for node, temp in (("good-1", 50.0), ("good-2", 60.0)):
                assert source.states[node].error is None
                got = gpus(source, node)
                assert [g.temperature_c for g in got.values()] == [temp, temp + 1]
                assert all(g.memory_used_bytes == 1000 * 2**20 for g in got.values())
                assert all(g.utilization_pct == 40 for g in got.values())
            # An odd GPU label costs that GPU; the node's good GPU stays.
            assert list(gpus(source, "odd-gpus")) == [0]
            assert gpus(source, "odd-gpus")[0].temperature_c == 55
            # A bad value costs that value; the GPU's other readings stay.
            bad = gpus(source, "bad-values")
            assert sorted(bad) == list(range(7))
            assert all(g.temperature_c == 60 for i, g in bad.items() if i != 1)
            assert bad[0].memory_used_bytes is None and bad[0].memory_total_bytes is None
            assert bad[1].temperature_c is None
            assert bad[2].power_w is None
            assert bad[3].utilization_pct is None
            assert bad[4].memory_total_bytes is None and bad[4].memory_used_bytes == 10 * 2**20
            assert bad[5].xid_events == []
            assert bad[6].clock_event_reasons is None
            # A name that cannot be a node's is not read; unicode digits are a name.
            assert not set(BAD_NAMES) & set(source.states)
            assert gpus(source, "١٢٣")[0].temperature_c == 50
            # Two exporters disagree on dup/gpu0's temperature: unknown; they agree on memory.
            assert gpus(source, "dup")[0].temperature_c is None
            assert gpus(source, "dup")[0].memory_used_bytes == 1000 * 2**20
            # Through the agent's series.
            assert list(gpus(source, "agent-node")) == [0]
            agent_gpu = gpus(source, "agent-node")[0]
            assert agent_gpu.temperature_c == 45 and agent_gpu.memory_used_bytes is None
            snap = source.states["agent-node"].snapshot
            assert snap is not None
            (model,) = snap.engines[0].models
            assert model.kv_cache_usage is None and model.requests_running is None
            assert model.latency.ttft_s.p95 == 0.25
            # vLLM's own series: 1e308 running, -3 waiting, a negative rate: unknown.
            snap = source.states["vnode"].snapshot
            assert snap is not None
            models = {m.name: m for e in snap.engines for m in e.models}
            m = models["m"]
            assert (m.requests_running, m.requests_waiting, m.request_rate) == (None, None, None)
            assert models["back"].requests_running == 2
            back_rate = models["back"].request_rate
            assert back_rate is None or back_rate >= 0

            # Each refused sample is counted, and the first named, in the health line.
            refused = source.reader.refused
            assert {"", "odd-gpus", "bad-values", "dup", "agent-node", "vnode"} <= set(refused)
            assert refused["odd-gpus"][0] == 6 and refused["bad-values"][0] == 7
            assert refused[""][0] == len(BAD_NAMES)
            assert health.refused == sum(count for count, _ in refused.values())
            line = health.line()
            assert f"{health.refused} samples refused, shown unknown (" in line
            assert "\x1b" not in line and "\u202e" not in line and "\u200b" not in line
            # The same bad series are not counted again at each refresh.
            counted = health.refused
            polls = source.states["good-1"].polls
            await until(lambda: refreshed(polls + 2), 30, "two more refreshes")
            assert health.refused == counted

    asyncio.run(go())


def test_a_fault_in_one_refresh_is_said_and_the_next_refresh_runs(prom):
    """Whatever goes wrong in reading the answers (here a fault injected into the
    reader, for one refresh) shows Prometheus failing, with the error, on the header and
    every node, and the refresh loop goes on."""

    async def go() -> None:
        async with PromSource(parse_fleet(fleet_text(prom.url)), refresh_s=0.5) as source:
            real = source.reader.read
            source.start()
            await until(lambda: source.health.ok is True, 30, "a first refresh")

            def broken(*args: object, **kwargs: object) -> None:
                raise RuntimeError("injected by the test")

            source.reader.read = broken  # type: ignore[method-assign]
            await until(lambda: source.health.ok is False, 30, "the fault said")
            said = "the console failed to read the answers: RuntimeError: injected by the test"
            assert source.health.line() == f"prometheus {prom.url}: {said}"
            assert source.states["good-1"].error == f"Prometheus: {said}"
            before = source.health.refreshes
            source.reader.read = real  # type: ignore[method-assign]
            await until(lambda: source.health.ok is True, 30, "a refresh after the fault")
            assert source.health.refreshes > before
            assert source.states["good-1"].error is None

    asyncio.run(go())


def test_check_says_the_refused_samples_in_one_line_and_exits_as_usual(prom, tmp_path):
    path = tmp_path / "fleet.toml"
    path.write_text(fleet_text(prom.url))
    text = run_cli("check", "--fleet", str(path), timeout=60)
    assert "Traceback" not in text.stderr, text.stderr
    assert text.returncode in (0, 1), text.stderr  # degraded at worst: good nodes are up
    (line,) = [x for x in text.stdout.splitlines() if x.startswith(f"prometheus {prom.url}: ")]
    assert " samples refused, shown unknown (" in line
    answer = run_cli("check", "--json", "--fleet", str(path), timeout=60)
    assert answer.returncode == text.returncode and "Traceback" not in answer.stderr
    got = json.loads(answer.stdout)["prometheus"]
    assert got["ok"] is True and got["failed"] == 0
    assert got["refused"] >= 20 and got["refused_first"]


async def test_the_header_says_the_refused_samples_and_the_good_nodes_stay_up(prom):
    from rich.text import Text

    from console.tui.app import EngineroomApp
    from console.tui.widgets.header import FleetHeader
    from tests.tui_support import until as until_drawn

    app = EngineroomApp(parse_fleet(fleet_text(prom.url)))
    async with app.run_test(size=(200, 40)) as pilot:

        def header() -> str:
            content = app.screen.query_one(FleetHeader).content
            return content.plain if isinstance(content, Text) else str(content)

        await until_drawn(
            pilot, lambda: " samples refused, shown unknown (" in header(), timeout=30,
            what="the refused samples in the header",
        )  # fmt: skip
        assert "\x1b" not in header()
        assert app.view is not None
        up = {n.name for n in app.view.nodes if n.status == "up"}
        assert {"good-1", "good-2", "bad-values", "odd-gpus"} <= up
