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

from console.collect.clients.actions import AgentActions
from console.collect.clients.gateway_client import GatewayClient
from console.collect.sources.source import FleetSource
from console.core.config.load import Fleet
from console.core.diagnosis import Move

T = TypeVar("T")


class ConsoleHost(Protocol):
    """What the console is and the moves it makes, as screens call them. Never what to
    draw: that comes handed to the screen, one ViewBuilt a view (console/tui/built.py)."""

    # -- what the console is (what it shows comes in ViewBuilt: console/tui/built.py) -----

    @property
    def fleet(self) -> Fleet: ...
    @property
    def collector(self) -> FleetSource: ...  # to ask: Prometheus' history, a replay's records
    @property
    def gateway_role(self) -> str | None: ...  # what our gateway token may do, once it said
    @property
    def read_only(self) -> bool: ...
    @property
    def offline(self) -> bool: ...  # a replay: no agent or gateway is asked
    @property
    def refresh_s(self) -> float: ...

    # -- where a screen goes ---------------------------------------------------------------

    def open_node(self, name: str) -> None: ...
    def open_model(self, name: str) -> None: ...
    def open_engine(self, node: str, engine_id: str) -> None: ...
    def open_job(self, node: str, job_id: str) -> None: ...
    def open_playbook(self, model: str) -> None: ...

    # -- the moves ---------------------------------------------------------------------------

    def diagnosis_moved(self, key: tuple[str, str], move: Move) -> None: ...

    # -- the workflows (console/tui/workflows.py) ------------------------------------------

    def action_blocked(self, node: str) -> str | None: ...
    def agent_client(self, node: str) -> AgentActions: ...  # the caller closes it
    async def agent_call(
        self, node: str, call: Callable[[AgentActions], Awaitable[T]], title: str = "refused"
    ) -> T | None: ...
    async def gateway_call(
        self,
        call: Callable[[GatewayClient], Awaitable[T]],
        title: str = "refused",
        *,
        timeout: float = 5.0,
        reads: bool = False,
        failed: Callable[[str], object] | None = None,
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
