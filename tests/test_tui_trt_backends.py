"""The console's badge for a stale TensorRT-LLM deployment says what its backend needs
(issue 31): REBUILD REQUIRED on the engine backend, RE-VALIDATE on the PyTorch backend
(no build; the new stack is validated against the baseline), on the Models, Node and
Drills screens alike. Where the agent cannot tell the backend (neither the manifest nor a
drill says), it stays REBUILD REQUIRED.

The snapshot is tests/fixtures/snapshot-cpu-drills.json, printed by a real agent
(tests/test_drills.py): tiny-trt stale after its node's driver and TensorRT-LLM changed.
That agent predates the `backend` field, so the recording says none; the PyTorch case is
the same snapshot with the backend its agent reports for a manifest of pipeline "pytorch"
(console.agent.drills.staleness.backend_of; tests/test_trtllm_backends.py checks that on
a real agent).
"""

from __future__ import annotations

import msgspec
import pytest

from console.collect.recordings.replay import ReplayCollector
from console.core.config.load import parse_fleet
from console.core.snapshot import Snapshot, decode_snapshot
from console.tui.app import EngineroomApp
from console.tui.screens.drills import DrillsScreen
from console.tui.screens.node import NodeScreen
from console.tui.widgets.table import FleetTable
from tests.test_tui_drills import DRILL_FLEET, DRILLS, SIZE
from tests.tui_support import keys, until


def snapshot(backend: str | None) -> Snapshot:
    snap = decode_snapshot(DRILLS.read_text())
    trt = [
        msgspec.structs.replace(t, backend=backend) if t.deployment == "tiny-trt" else t
        for t in snap.trt_engines
    ]
    assert [t.state for t in trt if t.deployment == "tiny-trt"] == ["stale"]
    return msgspec.structs.replace(snap, trt_engines=trt)


def app_on(backend: str | None) -> EngineroomApp:
    fleet = parse_fleet(DRILL_FLEET)
    snapshots = {"h200": None, "cpu-1": snapshot(backend), "gone": None}
    return EngineroomApp(fleet, collector=ReplayCollector(fleet, snapshots))


def badges(app: EngineroomApp) -> dict[str, str]:
    """Each row's badge on the screen's first table: its deployment (or drill) -> text."""
    table = app.screen.query(FleetTable).first()
    found = {}
    for key, row in table.rows_by_key.items():
        for cell in row.made():
            for badge in ("REBUILD REQUIRED", "RE-VALIDATE"):
                if badge in cell.plain:
                    found[str(row.fields.get("deployment") or key)] = badge
    return found


def node_info(app: EngineroomApp) -> str | None:
    """The Node screen's head once it has its TensorRT-LLM lines."""
    found = app.screen.query("#node-info")
    text = str(found.first().render()) if found else ""
    return text if "TensorRT-LLM tiny-trt " in text else None


@pytest.mark.parametrize(
    ("backend", "badge", "other"),
    [("pytorch", "RE-VALIDATE", "REBUILD REQUIRED"), ("engine", "REBUILD REQUIRED",
     "RE-VALIDATE"), (None, "REBUILD REQUIRED", "RE-VALIDATE")],
)  # fmt: skip
async def test_a_stale_deployment_is_badged_for_what_its_backend_needs(
    backend: str | None, badge: str, other: str
) -> None:
    app = app_on(backend)
    async with app.run_test(size=SIZE) as pilot:
        # Models: its row.
        await pilot.press(*keys(":models\r"))
        assert await until(pilot, lambda: badges(app), what="a badge on Models") == {
            "tiny-trt": badge
        }
        row = app.screen.query_one(FleetTable).rows_by_key["d:tiny:tiny-trt"]
        assert row.fields["revalidate"] is (backend == "pytorch")
        assert row.fields["rebuild"] is (backend != "pytorch")
        assert badge.lower() in row.text

        # Drills: the drill's row names the state of the deployment it rebuilds.
        await pilot.press("escape")
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, DrillsScreen), what="Drills")
        assert await until(pilot, lambda: badges(app), what="a badge on Drills") == {
            "d:tiny-bf16": badge
        }

        # Node: the TensorRT-LLM line, with why.
        app.open_node("cpu-1")
        await until(pilot, lambda: isinstance(app.screen, NodeScreen), what="cpu-1")
        info = await until(pilot, lambda: node_info(app), what="the node's TensorRT-LLM line")
        line = next(x for x in info.splitlines() if x.startswith("TensorRT-LLM tiny-trt "))
        assert f" {badge}  driver 580.159.04 → 575.57.08; TensorRT-LLM 1.2.0 → 1.2.1" in line
        assert other not in info
