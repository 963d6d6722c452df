"""`engineroom serve --web [--listen HOST:PORT] [--token-env NAME] [--max-sessions N]`: the
console as a read-only web page (docs/web.md). Textual is imported only here, when the
verb runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from console.commands.base import EXIT_CONFIG, Command, default_fleet, fleet_arg, split_listen
from console.core.config.load import load_fleet


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fleet_arg(parser)
    parser.add_argument("--web", action="store_true", required=True, help="as a web page")
    parser.add_argument(
        "--listen", type=split_listen, default=None, metavar="HOST:PORT", help="127.0.0.1:9430"
    )
    parser.add_argument(
        "--token-env",
        default="ENGINEROOM_WEB_TOKEN",
        metavar="NAME",
        help="the variable that holds the bearer token (default ENGINEROOM_WEB_TOKEN)",
    )
    parser.add_argument(
        "--max-sessions", type=int, default=8, metavar="N", help="browser tabs at once (8)"
    )


def run(args: argparse.Namespace) -> int:
    from console.tui.web import serve as web

    path = Path(args.fleet or default_fleet()).resolve()
    try:
        token = web.read_token(args.token_env)
    except web.WebConfigError as exc:
        print(f"engineroom serve: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    host, port = args.listen or split_listen(web.DEFAULT_LISTEN)
    settings = web.WebSettings(
        load_fleet(path), path, token, args.token_env, host, port, max(1, args.max_sessions)
    )
    return web.run_web(settings)


COMMAND = Command("serve", "the console as a read-only web page (docs/web.md)", add_arguments, run)
