"""`engineroom record [--out FILE] [--for DURATION]`: record the fleet headless
(docs/recording.md)."""

from __future__ import annotations

import argparse
import asyncio
import time

from console.commands.base import Command, fleet_arg, fleet_of, on_a_recording


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fleet_arg(parser)
    parser.add_argument("--out", default=None, help="the recording (default: a dated name)")
    parser.add_argument("--for", dest="for_", default=None, metavar="DURATION",
                        help="stop after it: 90s, 30m, 8h (default: until SIGTERM)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from console.collect.recordings.recorder import record
    from console.collect.recordings.timeline import parse_duration

    def go() -> int:
        fleet = fleet_of(args)
        for_s = None if args.for_ is None else parse_duration(args.for_)
        out = args.out or time.strftime("engineroom-%Y%m%d-%H%M%S.rec", time.gmtime())
        return asyncio.run(record(fleet, out, for_s))

    return on_a_recording("record", go)


COMMAND = Command("record", "record the fleet headless (docs/recording.md)", add_arguments, run)
