"""What the console does: open the screen the operator names (a node, a model, an engine,
a job, a playbook), and act on the fleet: run a drill, fail a model over, start vLLM (and
the standby hand-off back to the failover plan), stop or restart an engine.

Every workflow names its target and asks first; the agent or the gateway decides. The
agent call every one of them makes is written once (`agent_call`: call, say what failed;
`act`: and open the job). EngineroomApp holds one Workflows and hands screens its moves
through ConsoleHost (console/tui/host.py); the workflows see the app only as a Console.
"""

from __future__ import annotations

import getpass
from collections.abc import Awaitable, Callable, Coroutine
from functools import wraps
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from textual.notifications import SeverityLevel
from textual.screen import Screen

from console.collect.clients.actions import ActionError, AgentActions
from console.collect.clients.gateway_client import GatewayClient, GatewayError
from console.collect.sources.source import FleetSource
from console.collect.views.view import FleetView
from console.core.config.load import ConfigError, Fleet
from console.core.gateway_wire import MAX_WHY
from console.core.snapshot import Job
from console.tui.screens.drills import PlaybookScreen
from console.tui.screens.engine import EngineScreen
from console.tui.screens.failover import FailoverScreen
from console.tui.screens.jobs import JobScreen, StartVllmScreen
from console.tui.screens.model_detail import ModelDetailScreen
from console.tui.screens.node import NodeScreen
from console.tui.widgets.confirm import ConfirmScreen, WhyConfirmScreen

T = TypeVar("T")
# The why the gateway's audit records when the operator types none in the confirmation.
STEER_WHY = "from the console's Rollouts screen"
R = TypeVar("R")
P = ParamSpec("P")


class Console(Protocol):
    """What the workflows use of the console that holds them (EngineroomApp)."""

    fleet: Fleet
    read_only: bool
    collector: FleetSource
    view: FleetView | None  # the last view built
    roles: dict[str, str]  # node -> the role its token has on the agent
    gateway_role: str | None  # the role our token has on the gateway, once it said
    workflows: Workflows  # the one it holds

    def notify(self, message: str, *, title: str = ..., severity: SeverityLevel = ...,
               timeout: float | None = ...) -> None: ...  # fmt: skip
    def push_screen(
        self, screen: Screen[R], callback: Callable[[R | None], None] | None = None, /
    ) -> object: ...
    def run_worker(self, work: Coroutine[Any, Any, None], *, group: str) -> object: ...


class Workflows:
    """Where a screen goes and what the operator does, held by EngineroomApp (which opens
    each to screens through `delegate`): every move asks first, and says what it refused or
    what failed through the console's notify."""

    def __init__(self, console: Console) -> None:
        self.console = console

    # -- where a screen goes -------------------------------------------------------------

    def open_node(self, name: str) -> None:
        if name not in self.console.collector.states:
            self.console.notify(f"no node named {name!r}", severity="error")
            return
        self.console.push_screen(NodeScreen(name))

    def open_model(self, name: str) -> None:
        if self.console.view is not None and name not in self.console.view.models:
            self.console.notify(f"no model named {name!r}", severity="error")
            return
        self.console.push_screen(ModelDetailScreen(name))

    def open_engine(self, node: str, engine_id: str) -> None:
        state = self.console.collector.states.get(node)
        if state is None:
            self.console.notify(f"no node named {node!r}", severity="error")
            return
        snapshot = state.snapshot
        if snapshot is not None and all(e.id != engine_id for e in snapshot.engines):
            ids = " ".join(e.id for e in snapshot.engines) or "none"
            self.console.notify(
                f"no engine {engine_id!r} on {node}; its engines: {ids}", severity="error"
            )
            return
        self.console.push_screen(EngineScreen(node, engine_id))

    def open_job(self, node: str, job_id: str) -> None:
        self.console.push_screen(JobScreen(node, job_id))

    def open_playbook(self, model: str) -> None:
        self.console.push_screen(PlaybookScreen(model))

    # -- the one shape of an agent call ------------------------------------------------

    def agent_client(self, node: str) -> AgentActions:
        """A client for `node`'s agent, the caller closes it: the one place the console
        makes one (agent_call's, and the screens' reads of jobs, logs and plans). Raises
        ConfigError or MissingSecret when `node` has no agent or its token is not set."""
        return AgentActions(self.console.fleet, node)

    async def agent_call(
        self, node: str, call: Callable[[AgentActions], Awaitable[T]], title: str = "refused"
    ) -> T | None:
        """`call` on `node`'s agent; a refusal or no answer is a notification, and None."""
        actions = self.agent_client(node)
        try:
            return await call(actions)
        except ActionError as exc:
            self.console.notify(str(exc), title=title, severity="error", timeout=15)
            return None
        finally:
            await actions.close()

    # -- the one shape of a gateway call ----------------------------------------------

    def gateway_client(self, timeout: float = 5.0) -> GatewayClient:
        """A client for the gateway's admin API, the caller closes it: the one place the
        console makes one (gateway_call's, and the app's poll). Raises ConfigError when no
        gateway is declared or its token is not set."""
        return GatewayClient(self.console.fleet, timeout=timeout)

    async def gateway_call(
        self,
        call: Callable[[GatewayClient], Awaitable[T]],
        title: str = "refused",
        *,
        timeout: float = 5.0,
        reads: bool = False,
        failed: Callable[[str], object] | None = None,
    ) -> T | None:
        """`call` on the gateway; a refusal, no answer or no token is a notification
        (`failed(why)` instead, for a screen that shows it in place), and None. `reads`:
        the call changes nothing (a read-only console lets only those through)."""
        try:
            client = self.gateway_client(timeout)
        except ConfigError as exc:  # its token gone from the environment meanwhile
            self._gateway_failed(str(exc), title, failed)
            return None
        try:
            return await call(client)
        except GatewayError as exc:
            self._gateway_failed(str(exc), title, failed)
            return None
        finally:
            await client.close()

    def _gateway_failed(self, why: str, title: str, failed: Callable[[str], object] | None) -> None:
        if failed is not None:
            failed(why)
        else:
            self.console.notify(why, title=title, severity="error", timeout=15)

    async def act(
        self,
        node: str,
        submit: Callable[[AgentActions], Awaitable[Job]],
        started: Callable[[], object] | None = None,
    ) -> None:
        """Submit a job to `node`'s agent and open it; `started` once the agent took it."""
        job = await self.agent_call(node, submit)
        if job is not None:
            if started is not None:
                started()
            self.open_job(node, job.id)

    def confirm(self, title: str, body: str, yes: str, then: Callable[[], object]) -> None:
        """Ask `title`; `then` runs only on a yes."""

        def answered(ok: bool | None) -> None:
            if ok:
                then()

        self.console.push_screen(ConfirmScreen(title, body, yes), answered)

    def action_blocked(self, node: str) -> str | None:
        """Why nothing may be started or stopped on `node` from here; None if it may."""
        if self.console.read_only:
            return "read-only console: starting and stopping engines is disabled"
        declared = next((n for n in self.console.fleet.nodes if n.name == node), None)
        state = self.console.collector.states.get(node)
        if declared is None and state is not None:  # found in Prometheus' series
            return f"{node} is read from Prometheus: actions need its agent in fleet.toml"
        if declared is None:
            return f"no node named {node!r}"
        if declared.agent is None:
            how = "over SSH" if declared.ssh else "from Prometheus"
            return f"{node} is read {how}: starting and stopping engines needs its agent"
        if state is not None and state.no_token:
            return f"no token for {node} ({state.error})"
        if self.console.roles.get(node) == "viewer":
            return f"the token for {node} is a viewer token: actions need an operator token"
        return None

    # -- the workflows -------------------------------------------------------------------

    def run_drill(self, name: str, *, started: Callable[[], object] | None = None) -> None:
        """Run a rebuild drill on its node's agent, after a confirmation naming it;
        `started` runs once the agent took the job (a diagnosis verifies the move)."""
        drill = self.console.fleet.drills.get(name)
        found = self.console.fleet.deployment(drill.deployment) if drill else None
        if drill is None or found is None:
            self.console.notify(f"no drill named {name!r}", severity="error")
            return
        node = found[1].node
        reason = self.action_blocked(node)
        if reason:
            self.console.notify(reason, severity="warning")
            return
        body = (
            f"Drill {name} rebuilds deployment {drill.deployment} ({drill.model}) on node "
            f"{node}: {drill.pipeline} pipeline, {drill.precision}.\n\n"
            "Preflight, convert, build into staging, validate against the vLLM baseline, "
            f"benchmark, then promote into {drill.engine_cache}"
            + (
                f" and re-point {found[1].engine_dir}"
                if found[1].engine_dir and drill.link_engine_dir
                else ""
            )
            + f". The candidate listens on port {drill.serve_port} while it runs."
        )
        self.confirm(
            f"Run drill {name} on {node}?",
            body,
            f"run drill {name}",
            lambda: self.console.run_worker(
                self.act(node, lambda a: a.drill(name), started), group="act"
            ),
        )

    def stop_engine(
        self,
        node: str,
        engine_id: str,
        restart: bool = False,
        *,
        started: Callable[[], object] | None = None,
    ) -> None:
        """Stop or restart an engine, once confirmed; `started` runs once its agent took
        the job (a diagnosis verifies the move from then)."""
        reason = self.action_blocked(node)
        if reason:
            self.console.notify(reason, severity="warning")
            return
        verb = "Restart" if restart else "Stop"
        body = (
            f"{verb} engine {engine_id} on node {node}.\n\n"
            "SIGTERM first: in-flight requests drain within the profile's stop grace, then "
            "SIGKILL." + ("\nThen it starts again from the same profile." if restart else "")
        )
        self.confirm(
            f"{verb} {engine_id} on {node}?",
            body,
            f"{verb.lower()} {engine_id}",
            lambda: self.console.run_worker(
                self.act(node, lambda a: a.stop(engine_id, restart), started), group="act"
            ),
        )

    def fail_over(
        self,
        model: str,
        target: str | None = None,
        source: str | None = None,
        *,
        mode: str = "planned",
        reason: str | None = None,
    ) -> None:
        """The failover plan for `model`, its target preselected when given (the
        playbook's step names one); with `source`, the plan drains it (onto `target` when
        given, else over the others): in a model with replicas, the move that takes one
        deployment's traffic off and leaves the others theirs. With `reason` (a diagnosis
        chose the move), the plan comes filled in with `mode` and the audit records why."""
        if self.console.read_only:
            self.console.notify("read-only console: failovers are disabled", severity="warning")
            return
        if not GatewayClient.configured(self.console.fleet):
            self.console.notify(
                "no gateway: declare [gateway] in fleet.toml and set its token variable",
                severity="warning",
            )
            return
        if self.console.gateway_role == "viewer" and self.console.fleet.gateway is not None:
            self.console.notify(
                f"the gateway token ({self.console.fleet.gateway.token_env}) is a viewer token: "
                "failovers need the gateway's admin token",
                severity="warning",
            )
            return
        if model not in {m.name for m in self.console.fleet.models}:
            self.console.notify(
                f"{model} is not a declared model: nothing to fail over", severity="warning"
            )
            return
        self.console.push_screen(
            FailoverScreen(model, target=target, source=source, mode=mode, reason=reason),
            lambda why: self._after_plan(model, why),
        )

    def steer_rollout(
        self, rollout_id: str, verb: str, label: str, *, done: Callable[[], object] | None = None
    ) -> None:
        """Pause, resume or abort rollout `rollout_id` in the gateway, once confirmed by a
        question naming it (`label`: its operation and the step under way); `done` runs
        after the gateway answered. The audit records the console's user and the why typed
        in the confirmation (STEER_WHY when it is left empty)."""
        gateway = self.console.fleet.gateway
        if self.console.read_only:
            self.console.notify("read-only console: steering rollouts is disabled",
                                severity="warning")  # fmt: skip
            return
        if gateway is None or not GatewayClient.configured(self.console.fleet):
            self.console.notify("no gateway: declare [gateway] in fleet.toml and set its token "
                                "variable", severity="warning")  # fmt: skip
            return
        if self.console.gateway_role == "viewer":
            self.console.notify(
                f"the gateway token ({gateway.token_env}) is a viewer token: {verb} needs the "
                "gateway's admin token",
                severity="warning",
            )
            return
        body = {
            "pause": "It pauses at the end of the wave under way; nothing else changes.",
            "resume": "It goes on from the step and phase it stopped at.",
            "abort": "It stops now. A step under way stops where it is (its failover job "
            "cancelled, the routes as they are; an agent's job goes on on the agent): "
            "every deployment stays as it is. An aborted rollout cannot be resumed.",
        }[verb]
        ask = WhyConfirmScreen(
            f"{verb.capitalize()} rollout {rollout_id} ({label})?",
            f"{body}\n\nRecorded in the gateway's audit as {console_user()}, with the why "
            "typed below.",
            f"{verb} rollout {rollout_id}",
            STEER_WHY,
            MAX_WHY,
        )

        def answered(ok: bool | None) -> None:
            if ok:
                steer = self._steer(rollout_id, verb, ask.why, done)
                self.console.run_worker(steer, group="rollout-steer")

        self.console.push_screen(ask, answered)

    async def _steer(
        self, rollout_id: str, verb: str, why: str, done: Callable[[], object] | None
    ) -> None:
        try:
            record = await self.gateway_call(
                lambda g: g.rollout_steer(rollout_id, verb, console_user(), why),
                f"rollout {verb} refused",
                timeout=20,
            )
        finally:
            if done is not None:
                done()
        if record is not None:
            asked = "asked (at the end of the wave under way)" if verb == "pause" else "done"
            self.console.notify(f"rollout {rollout_id}: {verb} {asked}; now {record.status}")

    def _after_plan(self, model: str, why: str | None) -> None:
        if why == "standby":  # start a standby, then come back to the plan (issue 5)
            self.start_vllm(model=model, then_fail_over=True)

    def start_vllm(
        self,
        node: str | None = None,
        model: str | None = None,
        then_fail_over: bool = False,
        *,
        profile: str | None = None,
        started: Callable[[], object] | None = None,
    ) -> None:
        """The Start vLLM form; with `then_fail_over`, once the start succeeds the failover
        plan opens again with the new standby as its target. With `profile`, the form
        opens on it (a diagnosis's standby); `started` runs once the agent took the job."""
        choices = [
            (p.node, name)
            for name, p in self.console.fleet.profiles.items()
            if p.engine == "vllm"
            and (node is None or p.node == node)
            and (model is None or p.served_model_name == model)
        ]
        blocked = [c for c in choices if self.action_blocked(c[0])]
        if not choices:
            where = " ".join(
                x for x in (f"for {model}" if model else "", f"on {node}" if node else "") if x
            )
            self.console.notify(
                f"no vLLM launch profile {where}: declare [profiles.NAME] in fleet.toml",
                severity="warning",
            )
            return
        if len(blocked) == len(choices):
            self.console.notify(str(self.action_blocked(blocked[0][0])), severity="warning")
            return
        choices = [c for c in choices if c not in blocked]
        choices.sort(key=lambda c: c[1] != profile)  # the one asked for first: shown first

        def answered(result: tuple[str, str] | None) -> None:
            if result is not None:
                if started is not None:
                    started()
                self.open_job(*result)
                if then_fail_over and model is not None:
                    self.console.run_worker(
                        self._continue_failover(*result, model), group="standby"
                    )
            elif then_fail_over and model is not None:  # cancelled: back to the plan
                self.fail_over(model)

        self.console.push_screen(StartVllmScreen(choices, model), answered)

    async def _continue_failover(self, node: str, job_id: str, model: str) -> None:
        """Follow a standby's start job; when it is ready, reopen the failover plan."""
        job = await self.agent_call(
            node, lambda a: a.follow(job_id, lambda _: None, interval=1.0), "standby start"
        )
        if job is None:
            return
        if job.state != "succeeded":
            self.console.notify(
                f"the standby did not start ({job.state}): the failover waits; {job.error or ''}",
                severity="error",
                timeout=20,
            )
            return
        declared = next(m for m in self.console.fleet.models if m.name == model)
        profile = job.params.get("profile")
        endpoint = str(job.result.get("endpoint") or "")
        target = next(
            (d.id for d in declared.deployments if d.profile == profile or d.endpoint == endpoint),
            None,
        )
        if target is None:
            self.console.notify(
                f"the standby is ready, but no deployment of {model} names profile {profile} "
                "(deployment.profile in fleet.toml): the gateway cannot route to it",
                severity="warning",
                timeout=20,
            )
            return
        self.console.notify(f"standby {target} is ready: continuing the failover", timeout=10)
        self.console.push_screen(
            FailoverScreen(model, target=target), lambda why: self._after_plan(model, why)
        )


def console_user() -> str:
    """Who the gateway's audit names for a move made here: the console's user."""
    try:
        return getpass.getuser()[:MAX_WHY] or "console"
    except (KeyError, OSError):
        return "console"


def delegate(move: Callable[Concatenate[Workflows, P], R]) -> Callable[Concatenate[Console, P], R]:
    """`move` as a method of the console that holds the workflows, with its signature and
    docstring: one line in the app for each one ConsoleHost names for screens (a subclass
    may still override one: the web view and replay refuse the acting moves)."""

    @wraps(move)
    def through(console: Console, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return move(console.workflows, *args, **kwargs)

    return through
