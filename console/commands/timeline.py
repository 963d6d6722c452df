"""`engineroom timeline FILE [--from T] [--to T] [--markdown | --json]`: a recording's
incident timeline (console.collect.timeline)."""

from __future__ import annotations

import argparse

from console.commands.base import Command, on_a_recording


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file")
    parser.add_argument("--from", dest="from_", default=None, metavar="T")
    parser.add_argument("--to", default=None, metavar="T")
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--markdown", action="store_true", help="for the postmortem (default)")
    shape.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from console.collect.timeline import run_timeline

    return on_a_recording(
        "timeline", lambda: run_timeline(args.file, args.from_, args.to, as_json=args.json)
    )


COMMAND = Command("timeline", "a recording's incident timeline", add_arguments, run)
