"""The console's diagnoses (issue 30): the count in the header, `:diag`, one diagnosis
whole, and the moves made from it (fail over, quarantine, restart, start a standby, run
the drill), each verified once its job started, never when its screen merely opened.

The fleet is the recorded real agent of tests/test_tui_drills.py (on cpu-1, tiny-trt's
TensorRT-LLM engine is stale after the node's driver and TensorRT-LLM changed, and
tiny-vllm is ready); the failovers and the quarantine go to a real gateway on loopback,
the standby's start and the drill to a real agent. The finding itself is tested on real
engines in tests/test_diagnoses.py.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from textual.binding import Binding
from textual.widgets import Input, Select
from textual.widgets.data_table import ColumnKey

from console.collect.diagnose import engines as diagnose_engines
from console.collect.diagnose import fleet as diagnose_fleet
from console.collect.recordings.reader import Recording
from console.collect.recordings.replay import ReplayCollector, fleet_of
from console.collect.recordings.writer import RecordingWriter
from console.collect.views.deployments import DeploymentRow
from console.collect.views.view import build
from console.core.config.load import parse_fleet
from console.core.snapshot import Latency, ModelStats, Percentiles, decode_snapshot
from console.core.units import duration_from_seconds
from console.tui.app import EngineroomApp
from console.tui.diagnosing import BUDGET, FIRST_LOOK_WAIT_S, ConsoleDiagnoses
from console.tui.replay import ReplayApp
from console.tui.screens.diagnoses import DiagnosesScreen, DiagnosisScreen
from console.tui.screens.failover import FailoverScreen
from console.tui.screens.jobs import JobScreen, StartVllmScreen
from console.tui.screens.models import ModelsScreen
from console.tui.web.session import WebViewApp
from console.tui.widgets.confirm import ConfirmScreen
from console.tui.widgets.header import FleetHeader
from console.tui.widgets.safe_static import SafeStatic
from console.tui.widgets.table import FleetTable
from console.tui.widgets.top_diagnosis import STYLE, TopDiagnosis
from tests.conftest import OPERATOR
from tests.engines.servers import free_port, stop
from tests.support import fleet as toml
from tests.support.playbook import playbook_console, playbook_fleet
from tests.test_hardening_clients import ADMIN, start_gateway
from tests.test_tui_drills import DRILL_FLEET, DRILLS
from tests.tui_support import H200, ROOT, keys, on_top, recorded_app, until

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
    return await enter_diagnosis(app, pilot)


async def enter_diagnosis(app: EngineroomApp, pilot) -> DiagnosisScreen:
    """Enter on the row the cursor is on: its diagnosis's screen, once it shows one."""
    await pilot.press("enter")
    return await until(
        pilot,
        lambda: (
            app.screen if isinstance(app.screen, DiagnosisScreen) and app.screen.diagnosis else None
        ),
        what="the diagnosis screen",
    )


async def back_verifying(app: EngineroomApp, pilot, screen: DiagnosisScreen, move: str, key):
    """Escape from the move's screen: back on the diagnosis `key`, which reads verifying
    `move`."""
    await pilot.press("escape")
    await until(pilot, lambda: app.screen is screen, what="back on the diagnosis")
    moved = await until(
        pilot,
        lambda: f"verifying {move}" in shown(screen) and app.diagnoses.get(key),
        what=f"the diagnosis verifying the {move}",
    )
    assert moved.state == "verifying"
    return moved


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


SSH_H200 = DRILL_FLEET.replace(
    'name = "h200"\nagent = "http://127.0.0.1:1"',
    'name = "h200"\nssh = "ops@gpu7"\nssh_port = 2222',
)
VIA_SSH = "ssh -t -p 2222 ops@gpu7 "


@pytest.mark.parametrize(
    ("kind", "fleet_text", "prefix"),
    [(EngineroomApp, DRILL_FLEET, ""), (WebViewApp, DRILL_FLEET, ""),
     (EngineroomApp, SSH_H200, VIA_SSH)],
)  # fmt: skip
async def test_e_copies_the_commands_a_gpu_fault_is_escalated_with(kind, fleet_text, prefix):
    """Escalating as hardware runs nothing from the console: `e` puts the commands the
    GPU's vendor asks for on the clipboard and the screen, read-only consoles too; over
    the node's ssh where fleet.toml gives one."""
    assert "ops@gpu7" in SSH_H200  # its agent line was replaced
    faulty = json.loads(H200.read_text())
    faulty["gpus"][1]["ecc_uncorrected"] = 2
    app = recorded(fleet_text, h200=faulty, app=kind)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*keys(":diag\r"))
        await until(pilot, lambda: any(k.startswith("gpu_fault/") for k in rows(app)),
                    what="the GPU fault's row")  # fmt: skip
        screen = await enter_diagnosis(app, pilot)  # the critical one is first
        assert screen.diagnosis is not None and screen.diagnosis.kind.name == "gpu_fault"
        commands = [f"{prefix}nvidia-smi -q", f"{prefix}sudo nvidia-bug-report.sh"]
        hint = f"e: copy the commands to run on h200 ({'; '.join(commands)})"
        await until(pilot, lambda: hint in shown(screen), what="the escalation's line")
        assert app.clipboard == ""
        await pilot.press("e")
        await until(pilot, lambda: app.clipboard, what="the commands copied")
        assert app.clipboard == "\n".join(commands) + "\n"
        assert app.screen is screen and app.diagnoses.get(screen.key).state == "active"


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
    monkeypatch.setenv("T_ADMIN", ADMIN)
    with playbook_console(tmp_path) as (app, _):
        async with app.run_test(size=(160, 40)) as pilot:
            await until(pilot, lambda: app.gateway_role == "admin", what="the gateway's role")
            screen = await open_diagnosis(app, pilot, "!")  # the header's count's key
            hint = "f: the failover plan for tiny, draining tiny-trt"
            await until(pilot, lambda: hint in shown(screen), what="the failover's key")

            async def plan() -> FailoverScreen:
                await pilot.press("f")
                found = await on_top(pilot, app, FailoverScreen, what="the failover plan")
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
            assert job.params["why"] == (
                "from the console: diagnosis stale_trt_engine on tiny/tiny-trt"
            )  # the gateway audits the job with its params
            await back_verifying(app, pilot, screen, "failover", STALE)
            await pilot.press("escape")
            listed = await until(pilot, lambda: rows(app), what="the Diagnoses table")
            assert listed["stale_trt_engine/tiny/tiny-trt"][4].startswith("verifying failover")


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
        screen = await on_top(pilot, app, DiagnosisScreen, what="the diagnosis")
        hint = "r: restart vllm-33469 on cpu-1 (asks first; its agent's job)"
        await until(pilot, lambda: hint in shown(screen), what="the restart's key")
        for answer in ("n", "y"):
            await pilot.press("r")
            asked = await on_top(pilot, app, ConfirmScreen, what="the confirmation")
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
    text = playbook_fleet(free_port(), "/nonexistent", other=1, trt=2, vllm=3)
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
    nodes = {"n": diagnose_engines.Node("n", None, 1.0, set())}  # type: ignore[arg-type]
    found = diagnose_fleet.imbalance(fleet, nodes, "m", rows)
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


# -- the moves made from a diagnosis, against a real agent and a real gateway ---------------

# cpu-1 as the recorded agent saw it (the stale tiny-trt, the ready tiny-vllm), while its
# jobs go to a real agent on loopback and its traffic to a real gateway. Two vLLM launch
# profiles serve tiny; the one declared first is no deployment's: the standby's is chosen
# by the diagnosis, not by the order. The profiles' command is this test's own python,
# which has no vLLM: a start job is taken, then fails in seconds; so is a drill's (no
# TensorRT-LLM here), at its preflight.
BURST = ("error_burst", "tiny/tiny-vllm")


def acting_fleet(tmp_path: Path, vllm_weight: int = 0, **ports: int) -> str:
    model = toml.model_dir(tmp_path)
    port = {name: ports.get(name) or free_port() for name in
            ("gw_port", "agent_port", "other", "vllm", "trt", "serve")}  # fmt: skip
    python = sys.executable
    return toml.fleet_toml(
        fleet={"name": "recorded", "refresh_s": 0.5},
        **toml.agent_and_gateway_tables(tmp_path / "state", port["gw_port"], tmp_path / "gw-state"),
        nodes=[{"name": "cpu-1", "agent": f"http://127.0.0.1:{port['agent_port']}",
                "token_env": "T_OPERATOR"}],
        profiles={
            "tiny-other": toml.vllm_profile("cpu-1", model, port["other"], python, args=None),
            "tiny-standby": toml.vllm_profile("cpu-1", model, port["vllm"], python),
        },
        models=[{"name": "tiny", "deployments": [
            toml.deployment("tiny-trt", "cpu-1", "triton", port["trt"], engine_model="ensemble",
                            weight=100),
            toml.deployment("tiny-vllm", "cpu-1", "vllm", port["vllm"], weight=vllm_weight,
                            profile="tiny-standby"),
        ]}],
        drills={"tiny-bf16": {"model": "tiny", "deployment": "tiny-trt", "checkpoint": model,
                              "engine_cache": tmp_path / "cache", "serve_port": port["serve"]}},
    )  # fmt: skip


def bursting() -> dict:
    """The recorded cpu-1 with half of tiny-vllm's requests failing: an error burst."""
    snap = json.loads(DRILLS.read_text())
    engine = next(e for e in snap["engines"] if e["id"] == "vllm-33469")
    engine["models"][0]["error_rate"] = 0.5
    return snap


def console_on(text: str, snapshot: dict | None = None, app=EngineroomApp) -> EngineroomApp:
    fleet = parse_fleet(text)
    snap = decode_snapshot(json.dumps(snapshot) if snapshot else DRILLS.read_text())
    return app(fleet, collector=ReplayCollector(fleet, {"cpu-1": snap}))


class Acting:
    """The console over the recorded cpu-1 (`console`), its real agent and its real
    gateway started on the fleet's ports; an ENGINE DOUBLE where a deployment must be up
    at the gateway (`double`)."""

    def __init__(self, agent_factory, tmp_path: Path) -> None:
        self.agent_factory, self.tmp = agent_factory, tmp_path
        self.started: list[subprocess.Popen[bytes]] = []

    def console(self, vllm_weight: int = 0, snapshot: dict | None = None, trt: int = 0):
        agent_port, gw_port = free_port(), free_port()
        text = acting_fleet(self.tmp, vllm_weight, agent_port=agent_port, gw_port=gw_port,
                            trt=trt)  # fmt: skip
        agent = self.agent_factory(text, node="cpu-1", port=agent_port)
        self.started.append(start_gateway(agent.fleet, gw_port).process)
        return console_on(text, snapshot)

    def double(self, port: int) -> Path:
        """A Triton-shaped ENGINE DOUBLE (tests/engine_double.py) on `port`; its log."""
        log = self.tmp / "engine-double.log"
        with log.open("wb") as out:
            self.started.append(subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "engine_double.py"), f"triton:{port}"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            ))  # fmt: skip
        return log


@pytest.fixture
def acting(agent_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("T_OPERATOR", OPERATOR.split(":", 1)[1])
    monkeypatch.setenv("T_ADMIN", ADMIN)
    made = Acting(agent_factory, tmp_path)
    yield made
    for process in made.started:
        stop(process, grace=5)


def keyed(screen: DiagnosisScreen) -> dict[str, bool]:
    """The moves' keys the footer shows: {key: enabled}."""
    moves = {b.key for b in DiagnosisScreen.BINDINGS if isinstance(b, Binding)}
    return {key: b.enabled for key, b in screen.active_bindings.items() if key in moves}


async def held(app: EngineroomApp, pilot, key: tuple[str, str]):
    """The diagnosis `key` once a look raised it (a class with a hold that the first look
    raised at once stays raised at the looks after it)."""
    return await until(pilot, lambda: app.diagnoses.get(key), timeout=30, what=f"{key} raised")


async def open_first(app: EngineroomApp, pilot, key: tuple[str, str]) -> DiagnosisScreen:
    """`!`, then Enter on the first row once `key` is listed and the gateway was read."""
    await until(pilot, lambda: app.gateway_role == "admin", what="the gateway's role")
    await held(app, pilot, key)
    await pilot.press("exclamation_mark")
    await until(pilot, lambda: "/".join(key) in rows(app), what="its row")
    return await enter_diagnosis(app, pilot)


def top(app: EngineroomApp, kind: type):
    return app.screen if isinstance(app.screen, kind) else None


async def test_s_opens_the_start_form_on_the_standby_and_the_start_the_agent_took_is_the_move(
    acting,
) -> None:
    app = acting.console()
    async with app.run_test(size=(160, 40)) as pilot:
        screen = await open_first(app, pilot, STALE)
        hint = "s: start standby tiny-vllm on cpu-1 (profile tiny-standby, the Start vLLM form)"
        await until(pilot, lambda: hint in shown(screen), what="the standby's key")
        # The stale engine's moves: standby, failover, drill; each one's key, no other.
        assert keyed(screen) == {"s": True, "f": True, "D": True}

        async def form() -> StartVllmScreen:
            await pilot.press("s")
            return await until(pilot, lambda: top(app, StartVllmScreen), what="the form")

        # Opened and cancelled: nothing was done, nothing verified.
        first = await form()
        assert first.model == "tiny" and first.selected == ("cpu-1", "tiny-standby")
        assert first.choices == [("cpu-1", "tiny-standby"), ("cpu-1", "tiny-other")]
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen, what="back on the diagnosis")
        assert app.diagnoses.get(STALE).state == "active"

        # Started: the agent's preflight, its confirmation, then the job the agent took.
        second = await form()
        plan = await until(pilot, lambda: second.plan, what="the agent's plan")
        assert plan.ok and plan.argv[0] == sys.executable, plan
        await pilot.press("ctrl+s")
        asked = await until(pilot, lambda: top(app, ConfirmScreen), what="the confirmation")
        assert asked.title_text == "Start tiny-standby on cpu-1?"
        assert app.diagnoses.get(STALE).state == "active"  # asked, not started
        await pilot.press("y")
        job = await until(pilot, lambda: top(app, JobScreen), what="the start job")
        assert job.node == "cpu-1"
        took = await until(pilot, lambda: job.job, what="the agent's job")
        assert (took.kind, took.params["profile"]) == ("vllm.start", "tiny-standby")
        assert app.diagnoses.get(STALE).detail.startswith("verifying standby")
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen, what="back on the diagnosis")
        await until(pilot, lambda: "verifying standby" in shown(screen), what="verifying")


def failed_start() -> dict:
    """The recorded cpu-1 with a start of tiny-standby that failed, its port taken."""
    snap = json.loads(DRILLS.read_text())
    at = snap["node"]["time"] - 30
    snap["jobs"].append({
        "id": "5fa11ed57a87", "kind": "vllm.start", "state": "failed", "who": "alice",
        "created": at, "updated": at + 2, "params": {"profile": "tiny-standby"}, "steps": [],
        "error": "vLLM exited with code 1 before it was ready",
        "result": {"engine_id": "vllm-59999",
                   "log_tail": ["OSError: [Errno 98] Address already in use"]},
    })  # fmt: skip
    return snap


async def test_s_on_a_failed_start_opens_the_start_form_on_its_profile_again(acting) -> None:
    """A failed start's first move, the profile started again once its cause is fixed,
    is `s`: the Start vLLM form on the profile the failed job started, not a standby."""
    app = acting.console(snapshot=failed_start())
    failed = ("start_failed", "cpu-1/vllm-59999")
    async with app.run_test(size=(160, 40)) as pilot:
        await held(app, pilot, failed)
        assert app.diagnoses.get(failed).cause == "port in use"
        await pilot.press("exclamation_mark")
        await until(pilot, lambda: "/".join(failed) in rows(app), what="its row")
        await pilot.press(*["down"] * list(rows(app)).index("/".join(failed)))
        screen = await enter_diagnosis(app, pilot)
        hint = "s: start tiny-standby on cpu-1 again (the Start vLLM form)"
        await until(pilot, lambda: hint in shown(screen), what="the start's key")
        assert keyed(screen) == {"s": True}
        await pilot.press("s")
        form = await until(pilot, lambda: top(app, StartVllmScreen), what="the form")
        assert form.selected == ("cpu-1", "tiny-standby")
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen, what="back on the diagnosis")
        assert app.diagnoses.get(failed).state == "active"  # opened, not started: no move


async def test_D_runs_the_deployments_drill_once_confirmed(acting) -> None:
    app = acting.console()
    async with app.run_test(size=(160, 40)) as pilot:
        screen = await open_first(app, pilot, STALE)
        hint = "D: run drill tiny-bf16 on cpu-1 (asks first; its agent's job)"
        await until(pilot, lambda: hint in shown(screen), what="the drill's key")
        for answer in ("n", "y"):
            await pilot.press("D")
            asked = await until(pilot, lambda: top(app, ConfirmScreen), what="the confirmation")
            assert asked.title_text == "Run drill tiny-bf16 on cpu-1?"
            assert "rebuilds deployment tiny-trt (tiny) on node cpu-1" in asked.body
            await pilot.press(answer)
            if answer == "n":  # refused: nothing asked of the agent, nothing to verify
                await until(pilot, lambda: app.screen is screen, what="back on the diagnosis")
                assert app.diagnoses.get(STALE).state == "active"
        job = await until(pilot, lambda: top(app, JobScreen), what="the drill's job")
        took = await until(pilot, lambda: job.job, what="the agent's job")
        assert (job.node, took.kind, took.params) == ("cpu-1", "drill.run", {"drill": "tiny-bf16"})
        assert app.diagnoses.get(STALE).detail.startswith("verifying drill")


async def test_w_quarantines_the_deployment_through_the_planned_drain_once_confirmed(
    acting,
) -> None:
    """tiny-vllm carries tiny beside tiny-trt and half its requests fail: an error burst,
    whose moves are fail over, quarantine, restart. `w` opens the plan draining it to
    weight 0, planned (a verified shift) whatever the class's severity (`f` would drain it
    at once): its weight to the others where one of them is up at the gateway, else onto
    the healthiest of them (a drain "onto the others" with none up, the gateway refuses)."""
    trt = free_port()
    app = acting.console(vllm_weight=100, snapshot=bursting(), trt=trt)
    async with app.run_test(size=(160, 40)) as pilot:
        screen = await open_first(app, pilot, BURST)  # critical: the first row
        assert screen.key == BURST
        assert keyed(screen) == {"f": True, "w": True, "r": True}
        # Nothing answers at tiny-trt yet: the gateway has it down.
        hint = "w: the plan draining tiny-vllm to weight 0, onto tiny-trt, planned"
        await until(pilot, lambda: hint in shown(screen), what="the quarantine onto tiny-trt")

        async def plan() -> FailoverScreen:
            await pilot.press("w")
            found = await until(pilot, lambda: top(app, FailoverScreen), what="the plan")
            await until(pilot, lambda: found.is_mounted and found.query("#onto"))
            return found

        # Opened and closed without confirming: nothing was done, nothing verified.
        first = await plan()
        assert (first.source, first.target, first.mode) == ("tiny-vllm", "tiny-trt", "planned")
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen, what="back on the diagnosis")
        assert app.diagnoses.get(BURST).state == "active"

        log = acting.double(trt)  # tiny-trt answers: up at the gateway, with its weight
        await until(pilot, lambda: "listening" in log.read_text(), what="the engine double")
        hint = "w: the plan draining tiny-vllm to weight 0, onto the others, planned"
        await until(pilot, lambda: hint in shown(screen), what="the quarantine onto the others")
        second = await plan()
        assert (second.source, second.target) == ("tiny-vllm", None)
        assert second.query_one("#move", Select).value == "drain"
        assert second.query_one("#target", Select).value == "tiny-vllm"
        assert second.query_one("#onto", Select).value == "others"
        assert second.query_one("#mode", Select).value == "planned"
        assert second.query_one("#confirm", Input).value == "tiny"
        said = str(second.query_one("#confirm-what", SafeStatic).render())
        assert said.startswith("drain tiny-vllm onto the others: Enter to confirm (diagnosis "
                               "error_burst on tiny/tiny-vllm"), said  # fmt: skip
        await pilot.press("enter")  # the confirmation holds the focus, the name typed
        job = await until(pilot, lambda: second.job, what="the gateway's job")
        assert job.params == {"model": "tiny", "drain": "tiny-vllm", "mode": "planned",
                                 "why": "from the console: diagnosis error_burst on "
                                 "tiny/tiny-vllm"}  # fmt: skip
        await back_verifying(app, pilot, screen, "quarantine", BURST)


@pytest.mark.parametrize(
    ("key", "press", "refused", "said"),
    [
        (STALE, "s", "starting vLLM", "read-only here: :start tiny, from a console that may act"),
        (STALE, "D", "running a drill",
         "read-only here: engineroom drill run tiny-bf16, from a console that may act"),
        (BURST, "w", "quarantining a deployment", "read-only here: engineroom failover tiny "
         "--drain tiny-vllm --plan, from a console that may act"),
    ],
    ids=["standby", "drill", "quarantine"],
)  # fmt: skip
async def test_a_read_only_view_refuses_the_standby_the_quarantine_and_the_drill(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    key: tuple[str, str],
    press: str,
    refused: str,
    said: str,
) -> None:
    monkeypatch.setenv("T_OPERATOR", OPERATOR.split(":", 1)[1])
    text = acting_fleet(tmp_path, vllm_weight=100)  # nothing answers: nothing is asked
    app = console_on(text, bursting(), app=WebViewApp)
    async with app.run_test(size=SIZE) as pilot:
        await held(app, pilot, key)
        screen = DiagnosisScreen(key)
        app.push_screen(screen)
        await until(pilot, lambda: screen.query("#diagnosis"), what="the diagnosis shown")
        await until(pilot, lambda: said in shown(screen), what="the read-only line")
        assert keyed(screen)[press] is False  # shown, disabled
        await pilot.press(press)
        await until(pilot, lambda: app.refused, what="a refusal")
        assert app.refused == [refused]
        assert app.screen is screen and app.diagnoses.get(key).state == "active"
