"""The console's drill screens over a recorded real agent snapshot.

tests/fixtures/snapshot-cpu-drills.json was printed by the real agent of
tests/test_drills.py (ENGINEROOM_RECORD_DRILL_SNAPSHOT): two finished drills, tiny-trt
REBUILD REQUIRED after the node's driver and TensorRT-LLM changed, and a hand-built
engine with no manifest.
"""

from __future__ import annotations

from console.collect.recordings.replay import ReplayCollector
from console.core.config.load import parse_fleet
from console.core.snapshot import decode_snapshot
from console.tui.app import EngineroomApp
from console.tui.screens.drills import DrillsScreen, PlaybookScreen
from console.tui.screens.jobtext import step_bars
from console.tui.widgets.table import FleetTable
from tests.tui_support import FLEET, ROOT, keys, until

DRILLS = ROOT / "tests" / "fixtures" / "snapshot-cpu-drills.json"
SIZE = (110, 34)

DRILL_FLEET = (
    FLEET
    + """
[drills.tiny-bf16]
model = "tiny"
deployment = "tiny-trt"
checkpoint = "/models/tiny"
"""
)


def drill_app() -> EngineroomApp:
    fleet = parse_fleet(DRILL_FLEET)
    snapshots = {
        "h200": None,
        "cpu-1": decode_snapshot(DRILLS.read_text()),
        "gone": None,
    }
    return EngineroomApp(fleet, collector=ReplayCollector(fleet, snapshots))


def test_drills_screen(snap_compare):
    async def run_before(pilot) -> None:
        app = pilot.app
        await until(
            pilot,
            lambda: any(t.row_count for t in app.screen.query(FleetTable)),
            what="the fleet screen drawn",
        )
        await pilot.press("d")

        def failed() -> bool:
            """The history fetch from the (absent) agent has failed, and the screen says so
            under its drawn tables."""
            screen = app.screen
            if not isinstance(screen, DrillsScreen) or not screen.problems:
                return False
            tables = screen.query(FleetTable)
            shown = str(screen.query_one("#drill-detail").render())
            return bool(tables) and all(t.row_count for t in tables) and "did not answer" in shown

        await until(pilot, failed, what="the drill history's failed fetch said")
        await pilot.pause()

    assert snap_compare(drill_app(), terminal_size=SIZE, run_before=run_before)


async def test_models_show_rebuild_required_and_the_playbook_says_what_is_next() -> None:
    app = drill_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*keys(":models\r"))

        def badged() -> list[str]:
            table = app.screen.query_one(FleetTable)
            return [
                row.fields["deployment"]
                for row in table.rows_by_key.values()
                if any("REBUILD REQUIRED" in cell.plain for cell in row.made())
            ]

        assert await until(pilot, badged, what="a REBUILD REQUIRED badge") == ["tiny-trt"]
        app.open_playbook("tiny")
        screen = await until(
            pilot,
            lambda: (
                app.screen if isinstance(app.screen, PlaybookScreen) and app.screen.checks else None
            ),
            what="the playbook with its checks",
        )
        states = [(c.name, c.state) for c in screen.checks]
        assert states[0] == ("TensorRT-LLM deployment", "failed")
        assert "driver 580.159.04 → 575.57.08" in screen.checks[0].detail
        assert states[1] == ("vLLM standby", "done")  # tiny-vllm is ready in the recording
        # No gateway in this fleet: nothing moves the traffic, its weights are unknown.
        assert states[2] == ("fail over to vLLM", "blocked")
        assert "no [gateway]" in screen.checks[2].detail
        assert states[3][1] == "waiting" and states[4][1] == "waiting"


def test_step_bars_scale_to_the_longest_step() -> None:
    snap = decode_snapshot(DRILLS.read_text())
    job = next(j for j in snap.jobs if j.result.get("cache") == "miss")
    text = step_bars(job.steps, width=20).plain
    lines = {line.split()[0]: line for line in text.splitlines()}
    assert set(lines) == {"preflight", "convert", "build", "validate", "benchmark", "promote"}
    longest = max(lines.values(), key=lambda line: line.count("█"))
    assert longest.count("█") == 20
    assert all("succeeded" in line for line in lines.values())
