"""`engineroom agent [--node N] [--listen HOST:PORT] [--once [--json]]`: the node agent.

Exit codes: 0 stopped, 3 a bad fleet file or a missing token, 4 another agent holds this
node's state folder (nothing touched).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from pathlib import Path

from console.commands.base import (
    EXIT_CONFIG,
    EXIT_LOCKED,
    Command,
    default_fleet,
    split_listen,
)
from console.core.config.load import Fleet, load_fleet, parse_fleet
from console.core.safetext import say


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fleet", default=None, help="fleet file (default $ENGINEROOM_FLEET or ./fleet.toml)"
    )
    parser.add_argument(
        "--node", default=None, help="this node's name in the fleet file (default: the host name)"
    )
    parser.add_argument("--listen", type=split_listen, default=None, metavar="HOST:PORT")
    parser.add_argument("--once", action="store_true", help="take one snapshot and exit")
    parser.add_argument("--json", action="store_true", help="with --once: print it as JSON")


def _load(args: argparse.Namespace) -> tuple[Fleet, str]:
    path = args.fleet or default_fleet()
    node = args.node or socket.gethostname()
    if args.fleet is None and args.once and not Path(path).exists():
        # Agentless use over SSH: a host without a fleet file still reports itself.
        text = (
            f'[fleet]\nname = "adhoc"\n[[nodes]]\nname = "{node}"\n'
            f'agent = "http://127.0.0.1:9410"\n'
        )
        return parse_fleet(text, Path("<no fleet file>")), node
    return load_fleet(path), node


def run(args: argparse.Namespace) -> int:
    from console.agent.snapshot.node import NodeAgent

    fleet, node = _load(args)
    if args.once:
        return asyncio.run(_once(fleet, node, as_json=args.json))

    import uvicorn

    from console.agent.api.app import create_app
    from console.agent.api.auth import TokenError, Tokens

    settings = fleet.agent
    try:
        tokens = Tokens.from_env(settings.viewer_token_env, settings.operator_token_env)
    except TokenError as exc:
        print(f"engineroom agent: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    host, port = args.listen or split_listen(settings.listen)
    from console.agent.jobs.runner import JobRunner
    from console.agent.jobs.statelock import StateLocked

    agent = NodeAgent(fleet, node)
    try:
        # The state folder's lock comes first: a second agent touches no job or engine.
        runner = JobRunner.open(agent)
    except StateLocked as exc:
        agent.gpu.close()
        print(f"engineroom agent: {exc}", file=sys.stderr)
        return EXIT_LOCKED
    app = create_app(agent, tokens, runner=runner)
    print(
        f"engineroom agent: node {node!r} serving on http://{host}:{port} "
        f"(gpu: {agent.gpu.status})",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        # uvicorn answers 503 once open connections reach its limit, counting the new one.
        limit_concurrency=settings.max_connections + 1,
    )
    return 0


async def _once(fleet: Fleet, node: str, *, as_json: bool) -> int:
    from console.agent.snapshot.node import NodeAgent

    agent = NodeAgent(fleet, node)
    try:
        await asyncio.sleep(0.2)  # lets the host CPU percentage span a real interval
        snap = await agent.cycle()
    finally:
        await agent.close()
    if as_json:
        print(snap.model_dump_json(indent=2))
    else:
        from console.agent.snapshot.summary import summarize

        say(summarize(snap), lines=True)  # versions, model names: the engines' answers
    return 0


COMMAND = Command("agent", "run the node agent", add_arguments, run)
