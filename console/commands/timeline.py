"""`engineroom timeline FILE [--from T] [--to T] [--markdown | --json]`: a recording's
incident timeline (console.collect.recordings.timeline builds and writes it)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from console.commands.base import Command, on_a_recording


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file")
    parser.add_argument("--from", dest="from_", default=None, metavar="T")
    parser.add_argument("--to", default=None, metavar="T")
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--markdown", action="store_true", help="for the postmortem (default)")
    shape.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    return on_a_recording(
        "timeline", lambda: run_timeline(args.file, args.from_, args.to, as_json=args.json)
    )


def run_timeline(path: str, start: str | None, end: str | None, *, as_json: bool) -> int:
    from console.collect.recordings.reader import Recording
    from console.collect.recordings.timeline import build, markdown, parse_time, utc

    recording = Recording(path)
    t0 = recording.start if start is None else parse_time(start, recording.start)
    t1 = recording.end if end is None else parse_time(end, recording.start)
    entries = build(recording, t0, t1)
    if as_json:
        out = {
            "file": str(recording.path),
            "from": t0,
            "to": t1,
            "torn": recording.torn,
            "entries": [{**asdict(e), "time": utc(e.t, True) + " UTC"} for e in entries],
        }
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(markdown(recording, entries, t0, t1))
    return 0


COMMAND = Command("timeline", "a recording's incident timeline", add_arguments, run)
