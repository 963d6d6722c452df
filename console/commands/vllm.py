"""`engineroom vllm start --profile P [--set K=V] | stop|restart --engine E`, on --node N
[--wait] [--json]: a job on the node's agent (docs/jobs.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any, TextIO

from console.commands.agentjob import act
from console.commands.base import Command, fleet_arg, fleet_of
from console.core.config.load import Fleet


def _pair(item: str) -> str:
    """A `--set` value checked as the arguments are read: a usage error, not a traceback."""
    key, sep, _ = item.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"wants KEY=VALUE, got {item!r}")
    return item


def add_arguments(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="verb", required=True)
    start = verbs.add_parser("start", help="start a launch profile")
    start.add_argument("--profile", required=True)
    start.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=_pair,
        help="an override the profile allows (port=8002, gpus=[1], args.max_model_len=4096)",
    )
    for verb in ("stop", "restart"):
        action = verbs.add_parser(verb, help=f"{verb} an engine (drains in-flight requests)")
        action.add_argument("--engine", required=True, help="engine id, as in the snapshot")
    for action in verbs.choices.values():
        fleet_arg(action)
        action.add_argument("--node", required=True)
        action.add_argument("--wait", action="store_true", help="follow the job to its end")
        action.add_argument("--json", action="store_true", help="print the job as JSON")


def run(args: argparse.Namespace) -> int:
    return run_vllm(
        fleet_of(args),
        args.verb,
        args.node,
        profile=getattr(args, "profile", None),
        engine=getattr(args, "engine", None),
        sets=getattr(args, "set", None),
        wait=args.wait,
        as_json=args.json,
    )


def parse_sets(items: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` pairs; VALUE is read as JSON where it parses (8002, [0,1], true)."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set wants KEY=VALUE, got {item!r}")
        try:
            overrides[key] = json.loads(raw)
        except ValueError:
            overrides[key] = raw
    return overrides


def run_vllm(
    fleet: Fleet,
    verb: str,
    node: str,
    *,
    profile: str | None = None,
    engine: str | None = None,
    sets: list[str] | None = None,
    wait: bool = False,
    as_json: bool = False,
    out: TextIO = sys.stdout,
) -> int:
    if verb == "start":
        assert profile is not None
        overrides = parse_sets(sets or [])
        return asyncio.run(
            act(fleet, node, lambda a: a.start(profile, overrides), wait, as_json, out)
        )
    assert engine is not None
    restart = verb == "restart"
    return asyncio.run(act(fleet, node, lambda a: a.stop(engine, restart), wait, as_json, out))


COMMAND = Command(
    "vllm", "start, stop or restart a vLLM server on a node (a job)", add_arguments, run
)
