"""`engineroom rules [--out FILE]`: the fleet's Prometheus alerting rules, its alerts' and
the diagnoses' PromQL can tell (console.collect.promrules.alerts, docs/prometheus.md)."""

from __future__ import annotations

import argparse

from console.commands.base import Command, fleet_arg, fleet_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fleet_arg(parser)
    parser.add_argument("--out", default=None, metavar="FILE", help="write here, not stdout")


def run(args: argparse.Namespace) -> int:
    from console.collect.promrules.alerts import run_rules

    return run_rules(fleet_of(args), args.out)


COMMAND = Command("rules", "Prometheus alerting rules (docs/prometheus.md)", add_arguments, run)
