"""The consoles that may not act, and how they say so: the web view and replay.

Every key, command and workflow that would change the fleet (start, stop, restart, fail
over, drill, the playbook, cancel a job, pause, resume or abort a rollout) answers with a
notification naming what was refused, before any client is made: nothing is silent, and
nothing reaches an agent or the gateway. (A console started `--read-only`, or holding a
viewer token, disables the same actions up front through `action_blocked`,
console/tui/workflows.py.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from textual.actions import ActionParseResult, parse
from textual.dom import DOMNode

from console.collect.clients.actions import AgentActions
from console.collect.clients.gateway_client import GatewayClient
from console.core.config.load import Fleet
from console.tui.app import EngineroomApp

T = TypeVar("T")

# The actions behind the keys that change the fleet, and what a refusal calls them.
ACTING = {
    "start_vllm": "starting vLLM",
    "start": "starting vLLM",
    "stop_engine": "stopping an engine",
    "restart_engine": "restarting an engine",
    "fail_over": "failing over",
    "quarantine": "quarantining a deployment",
    "run_drill": "running a drill",
    "playbook": "the incident playbook",
    "next_step": "the incident playbook",
    "cancel_job": "cancelling a job",
    "pause_rollout": "pausing a rollout",
    "resume_rollout": "resuming a rollout",
    "abort_rollout": "aborting a rollout",
}


class RefusingApp(EngineroomApp):
    """EngineroomApp, read-only, where every acting key, command and workflow is refused
    with REFUSAL (naming what was asked); `refused` lists what was (tests read it)."""

    REFUSAL = "read-only: {what} is disabled"  # subclasses say why, and where to act
    REFUSAL_TITLE: str | None = None

    def __init__(self, fleet: Fleet, **kwargs: Any) -> None:
        super().__init__(fleet, read_only=True, **kwargs)
        self.refused: list[str] = []

    def refuse(self, what: str) -> None:
        self.refused.append(what)
        self.notify(
            self.REFUSAL.format(what=what), title=self.REFUSAL_TITLE or "", severity="warning"
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

    def stop_engine(
        self,
        node: str,
        engine_id: str,
        restart: bool = False,
        *,
        started: Callable[[], object] | None = None,
    ) -> None:
        self.refuse(ACTING["restart_engine" if restart else "stop_engine"])

    def fail_over(
        self,
        model: str,
        target: str | None = None,
        source: str | None = None,
        *,
        mode: str = "planned",
        reason: str | None = None,
    ) -> None:
        self.refuse(ACTING["fail_over"])

    def run_drill(self, name: str, *, started: Callable[[], object] | None = None) -> None:
        self.refuse(ACTING["run_drill"])

    def steer_rollout(
        self, rollout_id: str, verb: str, label: str, *, done: Callable[[], object] | None = None
    ) -> None:
        self.refuse(ACTING[f"{verb}_rollout"])

    def open_playbook(self, model: str) -> None:
        self.refuse(ACTING["playbook"])

    async def agent_call(
        self, node: str, call: Callable[[AgentActions], Awaitable[T]], title: str = "refused"
    ) -> T | None:
        # The one way the console's workflows reach an agent: closed here.
        self.refuse(f"a call to {node}'s agent ({title})")
        return None

    async def gateway_call(
        self,
        call: Callable[[GatewayClient], Awaitable[T]],
        title: str = "refused",
        *,
        timeout: float = 5.0,
        reads: bool = False,
        failed: Callable[[str], object] | None = None,
    ) -> T | None:
        # The one way screens reach the gateway: its reads pass (the Rollouts screen's),
        # what acts is closed here.
        if reads:
            return await super().gateway_call(call, title, timeout=timeout, failed=failed,
                                              reads=True)  # fmt: skip
        self.refuse(f"a call to the gateway ({title})")
        return None
