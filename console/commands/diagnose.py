"""`engineroom diagnose [--json | --markdown] [--watch N]`: which named problems the fleet
has, the evidence for each and the moves to make (console.collect.diagnose.output renders
them; the classes: docs/diagnoses.md). Exit codes as check's: 0 none, 1 found, 2
unreachable."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import TYPE_CHECKING, TextIO

from console.commands.base import Command, fleet_arg, fleet_of

if TYPE_CHECKING:
    from console.collect.diagnose.diagnoser import CannotTell, Diagnoser, Diagnosis
    from console.collect.sources.source import NodeState
    from console.collect.views.gateway_view import GatewayView
    from console.collect.views.view import FleetView
    from console.core.config.load import Fleet


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fleet_arg(parser)
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="stable JSON (docs/diagnoses.md)")
    form.add_argument("--markdown", action="store_true", help="a table for an incident doc")
    parser.add_argument(
        "--watch", type=float, default=None, metavar="N", help="look again every N seconds"
    )


def run(args: argparse.Namespace) -> int:
    fmt = "json" if args.json else "markdown" if args.markdown else "text"
    return run_diagnose(fleet_of(args), fmt=fmt, watch=args.watch)


def run_diagnose(
    fleet: Fleet,
    *,
    fmt: str = "text",
    watch: float | None = None,
    out: TextIO = sys.stdout,
) -> int:
    from console.collect.diagnose.diagnoser import Diagnoser
    from console.collect.diagnose.output import render
    from console.collect.views.check import EXIT, Diagnosed, poll_once, status_of

    if watch is None:
        view, states, gateway, source = asyncio.run(poll_once(fleet))
        found = Diagnosed(*_once(Diagnoser(fleet), view, states, gateway.snapshot))
        out.write(render(fmt, view, found, source, fleet) + "\n")
        return EXIT[status_of(view, source, found)]
    return asyncio.run(_watch(fleet, watch, fmt, out))


def _once(
    diagnoser: Diagnoser,
    view: FleetView,
    states: dict[str, NodeState],
    gateway: GatewayView | None,
) -> tuple[list[Diagnosis], list[CannotTell]]:
    return diagnoser.update(view, states, gateway), diagnoser.cannot_tell


async def _watch(fleet: Fleet, every: float, fmt: str, out: TextIO) -> int:
    from console.collect.diagnose.diagnoser import Diagnoser
    from console.collect.diagnose.output import render
    from console.collect.prometheus.source import fleet_source
    from console.collect.views.check import Diagnosed, read_gateway
    from console.collect.views.view import build

    diagnoser = Diagnoser(fleet)
    async with fleet_source(fleet, refresh_s=every) as collector:
        while True:
            started = time.monotonic()
            states, gateway = await asyncio.gather(
                collector.poll_all(), read_gateway(fleet, collector.timeout_s)
            )
            view = build(fleet, states, collector.refresh_s, history=collector.history,
                         gateway=gateway.snapshot)  # fmt: skip
            found = Diagnosed(*_once(diagnoser, view, states, gateway.snapshot))
            clear = "" if fmt != "text" or not out.isatty() else "\033[H\033[2J"
            out.write(f"{clear}{render(fmt, view, found, collector.health, fleet)}\n")
            out.flush()
            await asyncio.sleep(max(0.0, every - (time.monotonic() - started)))


COMMAND = Command(
    "diagnose",
    "name the fleet's problems, with their evidence and moves: 0 none, 1 found, 2 unreachable",
    add_arguments,
    run,
)
