"""The console as `engineroom serve --web` runs it, one process per browser session.

It is the ordinary console, read-only, with one difference an incident bridge needs:
an action key does not stay silent, it answers "read-only view" so whoever pressed it
knows why nothing happened. Every move that changes the fleet (start, stop, restart,
fail over, drill, the playbook, cancel a job) is refused here before any client is made;
console/tui/web/serve.py also hands this process no token that could act (docs/web.md).

    python -m console.tui.web.session --fleet PATH   (web/serve.py starts it; not for people)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

from textual.app import SystemCommand
from textual.screen import Screen

from console.core.config.load import ConfigError, load_fleet
from console.tui.readonly import RefusingApp

READ_ONLY = "read-only view"


class WebViewApp(RefusingApp):
    """The console, read-only, where every acting key and command answers READ_ONLY."""

    REFUSAL = READ_ONLY + ": {what} is disabled here; act from the console over SSH"
    REFUSAL_TITLE = READ_ONLY

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        # Textual's screenshot delivers a file through a download route this server lacks.
        for command in super().get_system_commands(screen):
            if command.title != "Screenshot":
                yield command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="console.tui.web.session", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--fleet", required=True)
    args = parser.parse_args(argv)
    try:
        fleet = load_fleet(args.fleet)
    except ConfigError as exc:
        print(f"engineroom web view: {exc}", file=sys.stderr)
        return 3
    return WebViewApp(fleet).run() or 0


if __name__ == "__main__":
    sys.exit(main())
