"""The console as `engineroom serve --web` runs it, one process per browser session.

It is the ordinary console, read-only, with one difference an incident bridge needs:
an action key does not stay silent, it answers "read-only view" so whoever pressed it
knows why nothing happened. Every move that changes the fleet (start, stop, restart,
fail over, drill, the playbook, cancel a job) is refused here before any client is made;
console/tui/webserve.py also hands this process no token that could act (docs/web.md).

    python -m console.tui.web --fleet PATH     (console/tui/webserve.py starts it; not for people)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from textual.actions import ActionParseResult, parse
from textual.app import SystemCommand
from textual.dom import DOMNode
from textual.screen import Screen

from console.collect.actions import AgentActions
from console.core.config import ConfigError, Fleet, load_fleet
from console.tui.app import EngineroomApp

T = TypeVar("T")

READ_ONLY = "read-only view"

# The actions behind the keys that change the fleet, and what the refusal calls them.
ACTING = {
    "start_vllm": "starting vLLM",
    "start": "starting vLLM",
    "stop_engine": "stopping an engine",
    "restart_engine": "restarting an engine",
    "fail_over": "failing over",
    "run_drill": "running a drill",
    "playbook": "the incident playbook",
    "next_step": "the incident playbook",
    "cancel_job": "cancelling a job",
}


class WebViewApp(EngineroomApp):
    """EngineroomApp, read-only, where every acting key and command answers READ_ONLY."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(fleet, read_only=True)
        self.refused: list[str] = []  # what was asked of this view and refused (tests read it)

    def refuse(self, what: str) -> None:
        self.refused.append(what)
        self.notify(
            f"{READ_ONLY}: {what} is disabled here; act from the console over SSH",
            title=READ_ONLY,
            severity="warning",
        )

    async def run_action(
        self,
        action: str | ActionParseResult,
        default_namespace: DOMNode | None = None,
        namespaces: object = None,
    ) -> bool:
        # Before Textual's check_action: a disabled binding would otherwise swallow the key.
        name = (parse(action) if isinstance(action, str) else action)[1]
        if name in ACTING:
            self.refuse(ACTING[name])
            return True
        return await super().run_action(action, default_namespace, namespaces)  # type: ignore[arg-type]

    # The workflows, whatever reaches them (the command line's :start, a screen's method).
    def start_vllm(self, *args: object, **kwargs: object) -> None:
        self.refuse(ACTING["start_vllm"])

    def stop_engine(self, node: str, engine_id: str, restart: bool = False) -> None:
        self.refuse(ACTING["restart_engine" if restart else "stop_engine"])

    def fail_over(self, model: str) -> None:
        self.refuse(ACTING["fail_over"])

    def run_drill(self, name: str) -> None:
        self.refuse(ACTING["run_drill"])

    def open_playbook(self, model: str) -> None:
        self.refuse(ACTING["playbook"])

    async def agent_call(
        self, node: str, call: Callable[[AgentActions], Awaitable[T]], title: str = "refused"
    ) -> T | None:
        # The one way the console's workflows reach an agent: closed here.
        self.refuse(f"a call to {node}'s agent ({title})")
        return None

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        # Textual's screenshot delivers a file through a download route this server lacks.
        for command in super().get_system_commands(screen):
            if command.title != "Screenshot":
                yield command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="console.tui.web", description=__doc__.splitlines()[0])
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
