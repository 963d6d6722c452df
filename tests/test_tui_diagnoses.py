"""The console's diagnoses (issue 30): the count in the header, `:diag`, one diagnosis
whole, and the failover made from it, verified once the operator confirmed it.

The fleet is the recorded real agent of tests/test_tui_drills.py (on cpu-1, tiny-trt's
TensorRT-LLM engine is stale after the node's driver and TensorRT-LLM changed, and
tiny-vllm is ready); the failover goes to a real gateway on loopback. The finding itself
is tested on real engines in tests/test_diagnoses.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from textual.widgets import Input, Select
from textual.widgets.data_table import ColumnKey

from console.collect.replay import ReplayCollector
from console.core.config import parse_fleet
from console.core.snapshot import decode_snapshot
from console.tui.app import EngineroomApp
from console.tui.screens.diagnoses import DiagnosesScreen, DiagnosisScreen
from console.tui.screens.failover import FailoverScreen
from console.tui.web import WebViewApp
from console.tui.widgets.header import FleetHeader
from console.tui.widgets.safe_static import SafeStatic
from console.tui.widgets.table import FleetTable
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


def rows(app: EngineroomApp) -> dict[str, list[str]]:
    table = app.screen.query_one(FleetTable)
    return {key: [str(getattr(c, "plain", c)) for c in row.made()] for key, row in
            table.rows_by_key.items()}  # fmt: skip


async def open_diagnosis(app: EngineroomApp, pilot) -> DiagnosisScreen:
    await pilot.press(*keys(":diag\r"))
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
        await until(pilot, lambda: "diag 1 " in header(app), what="diag 1 in the header")
        assert "diag 1 (" not in header(app)  # a warning: no critical count

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
        assert await until(pilot, lambda: "diag 2 (1 crit)" in header(app), what="the count")

    quiet = recorded_app()  # the recorded H200 and vLLM + Triton on CPU: nothing wrong
    async with quiet.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: quiet.diagnoses.looked, what="the first look")
        await until(pilot, lambda: "nodes" in header(quiet), what="the header")
        assert quiet.diagnoses.found == [] and "diag" not in header(quiet)


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
            screen = await open_diagnosis(app, pilot)
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
            second.query_one("#mode", Select).value = "emergency"  # tiny-vllm does not answer
            await pilot.press(*"tiny", "enter")
            assert second.query_one("#confirm", Input).value == "tiny"
            await until(pilot, lambda: second.job, what="the failover job")
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
