"""`engineroom haproxy render|adopt [--dataplane NAME]`: HAProxy as a model's data plane
(console.gateway.dataplanes.haproxy_config, docs/haproxy.md)."""

from __future__ import annotations

import argparse

from console.commands.base import Command, fleet_arg, fleet_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="verb", required=True)
    for verb, what in (
        ("render", "write its configuration for the models that name it"),
        ("adopt", "check that an existing configuration has the backends and servers named"),
    ):
        action = verbs.add_parser(verb, help=what)
        fleet_arg(action)
        action.add_argument("--dataplane", help="its [[dataplanes]] name (default: the only one)")
        if verb == "render":
            action.add_argument("--out", help="where to write (default: the data plane's config)")


def run(args: argparse.Namespace) -> int:
    from console.gateway.dataplanes.haproxy_config import run_cli

    fleet = fleet_of(args)
    return run_cli(fleet, args.verb, args.dataplane, getattr(args, "out", None))


COMMAND = Command(
    "haproxy", "HAProxy as a model's data plane (docs/haproxy.md)", add_arguments, run
)
