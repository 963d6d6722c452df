"""`engineroom gateway [--listen HOST:PORT]`: the OpenAI gateway in front of the fleet
(console.gateway.server)."""

from __future__ import annotations

import argparse

from console.commands.base import Command, default_fleet, fleet_arg, split_listen


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fleet_arg(parser)
    parser.add_argument("--listen", type=split_listen, default=None, metavar="HOST:PORT")


def run(args: argparse.Namespace) -> int:
    from console.gateway.server import run_gateway

    return run_gateway(args.fleet or default_fleet(), args.listen)


COMMAND = Command("gateway", "run the OpenAI gateway in front of the fleet", add_arguments, run)
