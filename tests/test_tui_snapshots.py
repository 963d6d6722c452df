"""Snapshot tests of the main screens, rendered from recorded real agent output.

Update after an intended change of looks: pytest tests/test_tui_snapshots.py --snapshot-update
and look at the report before committing.
"""

from __future__ import annotations

from tests.tui_support import keys, recorded_app

SIZE = (100, 30)


def views(*typed: str):
    async def run_before(pilot) -> None:
        await pilot.pause(0.3)
        for text in typed:
            await pilot.press(*keys(text))
            await pilot.pause(0.3)

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
    from tests.tui_support import FLEET

    app = recorded_app(FLEET.replace('environment = "staging"', 'environment = "prod"'))
    assert snap_compare(app, terminal_size=(80, 24), run_before=views())
