"""Snapshot tests of the main screens, rendered from recorded real agent output.

Update after an intended change of looks: pytest tests/test_tui_snapshots.py --snapshot-update
and look at the report before committing.
"""

from __future__ import annotations

from console.tui.screens.base import ViewScreen
from console.tui.widgets.header import FleetHeader
from console.tui.widgets.table import FleetTable
from tests.tui_support import FLEET, keys, recorded_app, until

SIZE = (100, 30)

# The gateway's admin snapshot (console/gateway/server.py), replayed beside the recorded
# agents: its own TTFT per deployment, as clients felt it.
RECORDED_GATEWAY = {
    "models": {
        "tiny": {
            "tiny-trt": {"weight": 100, "up": True, "ttft_s": {"p95": 0.0921, "count": 40}},
            "tiny-vllm": {"weight": 0, "up": True, "ttft_s": {"p95": 0.0547, "count": 40}},
        }
    }
}


def drawn(app, typed: str = "", before: object = None) -> bool:
    """The screen on top has drawn the view: a screen other than `before` when a command
    was typed, its header naming it (and the filter typed), every table with its rows."""
    screen = app.screen
    if not isinstance(screen, ViewScreen) or not screen.is_mounted:
        return False
    if typed.startswith(":") and screen is before:
        return False
    headers = screen.query(FleetHeader)
    line = str(headers.first().render()) if headers else ""
    if screen.where not in line or (typed.startswith("/") and typed.strip() not in line):
        return False
    tables = screen.query(FleetTable)
    return bool(tables) and all(t.row_count for t in tables)


def views(*typed: str):
    async def run_before(pilot) -> None:
        app = pilot.app
        await until(pilot, lambda: drawn(app), what="the first screen drawn")
        for text in typed:
            before = app.screen
            await pilot.press(*keys(text))
            await until(pilot, lambda t=text, b=before: drawn(app, t, b), what=f"{text!r} drawn")
        await pilot.pause()

    return run_before


def test_fleet_screen(snap_compare):
    assert snap_compare(recorded_app(), terminal_size=SIZE, run_before=views())


def test_models_screen(snap_compare):
    assert snap_compare(recorded_app(), terminal_size=SIZE, run_before=views(":models\r"))


def test_node_screen(snap_compare):
    assert snap_compare(recorded_app(), terminal_size=SIZE, run_before=views(":node h200\r"))


def test_gpus_screen_filtered(snap_compare):
    assert snap_compare(
        recorded_app(), terminal_size=SIZE, run_before=views(":gpus\r", "/util>50\r")
    )


def test_prod_read_only_header(snap_compare):
    app = recorded_app(FLEET.replace('environment = "staging"', 'environment = "prod"'))
    assert snap_compare(app, terminal_size=(80, 24), run_before=views())


def test_models_header_says_where_each_latency_was_measured(snap_compare):
    """The header's second line says engine or gateway; GAP shows where both measured."""
    app = recorded_app()
    app.gateway_snapshot = RECORDED_GATEWAY
    assert snap_compare(app, terminal_size=(140, 12), run_before=views(":models\r"))


def test_a_node_without_a_token_is_shown_apart(snap_compare):
    no_token = '[[nodes]]\nname = "other-team"\nagent = "http://127.0.0.1:4"\n'
    no_token += 'token_env = "ENGINEROOM_TEST_UNSET_TOKEN"\n\n[[models]]'
    app = recorded_app(FLEET.replace("[[models]]", no_token, 1))
    assert snap_compare(app, terminal_size=(100, 12), run_before=views())
