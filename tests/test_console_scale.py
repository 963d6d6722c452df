"""The console at a thousand nodes (issue 15): starting, streams that fall behind, garbage
collection, and what a refresh redoes; against SIMULATED agents and real listeners."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from aiohttp import web

import console.collect.sources.collector as collector_module
from console.collect.sources.collector import Collector
from console.core import wire
from console.core.config.load import Fleet, load_fleet, parse_fleet
from console.core.snapshot import Host, NodeInfo, Snapshot, decode_snapshot
from console.sim.fleetfile import TOKEN_ENV
from console.tui.app import EngineroomApp
from console.tui.screens.fleet import FleetScreen
from tests.engines.servers import free_port
from tests.sim.conftest import TOKEN, end, start_sim

NODES = 300


async def _longest_stall(stop: asyncio.Event, stalls: list[float]) -> None:
    """How long the event loop went without running us: a key press waits that long."""
    while not stop.is_set():
        before = time.monotonic()
        await asyncio.sleep(0.01)
        stalls.append(time.monotonic() - before - 0.01)


async def test_the_console_learns_every_agents_role_without_a_client_per_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """At start the console asks each agent what its token may do. With a new HTTP client
    per node, each building its own TLS context (28 ms and 0.8 MiB), 1,000 nodes held the
    event loop 28 s before the first screen and grew the console by 800 MiB."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    sim = start_sim(tmp_path, "--scale", str(NODES), "--refresh", "1.0")
    try:
        fleet = load_fleet(sim.fleet)
        me = psutil.Process()
        before = me.memory_info().rss
        stop, stalls = asyncio.Event(), list[float]()
        watch = asyncio.create_task(_longest_stall(stop, stalls))
        app = EngineroomApp(fleet)
        async with app.run_test(size=(120, 40)):
            deadline = time.monotonic() + 60
            while len(app.roles) < NODES or not (
                isinstance(app.screen, FleetScreen) and app.screen.drawn_nodes == NODES
            ):
                assert time.monotonic() < deadline, f"{len(app.roles)} roles learned in 60 s"
                await asyncio.sleep(0.05)
            grown = (me.memory_info().rss - before) / 2**20
            stop.set()
            await watch
        assert set(app.roles.values()) == {"operator"}
        assert grown < 120, f"the console grew by {grown:.0f} MiB for {NODES} nodes"
        # 300 clients held it 8 s or more; drawing 300 rows takes a fraction of that even
        # on a busy machine.
        assert max(stalls) < 4.0, f"the event loop stalled {max(stalls):.1f} s"
    finally:
        assert end(sim) == 0


async def test_an_agent_that_answers_whoami_badly_costs_its_role_only(tmp_path: Path):
    """The role check reads at most 64 KiB within the collector's timeout: an agent that
    sends a megabyte, or never answers, is left without a role and the others get theirs."""

    async def good(request: web.Request) -> web.Response:
        return web.json_response({"name": "alice", "role": "viewer", "jobs": True})

    async def huge(request: web.Request) -> web.Response:
        return web.json_response({"role": "operator", "pad": "x" * 2**20})

    release = asyncio.Event()

    async def silent(request: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({"role": "operator"})

    ports, runners = [], []
    for handler in (good, huge, silent):
        app = web.Application()
        app.router.add_get("/v1/whoami", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        ports.append(free_port())
        await web.TCPSite(runner, "127.0.0.1", ports[-1]).start()
        runners.append(runner)
    nodes = "".join(
        f'[[nodes]]\nname = "{name}"\nagent = "http://127.0.0.1:{port}"\n'
        for name, port in zip(("good", "huge", "silent"), ports, strict=True)
    )
    fleet = parse_fleet(f'[fleet]\nname = "t"\nrefresh_s = 1.0\n{nodes}')
    found: dict[str, str] = {}
    try:
        async with Collector(fleet, timeout_s=1.0) as collector:
            started = time.monotonic()
            await collector.roles(found.__setitem__)
            took = time.monotonic() - started
    finally:
        release.set()
        for runner in runners:
            await runner.cleanup()
    assert found == {"good": "viewer"}
    assert took < 5, f"the role check took {took:.1f} s with a 1 s timeout"


async def _serve(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_get("/v1/snapshot/stream", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


def _one_node(port: int) -> Fleet:
    return parse_fleet(
        f'[fleet]\nname = "t"\nrefresh_s = 1.0\n'
        f'[[nodes]]\nname = "n"\nagent = "http://127.0.0.1:{port}"\n'
    )


def _line(at: float) -> bytes:
    snap = wire.Snapshot(  # what an agent sends
        node=wire.NodeInfo(name="n", agent_version="0", time=at), host=wire.Host(), gpu_status="ok"
    )
    return snap.model_dump_json().encode() + b"\n"


async def test_a_console_that_fell_behind_decodes_only_each_nodes_newest_snapshot():
    """Five snapshots waiting in one node's socket cost one decode, of the newest: a console
    that falls behind catches up instead of working through a backlog of old states."""
    release = asyncio.Event()

    async def burst(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"".join(_line(1000.0 + i) for i in range(5)))
        await release.wait()
        return resp

    runner, port = await _serve(burst)
    try:
        async with Collector(_one_node(port), timeout_s=2.0) as collector:
            collector.start()
            state = collector.states["n"]
            deadline = time.monotonic() + 10
            while state.snapshot is None:
                assert time.monotonic() < deadline, f"no snapshot: {state.error}"
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # nothing more arrives
            assert state.snapshot.node.time == 1004.0
            assert state.polls == 1
    finally:
        release.set()
        await runner.cleanup()


async def test_a_stream_that_goes_quiet_fails_and_is_opened_again():
    """An agent that sends one snapshot and then nothing, its connection open: the node
    fails with "no snapshot within" after the quiet time (the collector's watchdog closes
    the stream), and the collector connects again."""
    release = asyncio.Event()
    opened: list[float] = []

    async def one_then_quiet(request: web.Request) -> web.StreamResponse:
        opened.append(time.monotonic())
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(_line(time.time()))
        await release.wait()
        return resp

    runner, port = await _serve(one_then_quiet)
    try:
        async with Collector(_one_node(port), timeout_s=2.0, refresh_s=0.5) as collector:
            collector.start()
            state = collector.states["n"]
            deadline = time.monotonic() + 20
            while not state.failures:
                assert time.monotonic() < deadline, "a quiet stream was never given up"
                await asyncio.sleep(0.05)
            quiet_for = time.monotonic() - opened[0]
            assert state.error == "no snapshot within 2 s"
            assert quiet_for >= 2.0, f"given up after {quiet_for:.2f} s of a 2 s quiet time"
            while len(opened) < 2:
                assert time.monotonic() < deadline, "the collector did not connect again"
                await asyncio.sleep(0.05)
    finally:
        release.set()
        await runner.cleanup()


async def test_a_snapshot_line_over_the_cap_fails_the_stream_and_is_not_kept(monkeypatch):
    """A stream line that never ends is cut at the cap, said so, and dropped; the collector
    holds at most the cap for it."""
    monkeypatch.setattr(collector_module, "MAX_SNAPSHOT_BYTES", 2**20)
    release = asyncio.Event()

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(8):  # 2 MiB, no newline
            await resp.write(b"x" * 2**18)
        await release.wait()
        return resp

    runner, port = await _serve(endless)
    try:
        async with Collector(_one_node(port), timeout_s=2.0) as collector:
            collector.start()
            state = collector.states["n"]
            deadline = time.monotonic() + 10
            while not state.failures:
                assert time.monotonic() < deadline, "the endless line was never cut"
                await asyncio.sleep(0.05)
            assert state.error == "snapshot larger than 1 MiB"
            assert state.snapshot is None
    finally:
        release.set()
        await runner.cleanup()


def test_decoding_a_thousand_nodes_a_second_rarely_wakes_the_garbage_collector():
    """Snapshots are freed by reference counting; the collector's scans of the ones still
    held cost 14 points of a core at 1,000 nodes with a collection every 50,000 objects."""
    import gc
    import random

    from console.collect import tune_gc
    from console.sim.scale import _Node

    sim = [_Node(i, 8, random.Random(i)) for i in range(50)]
    for node in sim:
        node.rebuild(time.monotonic())
    lines = [node.response.split(b"\r\n\r\n", 1)[1] for node in sim]
    held: dict[int, Snapshot] = {}
    before = gc.get_threshold()
    tune_gc()
    try:
        collections = gc.get_stats()[0]["collections"]
        for i in range(20_000):  # twenty seconds of 1,000 nodes, the newest of each held
            held[i % 1000] = decode_snapshot(lines[i % len(lines)])
        collections = gc.get_stats()[0]["collections"] - collections
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
    assert collections <= 1, f"{collections} collections for 20,000 snapshots"


async def test_a_refresh_that_fires_while_the_console_closes_does_not_crash_it():
    """The refresh timer can fire once more after the screens are gone (the bench saw
    ScreenStackError on a busy machine): that tick builds the view and draws nothing."""
    from tests.tui_support import recorded_app

    app = recorded_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
    assert not app.screen_stack
    app.tick()  # raised ScreenStackError: "No screens on stack"
    assert app.view is not None


def test_a_nodes_part_of_the_view_is_made_as_its_snapshot_arrives_not_at_the_refresh(
    monkeypatch: pytest.MonkeyPatch,
):
    """The refresh tick only puts parts together: deriving 1,000 nodes there at once held
    key presses back 60-100 ms every second. A node whose snapshot did not change since is
    not derived again either."""
    from console.collect.sources.collector import NodeState
    from console.collect.views.view import ViewBuilder
    from console.core.snapshot import Gpu

    snap = Snapshot(
        node=NodeInfo(name="n", agent_version="0", time=time.time()),
        host=Host(),
        gpu_status="ok",
        gpus=[Gpu(index=0, utilization_pct=50.0)],
    )
    states = {"n": NodeState("n", "agent", snapshot=snap, last_ok=time.monotonic())}
    views = ViewBuilder(_one_node(1))
    made: list[str] = []
    derive = ViewBuilder._part

    def counted(self: ViewBuilder, name: str, *args: Any) -> Any:
        made.append(name)
        return derive(self, name, *args)

    monkeypatch.setattr(ViewBuilder, "_part", counted)
    views.node_updated(states["n"], 1.0)
    assert made == ["n"]
    first = views.build(states, 1.0)
    again = views.build(states, 1.0)
    assert made == ["n"], "the refresh derived the node again"
    assert first.gpus[0] is again.gpus[0] and first.summary.util_avg == 50.0
    # The Fleet table's row too: the screen keeps what it made of it (FleetScreen._made).
    assert first.nodes[0] is again.nodes[0]


def test_a_nodes_fleet_row_is_new_when_its_error_or_alerts_change():
    """The kept row must not hide a change: an error, or a GPU that turned hot."""
    from console.collect.sources.collector import NodeState
    from console.collect.views.view import ViewBuilder
    from console.core.snapshot import Gpu

    def snap(temp: float) -> Snapshot:
        return Snapshot(
            node=NodeInfo(name="n", agent_version="0", time=time.time()),
            host=Host(),
            gpu_status="ok",
            gpus=[Gpu(index=0, utilization_pct=50.0, temperature_c=temp)],
        )

    state = NodeState("n", "agent", snapshot=snap(40.0), last_ok=time.monotonic())
    views = ViewBuilder(_one_node(1))
    first = views.build({"n": state}, 1.0).nodes[0]
    assert (first.alerts, first.error) == (0, None)
    state.error = "stream reset"  # up still, with what went wrong last
    second = views.build({"n": state}, 1.0).nodes[0]
    assert second is not first and second.error == "stream reset"
    state.snapshot = snap(99.0)
    third = views.build({"n": state}, 1.0).nodes[0]
    assert third.alerts == 1 and third.temp_max == 99.0


def test_models_rows_work_out_their_filter_fields_only_when_a_filter_asks(
    monkeypatch: pytest.MonkeyPatch,
):
    """Models makes a row for each of 2,000 deployments every refresh at 1,000 nodes: the
    fields the `/` filter reads are worked out only for a filter, and are right then."""
    from console.collect.views.view import DeploymentRow
    from console.core.config.load import Model
    from console.tui.screens import models

    asked: list[object] = []
    measure = models.ttft_gap_s

    def counted(engine: Any, gw: Any) -> float | None:
        asked.append(gw)
        return measure(engine, gw)

    monkeypatch.setattr(models, "ttft_gap_s", counted)
    deployment = DeploymentRow(
        model="m",
        id="d1",
        node="n",
        engine="vllm",
        engine_id="vllm-8000",
        version="0.32.0",
        state="ready",
        reason=None,
        weight=100,
        stats=None,
    )
    rows = [models.deployment_row(deployment, Model(name="m"), 0.9, 0.01) for _ in range(100)]
    assert asked == []
    assert rows[0].fields["deployment"] == "d1" and rows[0].fields["state"] == "ready"
    assert len(asked) == 1


async def test_the_decoder_lets_go_of_the_event_loop_between_slices(monkeypatch):
    """Lines that pile up (a console behind, 1,000 nodes) are decoded a slice at a time: a
    key press waits for one slice, not for the whole pile. And a node whose lines came
    faster than they were decoded costs one decode, of its newest line."""
    decoded: list[bytes] = []

    def slow_parse(line: bytes) -> Snapshot:
        time.sleep(0.002)
        decoded.append(line)
        return decode_snapshot(line)

    monkeypatch.setattr(collector_module, "_parse", slow_parse)
    monkeypatch.setattr(collector_module, "DECODE_SLICE_S", 0.005)
    nodes = "".join(f'[[nodes]]\nname = "n{i}"\nagent = "http://127.0.0.1:9"\n' for i in range(40))
    fleet = parse_fleet(f'[fleet]\nname = "t"\n{nodes}')
    collector = Collector(fleet)
    targets = {t.node.name: t for t in collector._targets}
    decoder = asyncio.create_task(collector._decode_arrivals())
    try:
        collector._arrived["n0"] = (targets["n0"], _line(1.0).strip())
        collector._arrived["n0"] = (targets["n0"], _line(2.0).strip())  # newer, same node
        for i in range(1, 40):
            collector._arrived[f"n{i}"] = (targets[f"n{i}"], _line(float(i)).strip())
        collector._arrival.set()
        await asyncio.sleep(0)  # the decoder's first slice
        await asyncio.sleep(0)
        seen_between = len(decoded)
        deadline = time.monotonic() + 10
        while collector._arrived:
            assert time.monotonic() < deadline, "the pile was never decoded"
            await asyncio.sleep(0.01)
    finally:
        decoder.cancel()
    assert 0 < seen_between < 40, f"{seen_between} of 40 decoded before the loop got back"
    assert len(decoded) == 40  # one decode for n0, of its newest line
    assert collector.states["n0"].snapshot.node.time == 2.0


async def test_a_long_table_shows_its_first_rows_at_once_and_the_rest_after_the_paint():
    """Opening Models at 1,000 nodes added 2,000 rows before the first paint. The first
    screenful goes in at once, the rest in chunks after each paint, in order, and the
    cursor comes back to its row once that row is in."""
    from textual.app import App, ComposeResult

    from console.tui.widgets import table as table_module
    from console.tui.widgets.table import FleetTable, Row

    def rows(n: int, tag: str = "") -> list[Row]:
        return [Row(f"r{i}", (f"row {i}{tag}",)) for i in range(n)]

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield FleetTable([("NAME", 20)])

    app = One()
    async with app.run_test(size=(60, 20)) as pilot:
        t = app.query_one(FleetTable)
        t.show(rows(1000))
        assert t.row_count == table_module.FIRST_ROWS
        for _ in range(50):
            if t.row_count == 1000:
                break
            await pilot.pause()
        assert t.row_count == 1000
        assert [str(t.get_row_at(i)[0]) for i in (0, 500, 999)] == [
            " row 0",
            " row 500",
            " row 999",
        ]
        t.move_cursor(row=700)
        t.show(rows(1000, "!")[::-1])  # a new order: a rebuild, the cursor's row added late
        assert t.row_count == table_module.FIRST_ROWS
        for _ in range(50):
            if t.row_count == 1000:
                break
            await pilot.pause()
        assert t.selected_key() == "r700"


async def test_a_long_tables_rows_are_made_when_first_drawn_or_read():
    """Models at 10,000 nodes has 20,000 deployment rows; opening it made the cells of
    every one as it was added (a second of formatting). Rows past the first screenful
    go in blank, and are made when drawn, read, or wider than their column."""
    from textual.app import App, ComposeResult

    from console.tui.widgets import table as table_module
    from console.tui.widgets.table import FleetTable, Row

    made: list[int] = []

    def row(i: int) -> Row:
        def cells() -> tuple[str, str]:
            made.append(i)
            return (f"row {i}", "x" * (30 if i == 900 else 5))  # row 900: wider ENGINES

        return Row(f"r{i}", cells)

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield FleetTable([("NAME", 12), ("ENGINES", None)])

    app = One()
    async with app.run_test(size=(60, 20)) as pilot:
        t = app.query_one(FleetTable)
        t.show([row(i) for i in range(1000)])
        while t.row_count < 1000:
            await pilot.pause()
        await pilot.pause()
        assert sorted(made) == list(range(table_module.FIRST_ROWS)), "rows made unseen"
        assert [str(c) for c in t.get_row_at(500)] == [" row 500", "xxxxx"]  # read: made
        assert 500 in made and 501 not in made
        t.move_cursor(row=900)  # scrolled to and drawn: made, and its column widened
        await pilot.pause()
        await pilot.pause()
        assert 900 in made and 899 in made
        assert t.ordered_columns[1].content_width >= 30
        assert len(made) < 250


def test_a_patched_view_is_the_view_built_whole(monkeypatch: pytest.MonkeyPatch):
    """The console patches the last view where nodes changed (a tenth of 10,000 a refresh
    from Prometheus); whatever changed, the patched view must be the one a fresh builder
    makes of the same states: lines, deployment rows, GPU cells, alerts and summary. The
    steps change a GPU's heat, an error, a status as time passes, an engine that comes
    and goes, a GPU that goes: the last two no longer fit the last view's places."""
    from console.collect.sources.collector import NodeState
    from console.collect.views.view import ViewBuilder

    fleet = _three_nodes()
    snap = _node_snapshot

    t = 1000.0
    states = {n: NodeState(n, "agent", snapshot=snap(n, [40.0, 50.0]), last_ok=t) for n in "abc"}
    views = ViewBuilder(fleet)
    wholes: list[ViewBuilder] = []  # builds of `views` made whole, not patched
    whole = ViewBuilder._whole

    def counted(self: ViewBuilder, *args: Any) -> Any:
        if self is views:
            wholes.append(self)
        return whole(self, *args)

    monkeypatch.setattr(ViewBuilder, "_whole", counted)

    def step(now: float, patches: bool) -> None:
        wholes.clear()
        view = views.build(states, 1.0, now)
        fresh = ViewBuilder(fleet).build(states, 1.0, now)
        assert len(wholes) == (0 if patches else 1)
        assert view.summary == fresh.summary
        assert view.nodes == fresh.nodes
        assert view.models == fresh.models
        assert view.alerts == fresh.alerts
        assert view.gpus == fresh.gpus
        assert view.gpus_by_node == fresh.gpus_by_node

    step(t, patches=False)
    states["b"].snapshot = snap("b", [40.0, 99.0])  # hot: an alert, a new line
    step(t + 0.5, patches=True)
    states["c"].error = "stream reset"
    step(t + 0.6, patches=True)
    states["b"].snapshot = snap("b", [40.0, 50.0])  # cool again: its alert goes
    step(t + 0.7, patches=True)
    step(t + 2.5, patches=True)  # no snapshot for 2.5 s: every node stale, with its age
    step(t + 3.5, patches=True)
    for n in "abc":
        states[n].last_ok = t + 4.0
    states["a"].snapshot = snap("a", [40.0, 50.0], extra=2)  # an engine came: new places
    step(t + 4.0, patches=False)
    states["b"].snapshot = snap("b", [40.0])  # a GPU went
    step(t + 4.1, patches=False)
    states["c"].failures, states["c"].last_ok = 3, t - 10  # down: its undeclared row goes
    step(t + 4.2, patches=False)
    states["b"].snapshot = snap("b", [40.0, 30.0])  # cooler again, a GPU back
    step(t + 4.3, patches=False)
    states["b"].error = "slow"
    step(t + 4.4, patches=True)


def _three_nodes() -> Fleet:
    """Nodes a, b and c, each with a deployment of m1."""
    return parse_fleet(
        '[fleet]\nname = "t"\nrefresh_s = 1.0\n'
        + "".join(f'[[nodes]]\nname = "{n}"\nagent = "http://127.0.0.1:{p}"\n' for n, p in
                  (("a", 1), ("b", 2), ("c", 3)))
        + '[[models]]\nname = "m1"\n'
        + "".join(f'[[models.deployments]]\nid = "m1-{n}"\nnode = "{n}"\nengine = "vllm"\n'
                  f'endpoint = "http://127.0.0.1:{8000 + i}"\n' for i, n in enumerate("abc"))
    )  # fmt: skip


def _node_snapshot(
    node: str, temps: list[float], extra: int = 1, rate: float = 1.0, errors: float | None = None
) -> Snapshot:
    """m1's engine, `extra` engines no deployment names (by default node b's with errors
    past the SLO), and a GPU at each temperature."""
    from console.core.snapshot import Engine, Gpu, ModelStats

    declared = Engine(id="vllm-8000", kind="vllm", state="ready",
                      deployment_ids=[f"m1-{node}"], models=[ModelStats(name="m1")])  # fmt: skip
    if errors is None:
        errors = 0.5 if node == "b" else 0.0
    undeclared = [
        Engine(
            id=f"vllm-{9100 + i}",
            kind="vllm",
            state="ready",
            models=[ModelStats(name=f"x{i}", request_rate=rate, error_rate=errors)],
        )
        for i in range(extra)
    ]
    return Snapshot(
        node=NodeInfo(name=node, agent_version="0", time=time.time()),
        host=Host(),
        gpu_status="ok",
        gpus=[Gpu(index=i, utilization_pct=10.0 * i, temperature_c=t) for i, t in enumerate(temps)],
        engines=[declared, *undeclared],
    )


async def test_fleet_and_models_patched_rows_are_the_rows_drawn_whole(
    monkeypatch: pytest.MonkeyPatch,
):
    """Fleet and Models patch their last rows where nodes changed since they drew
    (ViewBuilt.changes), Models across the views it did not draw while hidden;
    the rows must be those a whole draw makes of the same view: cells, colours and keys.
    The node states are set by the test (nothing is polled)."""
    from rich.text import Text

    from console.collect.sources.collector import NodeState
    from console.tui.screens.models import ModelsScreen
    from console.tui.widgets.table import FleetTable, Row

    class Held(Collector):
        def start(self) -> None:  # the test sets the states
            pass

    fleet = _three_nodes()
    collector = Held(fleet)
    now = time.monotonic()
    for n in "abc":
        collector.states[n] = NodeState(n, "agent", snapshot=_node_snapshot(n, [40.0]), last_ok=now)
    whole: list[str] = []
    draw_all = ModelsScreen._draw_all

    def counted(self: ModelsScreen, *args: Any) -> None:
        whole.append("models")
        draw_all(self, *args)

    monkeypatch.setattr(ModelsScreen, "_draw_all", counted)

    def seen(rows: list[Row]) -> list[tuple[str, list[tuple[str, str, str]]]]:
        def cell(c: Any) -> tuple[str, str, str]:
            text = c if isinstance(c, Text) else Text(str(c))
            return (text.plain, str(text.style), repr(text.spans))

        return [(r.key, [cell(c) for c in r.made()]) for r in rows]

    def drawn_whole(screen: Any) -> list[tuple[str, list[tuple[str, str, str]]]]:
        patched = seen(screen._drawn.rows if isinstance(screen, ModelsScreen) else screen._drawn[2])
        screen._drawn = None  # the next draw walks it all
        assert app.built is not None
        screen.draw(app.built)
        return patched

    def step(change: Callable[[], None]) -> None:
        change()
        app.tick()

    app = EngineroomApp(fleet, collector=collector)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        fleet_screen = app.screen
        assert isinstance(fleet_screen, FleetScreen)
        await pilot.press("m")
        await pilot.pause()
        models = app.screen
        assert isinstance(models, ModelsScreen)
        whole.clear()
        b = collector.states["b"]
        step(lambda: setattr(b, "snapshot", _node_snapshot("b", [95.0], rate=5.0)))
        step(lambda: setattr(collector.states["c"], "error", "stream reset"))
        assert whole == [], "Models walked every row"
        before = drawn_whole(models)
        assert before == seen(models._drawn.rows)
        assert ("m:x0", "bold red") in [(key, cells[0][1]) for key, cells in before]
        labels = [c.label.plain for c in models.query_one("#models", FleetTable).ordered_columns]
        rate = labels.index("RATE")
        rates = [cells[rate][0] for key, cells in before if key.startswith("d:x0")]
        assert rates == ["1.0/s", "5.0/s", "1.0/s"]
        await pilot.press("n")  # Fleet, while Models misses two views
        await pilot.pause()
        step(lambda: setattr(collector.states["a"], "snapshot", _node_snapshot("a", [50.0])))
        assert fleet_screen._drawn is not None and fleet_screen._drawn[0] == app.view.serial
        patched = drawn_whole(fleet_screen)
        assert patched == seen(fleet_screen._drawn[2])
        assert [k for k, _ in patched] == ["a", "b", "c"]
        step(lambda: setattr(b, "snapshot", _node_snapshot("b", [40.0], errors=0.0)))
        whole.clear()
        await pilot.press("m")
        await pilot.pause()
        assert whole == [] and models._drawn is not None
        assert models._drawn.serial == app.view.serial
        after = drawn_whole(models)
        assert after == seen(models._drawn.rows)
        assert ("m:x0", "bold") in [(key, cells[0][1]) for key, cells in after]  # none breaks
