"""`engineroom check [--json | --prometheus] [--watch N]`: poll the fleet once
(console.collect.views.check reads and renders it). Exit codes: 0 healthy, 1 degraded, 2
unreachable."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import TYPE_CHECKING, TextIO

from console.commands.base import Command, fleet_arg, fleet_of

if TYPE_CHECKING:
    from console.core.config.load import Fleet


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fleet_arg(parser)
    parser.add_argument("--json", action="store_true", help="stable JSON (docs/check-json.md)")
    parser.add_argument(
        "--prometheus", action="store_true", help="Prometheus text (node up, alerts, status)"
    )
    parser.add_argument(
        "--watch",
        type=float,
        default=None,
        metavar="N",
        help="print a fresh table every N seconds, without a TUI",
    )


def run(args: argparse.Namespace) -> int:
    fleet = fleet_of(args)
    return run_check(fleet, as_json=args.json, watch=args.watch, prometheus=args.prometheus)


def run_check(
    fleet: Fleet,
    *,
    as_json: bool = False,
    watch: float | None = None,
    out: TextIO = sys.stdout,
    prometheus: bool = False,
) -> int:
    from console.collect.views.check import (
        EXIT,
        diagnosed,
        poll_once,
        render,
        status_of,
        to_json,
        to_prometheus,
    )

    if watch is None:
        view, states, gateway, source = asyncio.run(poll_once(fleet))
        found = diagnosed(fleet, view, states, gateway)
        if prometheus:
            out.write(to_prometheus(fleet, view, states))
        elif as_json:
            out.write(to_json(view, states, gateway, source, found) + "\n")
        else:
            out.write(render(view, gateway, source, found) + "\n")
        return EXIT[status_of(view, source, found)]
    return asyncio.run(_watch(fleet, watch, as_json, out))


async def _watch(fleet: Fleet, every: float, as_json: bool, out: TextIO) -> int:
    from console.collect.prometheus.source import fleet_source
    from console.collect.views.check import diagnosed, read_gateway, render, to_json
    from console.collect.views.view import build

    async with fleet_source(fleet, refresh_s=every) as collector:
        source = collector.health
        while True:
            started = time.monotonic()
            states, gateway = await asyncio.gather(
                collector.poll_all(), read_gateway(fleet, collector.timeout_s)
            )
            view = build(
                fleet,
                states,
                collector.refresh_s,
                history=collector.history,
                gateway=gateway.snapshot,
            )
            found = diagnosed(fleet, view, states, gateway)
            text = (
                to_json(view, states, gateway, source, found)
                if as_json
                else render(view, gateway, source, found)
            )
            clear = "" if as_json or not out.isatty() else "\033[H\033[2J"
            out.write(f"{clear}{text}\n")
            out.flush()
            await asyncio.sleep(max(0.0, every - (time.monotonic() - started)))


COMMAND = Command(
    "check", "poll the fleet once: 0 healthy, 1 degraded, 2 unreachable", add_arguments, run
)
