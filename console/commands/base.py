"""What every verb of the command line shares: the `Command` record the registry holds,
the exit codes, and the --fleet and --listen arguments."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from console.core.config.load import Fleet, load_fleet
from console.core.safetext import say

EXIT_OK = 0
EXIT_FAILED = 1  # refused, or it ran and failed
EXIT_UNREACHABLE = 2  # an agent or the gateway did not answer
EXIT_USAGE = 2  # argparse's own code for a bad command line
EXIT_CONFIG = 3  # a bad fleet file or a missing secret: nothing started
EXIT_LOCKED = 4  # agent: another agent holds this node's state folder; nothing touched


@dataclass(frozen=True, slots=True)
class Command:
    """One verb: `engineroom NAME ...`. `run` gets the parsed arguments and returns the
    exit code; a ConfigError it raises is the fleet file's one-line error, exit 3."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None  # the verb's --help text, where it says more than `help`


def default_fleet() -> str:
    return os.environ.get("ENGINEROOM_FLEET", "fleet.toml")


def fleet_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fleet", default=None, help="fleet file (default $ENGINEROOM_FLEET or ./fleet.toml)"
    )


def fleet_of(args: argparse.Namespace) -> Fleet:
    """The fleet named by --fleet, else the default one."""
    return load_fleet(args.fleet or default_fleet())


def split_listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not port.isdigit():
        raise argparse.ArgumentTypeError(f"--listen wants HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def on_a_recording(verb: str, call: Callable[[], int]) -> int:
    """record, replay, timeline (docs/recording.md): a file that is not a recording, or a
    bad duration or time, is one line naming it, exit 2."""
    from console.collect.recordings.reader import RecordingError

    try:
        return call()
    except (RecordingError, ValueError, OSError) as exc:
        say(f"engineroom {verb}: {exc}", sys.stderr)  # a recording is outside text
        return EXIT_USAGE
