"""engineroom's command line: argument parsing, then a call into the packages.

Every command takes --fleet PATH (default $ENGINEROOM_FLEET, else ./fleet.toml). A bad
fleet file prints its one-line error and exits 3 before anything starts. The verbs, each
with its arguments and its run, are in console.commands.
"""

from __future__ import annotations

import argparse
import logging
import sys

from console.commands import COMMANDS
from console.commands.base import EXIT_CONFIG, EXIT_USAGE
from console.core.config.load import ConfigError
from console.core.safetext import say


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="engineroom", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    for command in COMMANDS:
        verb = sub.add_parser(command.name, help=command.help, description=command.description)
        command.add_arguments(verb)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["tui", *argv]  # `engineroom [--fleet F]` opens the console
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    command = next((c for c in COMMANDS if c.name == args.command), None)
    if command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return command.run(args)
    except ConfigError as exc:
        say(f"engineroom: {exc}", sys.stderr)  # it may quote a value from outside
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
