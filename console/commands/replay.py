"""`engineroom replay FILE [--at T]`: the console on a recording, read-only. Textual is
imported only here, when the verb runs."""

from __future__ import annotations

import argparse

from console.commands.base import Command, on_a_recording


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file")
    parser.add_argument("--at", default=None, help="start at this time (HH:MM:SS UTC, +MM:SS)")


def run(args: argparse.Namespace) -> int:
    def go() -> int:
        from console.tui.replay import run_replay

        return run_replay(args.file, args.at)

    return on_a_recording("replay", go)


COMMAND = Command("replay", "the console on a recording, read-only", add_arguments, run)
