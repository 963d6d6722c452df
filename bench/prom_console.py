"""The console side of bench.prom_scale: the real app, headless (Textual's run_test), in
its own process, reading the fleet from Prometheus; what it measures there.

Queries and Prometheus' own time per refresh, the console's CPU and RSS over a window of
steady refreshing, the first full screen and the first read whole, and key-to-screen on
Fleet and Models (bench.keypress).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path

import psutil

from bench.keypress import KeyTime, press

WINDOW_S = 60.0  # refreshes in slices; the whole read before it is reported apart
REFRESH_S = 2.0


async def measure_console(fleet_path: Path, nodes: int) -> dict[str, object]:
    from console.collect.prometheus.source import PromSource
    from console.core.config.load import load_fleet
    from console.tui.app import EngineroomApp
    from console.tui.screens.fleet import FleetScreen
    from console.tui.screens.models import ModelsScreen

    fleet = load_fleet(fleet_path)
    source = PromSource(fleet)
    refreshes: list[
        tuple[float, float, int, bool, int]
    ] = []  # prom s, wall s, queries, full, samples
    seen = [0.0]

    failed: list[str] = []  # what a failing query said (the first 5), with the refresh kind

    def note_refresh() -> None:
        health = source.health
        if health.last_ok is not None and health.last_ok != seen[0]:
            seen[0] = health.last_ok
            if health.error and len(failed) < 5:
                kind = "whole" if health.full else "sliced"
                failed.append(f"{kind}: {health.failed} failed: {health.error[:160]}")
            refreshes.append(
                (
                    health.prometheus_s or 0.0,
                    health.wall_s or 0.0,
                    health.queries,
                    bool(health.full),
                    health.samples,
                )
            )

    app = EngineroomApp(fleet, collector=source)
    me = psutil.Process()
    started = time.monotonic()
    first = None
    async with app.run_test(size=(160, 50)) as pilot:
        shown: float | None = None  # when the first node showed up
        answered: list[tuple[float, int]] = []  # (s, answers in) through the first read
        while time.monotonic() - started < 120:
            note_refresh()
            view, screen = app.view, app.screen
            if shown is None and view is not None and view.summary.nodes_up:
                shown = time.monotonic() - started
            if not answered or answered[-1][1] != source.health.answered:
                answered.append((round(time.monotonic() - started, 2), source.health.answered))
            if (
                view is not None
                and view.summary.nodes_up >= nodes
                and isinstance(screen, FleetScreen)
                and screen.drawn_nodes >= nodes
            ):
                first = time.monotonic() - started
                break
            await asyncio.sleep(0.02)
        # The first screen may show the nodes before every answer of the first read is in
        # (PromSource.first_look_s): how long until all of it was read.
        while source.health.ok is None and time.monotonic() - started < 180:
            await asyncio.sleep(0.02)
        whole = time.monotonic() - started if source.health.ok is not None else None
        note_refresh()
        await pilot.pause(2)
        cpu0, wall0 = me.cpu_times(), time.monotonic()
        keys: dict[str, list[KeyTime]] = {"fleet": [], "models": []}
        next_key = wall0 + 1.0
        while time.monotonic() - wall0 < WINDOW_S:
            note_refresh()
            if time.monotonic() >= next_key and sum(map(len, keys.values())) < 20:
                to_models = isinstance(app.screen, FleetScreen)
                target = ModelsScreen if to_models else FleetScreen
                took = await press(app, "m" if to_models else "n", target)
                keys["models" if to_models else "fleet"].append(took)
                next_key = time.monotonic() + 1.0
            await asyncio.sleep(0.1)
        cpu1, wall1 = me.cpu_times(), time.monotonic()
        rss = me.memory_info().rss
        view = app.view
        ticks = list(app.tick_ms)[-int(WINDOW_S) :]
    cpu_s = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return {
        "nodes": nodes,
        "nodes_up": view.summary.nodes_up if view else None,
        "gpus": view.summary.gpus if view else None,
        "deployments": sum(len(r) for r in view.models.values()) if view else None,
        "queries_per_refresh": refreshes[-1][2] if refreshes else None,
        **_refresh_figures(refreshes, full=True),
        **_refresh_figures(refreshes, full=False),
        "console_cpu_pct": round(100 * cpu_s / (wall1 - wall0), 1),
        "console_rss_mib": round(rss / 2**20, 1),
        "first_full_screen_s": round(first, 2) if first is not None else None,
        "first_read_whole_s": round(whole, 2) if whole is not None else None,
        "first_node_shown_s": round(shown, 2) if shown is not None else None,
        "query_failures": failed,
        "first_read_answers": answered,
        **key_figures(keys),
        "tick_build_ms_median": round(statistics.median(b for b, _ in ticks), 1) if ticks else None,
        "tick_draw_ms_median": round(statistics.median(d for _, d in ticks), 1) if ticks else None,
        "load1": round(os.getloadavg()[0], 2),
    }


def key_figures(keys: dict[str, list[KeyTime]]) -> dict[str, object]:
    """Medians and the worst of the key presses to each screen, to its first frame; and
    the medians as measured before (bench.keypress)."""
    out: dict[str, object] = {}
    for screen, times in keys.items():
        out[f"key_to_{screen}_median_ms"] = (
            round(statistics.median(k.frame_ms for k in times), 1) if times else None
        )
    every = [k for times in keys.values() for k in times]
    out["key_to_screen_max_ms"] = round(max(k.frame_ms for k in every), 1) if every else None
    for screen, times in keys.items():
        out[f"key_to_{screen}_noticed_median_ms"] = (
            round(statistics.median(k.noticed_ms for k in times), 1) if times else None
        )
    return out


def _refresh_figures(
    refreshes: list[tuple[float, float, int, bool, int]], full: bool
) -> dict[str, object]:
    """Medians of the whole-fleet refreshes (the first included), or of the sliced ones
    between them."""
    kind = "whole" if full else "sliced"
    picked = [r for r in refreshes if r[3] == full]
    if not picked:
        return {f"{kind}_refreshes": 0}
    return {
        f"{kind}_refreshes": len(picked),
        f"{kind}_wall_s_median": round(statistics.median(r[1] for r in picked), 2),
        f"{kind}_prometheus_s_median": round(statistics.median(r[0] for r in picked), 2),
        f"{kind}_samples_median": int(statistics.median(r[4] for r in picked)),
    }
