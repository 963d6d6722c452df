"""What a screen may use of the console it runs in: ConsoleHost.

Screens see this narrow protocol, never EngineroomApp: the app imports the screens, the
screens import only this, so the app can change without its screens going round in a
circle through it (issue 29). EngineroomApp (console/tui/app.py, which holds the workflows
and opens this door to them) is checked against it by mypy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar, cast

from textual.message_pump import MessagePump

from console.collect.actions import AgentActions
from console.collect.alerts import EventLog
from console.collect.gateway_view import GatewayView
from console.collect.operator_actions import GatewayActions
from console.collect.source import FleetSource
from console.collect.view import FleetView, ViewBuilder
from console.core.config import Fleet
from console.tui.diagnosing import ConsoleDiagnoses

T = TypeVar("T")


class ConsoleHost(Protocol):
    """The console's state and moves, as screens read and call them. Read-only here: a
    screen asks, the app changes its own state."""

    # -- what the console holds ----------------------------------------------------------

    @property
    def fleet(self) -> Fleet: ...
    @property
    def collector(self) -> FleetSource: ...  # the agents, Prometheus or a recording
    @property
    def view(self) -> FleetView | None: ...  # the last view built; None before the first
    @property
    def views(self) -> ViewBuilder: ...
    @property
    def events(self) -> EventLog: ...
    @property
    def gateway_actions(self) -> GatewayActions: ...
    @property
    def diagnoses(self) -> ConsoleDiagnoses: ...  # the named problems, as of the last view
    @property
    def gateway(self) -> GatewayView | None: ...  # its snapshot (console.collect.gateway_view)
    @property
    def gateway_error(self) -> str | None: ...
    @property
    def gateway_role(self) -> str | None: ...
    @property
    def read_only(self) -> bool: ...
    @property
    def offline(self) -> bool: ...  # a replay: no agent or gateway is asked
    @property
    def simulated(self) -> bool: ...
    @property
    def refresh_s(self) -> float: ...
    @property
    def redraw_s(self) -> float | None: ...

    # -- what the header says ------------------------------------------------------------

    def replay_label(self) -> str | None: ...
    def source_problem(self) -> str | None: ...
    def source_note(self) -> str | None: ...

    # -- where a screen goes ---------------------------------------------------------------

    def open_node(self, name: str) -> None: ...
    def open_model(self, name: str) -> None: ...
    def open_engine(self, node: str, engine_id: str) -> None: ...
    def open_job(self, node: str, job_id: str) -> None: ...
    def open_playbook(self, model: str) -> None: ...

    # -- the workflows (console/tui/workflows.py) ------------------------------------------

    def action_blocked(self, node: str) -> str | None: ...
    def agent_client(self, node: str) -> AgentActions: ...  # the caller closes it
    async def agent_call(
        self, node: str, call: Callable[[AgentActions], Awaitable[T]], title: str = "refused"
    ) -> T | None: ...
    def confirm(self, title: str, body: str, yes: str, then: Callable[[], object]) -> None: ...
    def run_drill(self, name: str, *, started: Callable[[], object] | None = None) -> None: ...
    def stop_engine(
        self,
        node: str,
        engine_id: str,
        restart: bool = False,
        *,
        started: Callable[[], object] | None = None,
    ) -> None: ...
    def fail_over(
        self,
        model: str,
        target: str | None = None,
        source: str | None = None,
        *,
        mode: str = "planned",
        reason: str | None = None,
    ) -> None: ...
    def steer_rollout(
        self, rollout_id: str, verb: str, label: str, *, done: Callable[[], object] | None = None
    ) -> None: ...
    def start_vllm(
        self,
        node: str | None = None,
        model: str | None = None,
        then_fail_over: bool = False,
        *,
        profile: str | None = None,
        started: Callable[[], object] | None = None,
    ) -> None: ...


def host_of(node: MessagePump) -> ConsoleHost:
    """The console a screen runs in. Every console app is an EngineroomApp, which mypy
    checks against ConsoleHost (console/tui/app.py)."""
    return cast(ConsoleHost, node.app)
