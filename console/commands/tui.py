"""`engineroom [tui] [--read-only] [--record FILE] [--slow-link]`: the console, the
default command. Textual is imported only here, when the verb runs."""

from __future__ import annotations

import argparse

from console.commands.base import Command, fleet_arg, fleet_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fleet_arg(parser)
    parser.add_argument("--read-only", action="store_true", help="disable every action")
    parser.add_argument("--record", default=None, metavar="FILE", help="record what it sees")
    parser.add_argument(
        "--slow-link",
        action="store_true",
        help="for a slow SSH link: redraw every 5 s, no animation, no mouse (docs/scale.md)",
    )


def run(args: argparse.Namespace) -> int:
    from console.tui.app import run_tui

    return run_tui(
        fleet_of(args), read_only=args.read_only, record=args.record, slow_link=args.slow_link
    )


COMMAND = Command("tui", "the console (the default command)", add_arguments, run)
