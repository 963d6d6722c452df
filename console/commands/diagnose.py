"""`engineroom diagnose [--json | --markdown] [--watch N]`: which named problems the fleet
has, the evidence for each and the moves to make (console.collect.diagnose_out; the
classes: docs/diagnoses.md). Exit codes as check's: 0 none, 1 found, 2 unreachable."""

from __future__ import annotations

import argparse

from console.commands.base import Command, fleet_arg, fleet_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fleet_arg(parser)
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="stable JSON (docs/diagnoses.md)")
    form.add_argument("--markdown", action="store_true", help="a table for an incident doc")
    parser.add_argument(
        "--watch", type=float, default=None, metavar="N", help="look again every N seconds"
    )


def run(args: argparse.Namespace) -> int:
    from console.collect.diagnose_out import run_diagnose

    fmt = "json" if args.json else "markdown" if args.markdown else "text"
    return run_diagnose(fleet_of(args), fmt=fmt, watch=args.watch)


COMMAND = Command(
    "diagnose",
    "name the fleet's problems, with their evidence and moves: 0 none, 1 found, 2 unreachable",
    add_arguments,
    run,
)
