"""`engineroom check [--json | --prometheus] [--watch N]`: poll the fleet once
(console.collect.check). Exit codes: 0 healthy, 1 degraded, 2 unreachable."""

from __future__ import annotations

import argparse

from console.commands.base import Command, fleet_arg, fleet_of


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
    from console.collect.check import run_check

    fleet = fleet_of(args)
    return run_check(fleet, as_json=args.json, watch=args.watch, prometheus=args.prometheus)


COMMAND = Command(
    "check", "poll the fleet once: 0 healthy, 1 degraded, 2 unreachable", add_arguments, run
)
