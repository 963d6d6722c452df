"""The console's diagnoses (issue 30): the count in the header, `:diag`, one diagnosis
whole, and the failover made from it, verified once the operator confirmed it.

The fleet is the recorded real agent of tests/test_tui_drills.py (on cpu-1, tiny-trt's
TensorRT-LLM engine is stale after the node's driver and TensorRT-LLM changed, and
tiny-vllm is ready); the failover goes to a real gateway on loopback. The finding itself
is tested on real engines in tests/test_diagnoses.py.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from textual.widgets import Input, Select
from textual.widgets.data_table import ColumnKey

from console.collect import diagnoses
from console.collect.deployments import DeploymentRow
from console.collect.recording import Recording
from console.collect.recording_writer import RecordingWriter
from console.collect.replay import ReplayCollector, fleet_of
from console.collect.view import build
from console.core.config import parse_fleet
from console.core.snapshot import Latency, ModelStats, Percentiles, decode_snapshot
from console.core.units import duration_from_seconds
from console.tui.app import EngineroomApp
from console.tui.diagnosing import BUDGET, FIRST_LOOK_WAIT_S, ConsoleDiagnoses
from console.tui.replay import ReplayApp
from console.tui.screens.diagnoses import DiagnosesScreen, DiagnosisScreen
from console.tui.screens.failover import FailoverScreen
from console.tui.screens.models import ModelsScreen
from console.tui.web import WebViewApp
from console.tui.widgets.confirm import ConfirmScreen
from console.tui.widgets.header import FleetHeader
from console.tui.widgets.safe_static import SafeStatic
from console.tui.widgets.table import FleetTable
from console.tui.widgets.top_diagnosis import STYLE, TopDiagnosis
from tests.engines.servers import free_port, stop
from tests.test_hardening_clients import ADMIN, start_gateway
from tests.test_tui_drills import DRILL_FLEET, DRILLS
from tests.test_tui_operator_actions import PLAYBOOK_FLEET
from tests.tui_support import H200, keys, recorded_app, until

SIZE = (120, 36)
STALE = ("stale_trt_engine", "tiny/tiny-trt")


def recorded(fleet_text: str = DRILL_FLEET, h200: dict | None = None, app=EngineroomApp):
    fleet = parse_fleet(fleet_text)
    snapshots = {
        "h200": decode_snapshot(json.dumps(h200)) if h200 is not None else None,
        "cpu-1": decode_snapshot(DRILLS.read_text()),
        "gone": None,
    }
    return app(fleet, collector=ReplayCollector(fleet, snapshots))


def header(app: EngineroomApp) -> str:
    return str(app.screen.query_one(FleetHeader).render())


def diag_count(app: EngineroomApp) -> tuple[str, str] | None:
    """The header's diagnoses count and its style: ("diag 2", "bold white on red")."""
    plain, spans, _ = app.screen.query_one(FleetHeader)._shown
    for span in spans:
        piece = plain[span.start : span.end].strip()
        if piece.startswith("diag "):
            return piece, str(span.style)
    return None


def rows(app: EngineroomApp) -> dict[str, list[str]]:
    table = app.screen.query_one(FleetTable)
    return {key: [str(getattr(c, "plain", c)) for c in row.made()] for key, row in
            table.rows_by_key.items()}  # fmt: skip


async def open_diagnosis(app: EngineroomApp, pilot, key: str = ":diag\r") -> DiagnosisScreen:
    await pilot.press(*keys(key))
    await until(pilot, lambda: "stale_trt_engine/tiny/tiny-trt" in rows(app), what="the row")
    await pilot.press("enter")
    return await until(
        pilot,
        lambda: (
            app.screen if isinstance(app.screen, DiagnosisScreen) and app.screen.diagnosis else None
        ),
        what="the diagnosis screen",
    )


def shown(screen: DiagnosisScreen) -> str:
    return str(screen.query_one("#diagnosis", SafeStatic).render())


async def test_the_header_counts_the_diagnoses_and_diag_lists_them() -> None:
    app = recorded()
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.diagnoses.looked, what="the first look")
        assert [x.key for x in app.diagnoses.found] == [STALE]
        # A warning: yellow, as the header's other warnings.
        counted = await until(pilot, lambda: diag_count(app), what="the count in the header")
        assert counted == ("diag 1", "bold black on yellow")

        await pilot.press(*keys(":diag\r"))
        await until(pilot, lambda: isinstance(app.screen, DiagnosesScreen), what=":diag")
        listed = await until(pilot, lambda: rows(app), what="the table")
        assert list(listed) == ["stale_trt_engine/tiny/tiny-trt"]
        sev, title, subject, move, state = listed["stale_trt_engine/tiny/tiny-trt"]
        assert (sev, title, subject, move) == ("WARN", "stale TensorRT-LLM engine", "tiny/tiny-trt",
                                               "standby")  # fmt: skip
        assert state.startswith("active ")
        assert "Diagnoses" in header(app)


async def test_a_critical_diagnosis_is_counted_apart_and_none_shows_no_count() -> None:
    # The recorded H200 node with its GPU 1 reporting uncorrected ECC errors (the one field
    # changed from what the agent printed): a GPU fault, critical.
    faulty = json.loads(H200.read_text())
    faulty["gpus"][1]["ecc_uncorrected"] = 2
    app = recorded(h200=faulty)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.diagnoses.looked, what="the first look")
        names = [x.kind.name for x in app.diagnoses.found]
        assert names == ["gpu_fault", "stale_trt_engine"]  # the critical one first
        counted = await until(pilot, lambda: diag_count(app), what="the count in the header")
        assert counted == ("diag 2", "bold white on red")  # one is critical: it stands out

    quiet = recorded_app()  # the recorded H200 and vLLM + Triton on CPU: nothing wrong
    async with quiet.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: quiet.diagnoses.looked, what="the first look")
        await until(pilot, lambda: "nodes" in header(quiet), what="the header")
        assert quiet.diagnoses.found == [] and diag_count(quiet) is None


def marked(app: EngineroomApp) -> dict[str, str]:
    """The rows whose whole first cell is in a diagnosis's colour: {key: style}."""
    table = app.screen.query_one(FleetTable)
    out = {}
    for key in table.rows_by_key:
        first = table.get_row(key)[0]
        for span in getattr(first, "spans", []):
            whole = span.start <= 1 and span.end == len(first.plain)  # after the margin
            if whole and str(span.style) in STYLE.values():
                out[key] = str(span.style)
    return out


async def test_fleet_and_models_say_the_top_diagnosis_and_mark_its_subject() -> None:
    faulty = json.loads(H200.read_text())
    faulty["gpus"][1]["ecc_uncorrected"] = 2
    app = recorded(h200=faulty)
    async with app.run_test(size=SIZE) as pilot:
        strip = app.screen.query_one(TopDiagnosis)
        said = await until(pilot, lambda: str(strip.render()).strip(), what="the top line")
        # The critical one, its subject, its first move, and the key to the others.
        assert said.startswith("CRIT  GPU fault"), said
        assert "h200/gpu1" in said and "first move: " in said, said
        assert said.endswith("! all 2"), said
        assert await until(pilot, lambda: marked(app), what="a marked row") == {
            "h200": STYLE["critical"]
        }
        await pilot.press("m")  # a GPU names no model: Models says it, marks no row
        await until(pilot, lambda: isinstance(app.screen, ModelsScreen), what="Models")
        await until(pilot, lambda: app.screen.query_one(FleetTable).rows_by_key)
        assert str(app.screen.query_one(TopDiagnosis).render()).strip() == said
        assert marked(app) == {}

    app = recorded()  # the stale engine alone: Models marks its deployment
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.diagnoses.looked, what="the first look")
        assert await until(pilot, lambda: marked(app), what="a marked row") == {
            "cpu-1": STYLE["warning"]
        }
        await pilot.press("m")
        await until(pilot, lambda: isinstance(app.screen, ModelsScreen), what="Models")
        assert await until(pilot, lambda: marked(app), what="a marked row") == {
            "d:tiny:tiny-trt": STYLE["warning"]
        }

    quiet = recorded_app()  # nothing wrong: no line, no mark
    async with quiet.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: quiet.diagnoses.looked, what="the first look")
        await until(pilot, lambda: quiet.screen.query_one(FleetTable).rows_by_key)
        assert not quiet.screen.query_one(TopDiagnosis).display
        assert marked(quiet) == {}


async def test_enter_shows_the_evidence_what_rules_it_out_and_the_moves_in_order() -> None:
    app = recorded()
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_diagnosis(app, pilot)
        text = await until(pilot, lambda: "EVIDENCE" in shown(screen) and shown(screen))
        assert "WARN  stale TensorRT-LLM engine: tiny/tiny-trt" in text
        lines = text.splitlines()
        evidence = [line for line in lines if line.startswith("  build")]
        assert len(evidence) == 2, text
        # Each figure, where it was measured and how old it is.
        where = r"\s+at agent on cpu-1, \d+s old"
        assert re.fullmatch(r"  build  driver 580.159.04 → 575.57.08" + where, evidence[0])
        assert re.fullmatch(r"  build  TensorRT-LLM 1.2.0 → 1.2.1" + where, evidence[1])
        assert "a build key that matches the node again (a drill's promoted build)" in text
        moves = [line.strip() for line in lines if line[:5].strip()[:2] in ("1.", "2.", "3.")]
        assert moves == [
            "1. start a standby deployment",
            "2. fail the model over to a healthy deployment",
            "3. run the rebuild drill",
        ]
        assert ":start tiny (the Start vLLM form)" in text
        # No gateway in this fleet: the failover is shown as the command that makes it.
        needs = "needs the gateway: [gateway] in fleet.toml, its token set"
        assert f"{needs} (engineroom failover tiny --plan)" in text


async def test_a_read_only_view_shows_the_diagnosis_and_refuses_the_failover() -> None:
    app = recorded(app=WebViewApp)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_diagnosis(app, pilot)
        await until(pilot, lambda: "EVIDENCE" in shown(screen), what="the evidence")
        hint = "read-only here: engineroom failover tiny --plan, from a console that may act"
        assert hint in shown(screen)
        await pilot.press("f")
        await until(pilot, lambda: app.refused, what="a refusal")
        assert app.refused == ["failing over"]
        assert app.screen is screen and app.diagnoses.get(STALE).state == "active"


async def test_a_failover_from_a_diagnosis_verifies_it_once_confirmed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw_port = free_port()
    text = PLAYBOOK_FLEET.format(
        gw_port=gw_port, gw_state=tmp_path / "gw-state", other=free_port(), trt=free_port(),
        vllm=free_port(),
    )  # fmt: skip
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    gateway = start_gateway(path, gw_port)
    monkeypatch.setenv("T_ADMIN", ADMIN)
    fleet = parse_fleet(text)
    snapshots = {"h200": None, "cpu-1": decode_snapshot(DRILLS.read_text())}
    app = EngineroomApp(fleet, collector=ReplayCollector(fleet, snapshots))
    try:
        async with app.run_test(size=(160, 40)) as pilot:
            await until(pilot, lambda: app.gateway_role == "admin", what="the gateway's role")
            screen = await open_diagnosis(app, pilot, "!")  # the header's count's key
            hint = "f: the failover plan for tiny, draining tiny-trt"
            await until(pilot, lambda: hint in shown(screen), what="the failover's key")

            async def plan() -> FailoverScreen:
                await pilot.press("f")
                found = await until(
                    pilot,
                    lambda: app.screen if isinstance(app.screen, FailoverScreen) else None,
                    what="the failover plan",
                )
                await until(pilot, lambda: found.is_mounted and found.query("#onto"))
                await pilot.pause()
                return found

            # Opened and closed without confirming: nothing was done, nothing verified.
            first = await plan()
            assert (first.source, first.target) == ("tiny-trt", "tiny-vllm")
            await pilot.press("escape")
            await until(pilot, lambda: app.screen is screen, what="back on the diagnosis")
            await pilot.pause()
            assert app.diagnoses.get(STALE).state == "active"

            # Confirmed: the gateway runs the job; back here the diagnosis is verifying.
            second = await plan()
            assert second.query_one("#onto", Select).value == "tiny-vllm"
            # Filled in by the diagnosis: its mode (a warning's: planned), the model's name
            # typed, and the move named with why. Enter confirms.
            assert second.query_one("#mode", Select).value == "planned"
            assert second.query_one("#confirm", Input).value == "tiny"
            said = str(second.query_one("#confirm-what", SafeStatic).render())
            assert "Enter to confirm (diagnosis stale_trt_engine on tiny/tiny-trt" in said
            second.query_one("#mode", Select).value = "emergency"  # tiny-vllm does not answer
            await pilot.press("enter")
            job = await until(pilot, lambda: second.job, what="the failover job")
            assert job["params"]["why"] == (
                "from the console: diagnosis stale_trt_engine on tiny/tiny-trt"
            )  # the gateway audits the job with its params
            await pilot.press("escape")
            await until(pilot, lambda: app.screen is screen, what="back on the diagnosis")
            moved = await until(
                pilot,
                lambda: "verifying failover" in shown(screen) and app.diagnoses.get(STALE),
                what="the diagnosis verifying the failover",
            )
            assert moved.state == "verifying"
            await pilot.press("escape")
            listed = await until(pilot, lambda: rows(app), what="the Diagnoses table")
            assert listed["stale_trt_engine/tiny/tiny-trt"][4].startswith("verifying failover")
    finally:
        stop(gateway.process, grace=5)


async def test_r_restarts_a_wedged_engine_once_confirmed_and_a_refused_one_is_no_move() -> None:
    """The recorded vLLM on cpu-1 with a request in and no token for 30 s: wedged, whose
    second move is its restart. `r` asks first, naming the engine and its node; `n`
    leaves everything as it was. Confirmed, the job goes to cpu-1's agent, which does
    not answer here: no job, so no move to verify, and the diagnosis stays active."""
    wedged = json.loads(DRILLS.read_text())
    engine = next(e for e in wedged["engines"] if e["id"] == "vllm-33469")
    engine["models"][0].update(requests_running=1.0, generation_stalled_s=30.0)
    fleet = parse_fleet(DRILL_FLEET)
    snapshots = {"h200": None, "cpu-1": decode_snapshot(json.dumps(wedged)), "gone": None}
    app = EngineroomApp(fleet, collector=ReplayCollector(fleet, snapshots))
    key = ("engine_wedged", "cpu-1/vllm-33469")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.diagnoses.get(key), what="the wedged engine")
        await pilot.press("exclamation_mark")
        await until(pilot, lambda: "engine_wedged/cpu-1/vllm-33469" in rows(app), what="row")
        await pilot.press("enter")  # critical: the first row
        screen = await until(
            pilot,
            lambda: app.screen if isinstance(app.screen, DiagnosisScreen) else None,
            what="the diagnosis",
        )
        hint = "r: restart vllm-33469 on cpu-1 (asks first; its agent's job)"
        await until(pilot, lambda: hint in shown(screen), what="the restart's key")
        for answer in ("n", "y"):
            await pilot.press("r")
            asked = await until(
                pilot,
                lambda: app.screen if isinstance(app.screen, ConfirmScreen) else None,
                what="the confirmation",
            )
            assert asked.title_text == "Restart vllm-33469 on cpu-1?"
            await pilot.press(answer)
            await until(pilot, lambda: app.screen is screen, what="back on the diagnosis")
        await until(
            pilot,
            lambda: not [w for w in app.workers if w.group == "act"],
            what="the call to the agent ended",
        )
        assert app.diagnoses.get(key).state == "active"  # type: ignore[union-attr]


async def test_every_column_shows_at_80_and_the_names_get_the_room_at_200() -> None:
    app = recorded()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(*keys(":diag\r"))
        await until(pilot, lambda: isinstance(app.screen, DiagnosesScreen) and rows(app))
        screen = app.screen
        assert isinstance(screen, DiagnosesScreen)
        assert screen.fitted.fit.every  # nothing hidden at 80 columns
        narrow = dict(screen.fitted.spec)["SUBJECT"]
        await pilot.resize_terminal(200, 50)

        def subject_width() -> int | None:
            table = screen.query_one(FleetTable)
            column = table.columns.get(ColumnKey("SUBJECT")) if table.is_mounted else None
            return column.width if column is not None else None

        wide = await until(
            pilot,
            lambda: (w := subject_width()) and w > (narrow or 0) and w,
            what="a wider SUBJECT column at 200 columns",
        )
        assert wide == dict(screen.fitted.spec)["SUBJECT"] and screen.fitted.fit.every


# -- what a look costs, and when the first one is taken ----------------------------------


class Clock:
    """The console's cost clock, moved by the test: a look takes `cost` seconds."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def recorded_view(fleet_text: str = DRILL_FLEET):
    fleet = parse_fleet(fleet_text)
    collector = ReplayCollector(fleet, {"h200": None, "cpu-1": decode_snapshot(DRILLS.read_text()),
                                        "gone": None})  # fmt: skip
    return fleet, build(fleet, collector.states, collector.refresh_s), collector.states


def test_a_look_that_costs_much_is_taken_within_its_share_of_the_console() -> None:
    fleet, view, states = recorded_view()
    found = ConsoleDiagnoses(fleet, offline=False)
    clock = found.clock = Clock()
    looks = []
    inner = found.diagnoser.update

    def costly(*args, **kwargs):  # a look at a large fleet: 0.3 s
        looks.append(clock.t)
        clock.t += 0.3
        return inner(*args, **kwargs)

    found.diagnoser.update = costly  # type: ignore[method-assign]
    for _ in range(100):  # a view every 0.5 s for 50 s
        found.update(view, states, None, None)
        clock.t += 0.5
    # Each look may take BUDGET of the time: one 0.3 s look every 15 s at most.
    assert len(looks) == 4 and all(b - a >= 0.3 / BUDGET for a, b in itertools.pairwise(looks))
    assert found.skipped == 96 and [x.key for x in found.found] == [STALE]


def test_the_first_look_waits_for_every_node_and_the_gateway_but_not_for_ever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("T_ADMIN", ADMIN)
    text = PLAYBOOK_FLEET.format(gw_port=free_port(), gw_state="/nonexistent", other=1, trt=2,
                                 vllm=3)  # fmt: skip
    fleet, view, states = recorded_view(text)
    found = ConsoleDiagnoses(fleet, offline=False)
    assert found.gateway_expected
    clock = found.clock = Clock()
    waiting = replace(view, summary=replace(view.summary, nodes_waiting=1))
    found.update(waiting, states, None, "gateway: connection refused")
    assert not found.looked and found.counts() is None  # a node not read yet
    found.update(view, states, None, None)
    assert not found.looked  # the gateway not asked yet
    found.update(view, states, None, "gateway: connection refused")
    assert found.looked and found.counts() == (1, 0)  # asked: it did not answer

    late = ConsoleDiagnoses(fleet, offline=False)
    late.clock = clock
    late.update(waiting, states, None, None)
    clock.t += FIRST_LOOK_WAIT_S - 0.1
    late.update(waiting, states, None, None)
    assert not late.looked
    clock.t += 0.2  # a node nobody lists, a gateway that never answers: not waited for
    late.update(waiting, states, None, None)
    assert late.looked and late.counts() == (1, 0)


def test_a_models_thousands_of_deployments_are_compared_in_one_pass() -> None:
    """Replica imbalance compares each deployment with its siblings' median: at 1,000
    nodes, a list of the others for each of 1,800 deployments made every look 0.3 s. The
    median is right here; the time is bench.console_scale's (its diagnoses' CPU)."""
    stats = [ModelStats(name="m", latency=Latency(ttft_s=Percentiles(p95=0.1 + i % 7 / 100,
             source="histogram"))) for i in range(8000)]  # fmt: skip
    stats[123] = ModelStats(name="m", latency=Latency(ttft_s=Percentiles(p95=2.0,
                            source="histogram")))  # fmt: skip
    rows = [DeploymentRow(model="m", id=f"d{i}", node="n", engine="vllm", engine_id=f"e{i}",
                          version=None, state="ready", reason=None, weight=1, stats=s)
            for i, s in enumerate(stats)]  # fmt: skip
    fleet = parse_fleet('[fleet]\nname = "f"\n[[nodes]]\nname = "n"\nagent = "http://127.0.0.1:1"')
    nodes = {"n": diagnoses._Node("n", None, 1.0, set())}  # type: ignore[arg-type]
    found = diagnoses._imbalance(fleet, nodes, "m", rows)
    assert [x.subject for x in found] == ["m/d123"]
    others = [s.latency.ttft_s.p95 for i, s in enumerate(stats) if i != 123]
    median = {e.figure: e.value for e in found[0].evidence}["siblings' TTFT p95 median"]
    assert median == duration_from_seconds(statistics.median(others))  # type: ignore[arg-type]


# -- in a replay -------------------------------------------------------------------------


async def test_a_replay_judges_its_diagnoses_at_the_replayed_time(tmp_path: Path) -> None:
    """60 s of the recorded drills node: its stale engine is diagnosed as of the moment the
    cursor shows, not the wall clock's; a jump back starts the look again there."""
    t0 = 1_796_083_200.0  # 2026-12-01 00:00:00 UTC
    cpu = json.loads(DRILLS.read_text())
    writer = RecordingWriter(tmp_path / "stale.rec", fleet_text=DRILL_FLEET,
                             fleet_source="fleet.toml", keyframe_s=20)  # fmt: skip
    for second in range(61):
        t = t0 + second
        writer.node("cpu-1", {**cpu, "node": {**cpu["node"], "time": t}}, "up", None, t=t)
        for name in ("h200", "gone"):
            writer.node(name, None, "down", "connection refused", t=t)
    writer.close()
    recording = Recording(tmp_path / "stale.rec")
    fleet = fleet_of(recording)
    app = ReplayApp(fleet, ReplayCollector(fleet, recording=recording, at=t0 + 30))
    async with app.run_test(size=SIZE) as pilot:
        stale = await until(pilot, lambda: app.diagnoses.get(STALE), what="the diagnosis")
        assert stale.since == app.replay.at == t0 + 30
        app.jump_to("+0:40")
        await until(pilot, lambda: app.diagnoses.now() == t0 + 40, what="the look at +40 s")
        assert app.diagnoses.get(STALE).since == t0 + 30  # the same one, held 10 s
        await pilot.press(*keys(":diag\r"))
        listed = await until(pilot, lambda: rows(app), what="the Diagnoses table")
        assert listed["stale_trt_engine/tiny/tiny-trt"][4] == "active 10s"
        app.jump_to("+0:05")
        await until(pilot, lambda: app.diagnoses.now() == t0 + 5, what="the look at +5 s")
        assert app.diagnoses.get(STALE).since == t0 + 5  # not first seen in its future
