"""engineroom's command line: argument parsing, then a call into the packages.

Every command takes --fleet PATH (default $ENGINEROOM_FLEET, else ./fleet.toml). A bad
fleet file prints its one-line error and exits 3 before anything starts.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
import time
from pathlib import Path

from console.core.config import ConfigError, Fleet, load_fleet, parse_fleet
from console.core.safetext import say

EXIT_USAGE = 2  # argparse's own code for a bad command line
EXIT_CONFIG = 3  # a bad fleet file or a missing secret: nothing started
EXIT_LOCKED = 4  # agent: another agent holds this node's state folder; nothing touched


def _default_fleet() -> str:
    return os.environ.get("ENGINEROOM_FLEET", "fleet.toml")


def _split_listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not port.isdigit():
        raise argparse.ArgumentTypeError(f"--listen wants HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="engineroom", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")

    agent = sub.add_parser("agent", help="run the node agent")
    agent.add_argument(
        "--fleet", default=None, help="fleet file (default $ENGINEROOM_FLEET or ./fleet.toml)"
    )
    agent.add_argument(
        "--node", default=None, help="this node's name in the fleet file (default: the host name)"
    )
    agent.add_argument("--listen", type=_split_listen, default=None, metavar="HOST:PORT")
    agent.add_argument("--once", action="store_true", help="take one snapshot and exit")
    agent.add_argument("--json", action="store_true", help="with --once: print it as JSON")

    demo = sub.add_parser("demo", help="the console on a simulated local fleet")
    demo.add_argument(
        "--no-tui",
        action="store_true",
        help="keep the simulated fleet running without the TUI; prints 'fleet: PATH' first",
    )
    demo.add_argument("--nodes", type=int, default=4)

    tui = sub.add_parser("tui", help="the console (the default command)")
    _fleet_arg(tui)
    tui.add_argument("--read-only", action="store_true", help="disable every action")
    tui.add_argument("--record", default=None, metavar="FILE", help="record what it sees")
    tui.add_argument(
        "--slow-link",
        action="store_true",
        help="for a slow SSH link: redraw every 5 s, no animation, no mouse (docs/scale.md)",
    )

    record = sub.add_parser("record", help="record the fleet headless (docs/recording.md)")
    _fleet_arg(record)
    record.add_argument("--out", default=None, help="the recording (default: a dated name)")
    record.add_argument("--for", dest="for_", default=None, metavar="DURATION",
                        help="stop after it: 90s, 30m, 8h (default: until SIGTERM)")  # fmt: skip
    replay = sub.add_parser("replay", help="the console on a recording, read-only")
    replay.add_argument("file")
    replay.add_argument("--at", default=None, help="start at this time (HH:MM:SS UTC, +MM:SS)")
    timeline = sub.add_parser("timeline", help="a recording's incident timeline")
    timeline.add_argument("file")
    timeline.add_argument("--from", dest="from_", default=None, metavar="T")
    timeline.add_argument("--to", default=None, metavar="T")
    shape = timeline.add_mutually_exclusive_group()
    shape.add_argument("--markdown", action="store_true", help="for the postmortem (default)")
    shape.add_argument("--json", action="store_true")

    check = sub.add_parser(
        "check", help="poll the fleet once: 0 healthy, 1 degraded, 2 unreachable"
    )
    _fleet_arg(check)
    check.add_argument("--json", action="store_true", help="stable JSON (docs/check-json.md)")
    check.add_argument(
        "--prometheus", action="store_true", help="Prometheus text (node up, alerts, status)"
    )
    check.add_argument(
        "--watch",
        type=float,
        default=None,
        metavar="N",
        help="print a fresh table every N seconds, without a TUI",
    )

    vllm = sub.add_parser("vllm", help="start, stop or restart a vLLM server on a node (a job)")
    verbs = vllm.add_subparsers(dest="verb", required=True)
    start = verbs.add_parser("start", help="start a launch profile")
    start.add_argument("--profile", required=True)
    start.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override the profile allows (port=8002, gpus=[1], args.max_model_len=4096)",
    )
    for verb in ("stop", "restart"):
        action = verbs.add_parser(verb, help=f"{verb} an engine (drains in-flight requests)")
        action.add_argument("--engine", required=True, help="engine id, as in the snapshot")
    for action in verbs.choices.values():
        _fleet_arg(action)
        action.add_argument("--node", required=True)
        action.add_argument("--wait", action="store_true", help="follow the job to its end")
        action.add_argument("--json", action="store_true", help="print the job as JSON")

    gateway = sub.add_parser("gateway", help="run the OpenAI gateway in front of the fleet")
    _fleet_arg(gateway)
    gateway.add_argument("--listen", type=_split_listen, default=None, metavar="HOST:PORT")

    failover = sub.add_parser(
        "failover",
        help="move a model's traffic: all to one deployment, drain one, restore earlier weights",
        description="One move of a model's weights, run as a job on the gateway: --to X "
        "(all to X; a fail-back when it undoes the last move), --drain D (D's weight to the "
        "others in proportion, or to --to), or --restore-before JOB (docs/gateway.md).",
    )
    _fleet_arg(failover)
    failover.add_argument("model")
    failover.add_argument(
        "--to", metavar="DEPLOYMENT", help="all of the model there (with --drain: D's weight)"
    )
    move = failover.add_mutually_exclusive_group()
    move.add_argument(
        "--drain", metavar="DEPLOYMENT", help="its weight to 0, spread over the others"
    )
    move.add_argument(
        "--restore-before", metavar="JOB", help="the weights from before that gateway job"
    )
    failover.add_argument("--emergency", action="store_true", help="all weight at once")
    failover.add_argument(
        "--plan", action="store_true", help="show the weights before and after and the "
        "preflight; start nothing",
    )  # fmt: skip
    failover.add_argument("--why", default="", help="recorded in the audit log")
    failover.add_argument("--wait", action="store_true", help="follow the job to its end")
    failover.add_argument("--json", action="store_true")

    haproxy = sub.add_parser("haproxy", help="HAProxy as a model's data plane (docs/haproxy.md)")
    hverbs = haproxy.add_subparsers(dest="verb", required=True)
    for verb, what in (
        ("render", "write its configuration for the models that name it"),
        ("adopt", "check that an existing configuration has the backends and servers named"),
    ):
        hverb = hverbs.add_parser(verb, help=what)
        _fleet_arg(hverb)
        hverb.add_argument("--dataplane", help="its [[dataplanes]] name (default: the only one)")
        if verb == "render":
            hverb.add_argument("--out", help="where to write (default: the data plane's config)")

    drill = sub.add_parser("drill", help="TensorRT-LLM rebuild drills")
    drills = drill.add_subparsers(dest="verb", required=True)
    run = drills.add_parser("run", help="run a drill on its node's agent (a job)")
    run.add_argument("name")
    run.add_argument("--wait", action="store_true", help="follow the job to its end")
    run.add_argument("--json", action="store_true", help="print the job as JSON")
    listed = drills.add_parser("list", help="the drills in the fleet file, and their history")
    listed.add_argument("--json", action="store_true")
    show = drills.add_parser("show", help="a drill's report (Markdown, or --json)")
    show.add_argument("id", help="the drill's job id")
    show.add_argument("--node", default=None, help="the node that ran it (default: ask all)")
    show.add_argument("--markdown", action="store_true", help="Markdown (the default)")
    show.add_argument("--json", action="store_true")
    whatif = drills.add_parser(
        "what-if", help="which TensorRT-LLM engines an upgrade would make stale"
    )
    for flag in ("driver", "cuda", "tensorrt", "tensorrt-llm", "gpu", "compute-capability"):
        whatif.add_argument(f"--{flag}", default=None, metavar="VERSION")
    whatif.add_argument("--json", action="store_true")
    for action in drills.choices.values():
        _fleet_arg(action)

    rules = sub.add_parser("rules", help="Prometheus alerting rules (docs/prometheus.md)")
    _fleet_arg(rules)
    rules.add_argument("--out", default=None, metavar="FILE", help="write here, not stdout")

    jobs = sub.add_parser("jobs", help="the jobs of every agent, newest first")
    _fleet_arg(jobs)
    jobs.add_argument("--node", default=None)
    jobs.add_argument("--json", action="store_true")

    serve = sub.add_parser("serve", help="the console as a read-only web page (docs/web.md)")
    _fleet_arg(serve)
    serve.add_argument("--web", action="store_true", required=True, help="as a web page")
    serve.add_argument(
        "--listen", type=_split_listen, default=None, metavar="HOST:PORT", help="127.0.0.1:9430"
    )
    serve.add_argument(
        "--token-env",
        default="ENGINEROOM_WEB_TOKEN",
        metavar="NAME",
        help="the variable that holds the bearer token (default ENGINEROOM_WEB_TOKEN)",
    )
    serve.add_argument(
        "--max-sessions", type=int, default=8, metavar="N", help="browser tabs at once (8)"
    )
    return parser


def _fleet_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fleet", default=None, help="fleet file (default $ENGINEROOM_FLEET or ./fleet.toml)"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["tui", *argv]  # `engineroom [--fleet F]` opens the console
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    try:
        if args.command == "agent":
            return _agent(args)
        if args.command == "demo":
            from console.demo import run_demo

            return run_demo(no_tui=args.no_tui, nodes=args.nodes)
        if args.command == "check":
            from console.collect.check import run_check

            fleet = load_fleet(args.fleet or _default_fleet())
            return run_check(fleet, as_json=args.json, watch=args.watch, prometheus=args.prometheus)
        if args.command == "vllm":
            from console.collect.actions import run_vllm

            return run_vllm(
                load_fleet(args.fleet or _default_fleet()),
                args.verb,
                args.node,
                profile=getattr(args, "profile", None),
                engine=getattr(args, "engine", None),
                sets=getattr(args, "set", None),
                wait=args.wait,
                as_json=args.json,
            )
        if args.command == "gateway":
            from console.gateway.server import run_gateway

            return run_gateway(args.fleet or _default_fleet(), args.listen)
        if args.command == "failover":
            from console.collect.failover_cli import Ask, run_failover

            no_move = args.to is None and args.drain is None and args.restore_before is None
            if no_move and not args.plan:
                print("engineroom failover: name the move: --to, --drain or --restore-before "
                      "(--plan alone proposes the healthiest --to)", file=sys.stderr)  # fmt: skip
                return 2
            if args.restore_before is not None and args.to is not None:
                print("engineroom failover: --restore-before takes no --to", file=sys.stderr)
                return 2
            return run_failover(
                load_fleet(args.fleet or _default_fleet()),
                Ask(args.model, args.to, args.drain, args.restore_before),
                emergency=args.emergency,
                why=args.why,
                wait=args.wait,
                as_json=args.json,
                plan=args.plan,
            )
        if args.command == "haproxy":
            from console.gateway.haproxy_config import run_cli

            fleet = load_fleet(args.fleet or _default_fleet())
            return run_cli(fleet, args.verb, args.dataplane, getattr(args, "out", None))
        if args.command == "drill":
            from console.collect import drill_cli

            fleet = load_fleet(args.fleet or _default_fleet())
            if args.verb == "run":
                return drill_cli.run_drill(fleet, args.name, wait=args.wait, as_json=args.json)
            if args.verb == "list":
                return drill_cli.list_drills(fleet, as_json=args.json)
            if args.verb == "show":
                return drill_cli.show_drill(fleet, args.id, node=args.node, as_json=args.json)
            change = {
                key: getattr(args, key)
                for key in (
                    "driver",
                    "cuda",
                    "tensorrt",
                    "tensorrt_llm",
                    "gpu",
                    "compute_capability",
                )
            }
            return drill_cli.what_if(fleet, change, as_json=args.json)
        if args.command == "rules":
            from console.collect.rules import run_rules

            return run_rules(load_fleet(args.fleet or _default_fleet()), args.out)
        if args.command == "jobs":
            from console.collect.actions import run_jobs

            return run_jobs(
                load_fleet(args.fleet or _default_fleet()), args.node, as_json=args.json
            )
        if args.command == "serve":
            return _serve(args)
        if args.command == "tui":
            from console.tui.app import run_tui

            return run_tui(
                load_fleet(args.fleet or _default_fleet()),
                read_only=args.read_only,
                record=args.record,
                slow_link=args.slow_link,
            )
        if args.command in ("record", "replay", "timeline"):
            return _recordings(args)
    except ConfigError as exc:
        say(f"engineroom: {exc}", sys.stderr)  # it may quote a value from outside
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return 130
    build_parser().print_help()
    return EXIT_USAGE


def _serve(args: argparse.Namespace) -> int:
    from console.tui import webserve as web

    path = Path(args.fleet or _default_fleet()).resolve()
    try:
        token = web.read_token(args.token_env)
    except web.WebConfigError as exc:
        print(f"engineroom serve: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    host, port = args.listen or _split_listen(web.DEFAULT_LISTEN)
    settings = web.WebSettings(
        load_fleet(path), path, token, args.token_env, host, port, max(1, args.max_sessions)
    )
    return web.run_web(settings)


def _recordings(args: argparse.Namespace) -> int:
    """record, replay, timeline (docs/recording.md); a file that is not a recording, or a
    bad duration or time, is one line naming it, exit 2."""
    from console.collect.recording import RecordingError
    from console.collect.timeline import parse_duration, run_timeline

    try:
        if args.command == "record":
            from console.collect.recorder import record

            fleet = load_fleet(args.fleet or _default_fleet())
            for_s = None if args.for_ is None else parse_duration(args.for_)
            out = args.out or time.strftime("engineroom-%Y%m%d-%H%M%S.rec", time.gmtime())
            return asyncio.run(record(fleet, out, for_s))
        if args.command == "replay":
            from console.tui.replay import run_replay

            return run_replay(args.file, args.at)
        return run_timeline(args.file, args.from_, args.to, as_json=args.json)
    except (RecordingError, ValueError, OSError) as exc:
        say(f"engineroom {args.command}: {exc}", sys.stderr)  # a recording is outside text
        return EXIT_USAGE


def _load_for_agent(args: argparse.Namespace) -> tuple[Fleet, str]:
    path = args.fleet or _default_fleet()
    node = args.node or socket.gethostname()
    if args.fleet is None and args.once and not Path(path).exists():
        # Agentless use over SSH: a host without a fleet file still reports itself.
        text = (
            f'[fleet]\nname = "adhoc"\n[[nodes]]\nname = "{node}"\n'
            f'agent = "http://127.0.0.1:9410"\n'
        )
        return parse_fleet(text, Path("<no fleet file>")), node
    return load_fleet(path), node


def _agent(args: argparse.Namespace) -> int:
    from console.agent.node import NodeAgent

    fleet, node = _load_for_agent(args)
    if args.once:
        return asyncio.run(_agent_once(fleet, node, as_json=args.json))

    import uvicorn

    from console.agent.app import create_app
    from console.agent.auth import TokenError, Tokens

    settings = fleet.agent
    try:
        tokens = Tokens.from_env(settings.viewer_token_env, settings.operator_token_env)
    except TokenError as exc:
        print(f"engineroom agent: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    host, port = args.listen or _split_listen(settings.listen)
    from console.agent.jobs import JobRunner
    from console.agent.statelock import StateLocked

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


async def _agent_once(fleet: Fleet, node: str, *, as_json: bool) -> int:
    from console.agent.node import NodeAgent

    agent = NodeAgent(fleet, node)
    try:
        await asyncio.sleep(0.2)  # lets the host CPU percentage span a real interval
        snap = await agent.cycle()
    finally:
        await agent.close()
    if as_json:
        print(snap.model_dump_json(indent=2))
    else:
        from console.agent.summary import summarize

        say(summarize(snap), lines=True)  # versions, model names: the engines' answers
    return 0


if __name__ == "__main__":
    sys.exit(main())
