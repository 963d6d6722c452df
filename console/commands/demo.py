"""`engineroom demo [--no-tui] [--nodes N]`: the console on a simulated local fleet
(console.demo)."""

from __future__ import annotations

import argparse

from console.commands.base import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-tui",
        action="store_true",
        help="keep the simulated fleet running without the TUI; prints 'fleet: PATH' first",
    )
    parser.add_argument("--nodes", type=int, default=4)


def run(args: argparse.Namespace) -> int:
    from console.demo import run_demo

    return run_demo(no_tui=args.no_tui, nodes=args.nodes)


COMMAND = Command("demo", "the console on a simulated local fleet", add_arguments, run)
