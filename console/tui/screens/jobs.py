"""Jobs: start a vLLM server from a launch profile, stop or restart an engine, and watch
each job live (steps, cold-start phases, the engine's log, time so far).

Nothing here acts without a confirmation that names the node and the target. The agent
decides what may run; the form shows the exact argv it will run and its preflight.
"""

from __future__ import annotations

import shlex
import time
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, Label, Select, Static

from console.collect.clients.actions import ActionError
from console.collect.clients.gateway_client import GatewayClient
from console.collect.views.operator_actions import GATEWAY, gateway_job, job_target
from console.core.config.load import Fleet, Profile
from console.core.snapshot import Job
from console.core.wire import COLD_START_PHASES, JobPlan
from console.tui import format as fmt
from console.tui.built import ViewBuilt
from console.tui.columns import Fitted
from console.tui.host import ConsoleHost, host_of
from console.tui.polling import Poll
from console.tui.screens.base import ViewScreen
from console.tui.screens.jobtext import (
    STATE_STYLE,
    bench_table,
    job_note,
    step_bars,
    took,
    weights_text,
)
from console.tui.widgets.safe_static import SafeStatic
from console.tui.widgets.table import FleetTable, Row, empty_row

JOB_EVERY_S = 1.0  # a job is polled again this long after its last answer came


class StartVllmScreen(ModalScreen[tuple[str, str] | None]):
    """The Start vLLM form: node, profile, overrides; the exact argv and the preflight.

    Dismisses with (node, job id) once the agent accepted the job.
    """

    BINDINGS = [
        Binding("escape", "close", "cancel"),
        Binding("ctrl+s", "start", "start"),
    ]
    DEFAULT_CSS = """
    StartVllmScreen { align: center middle; }
    StartVllmScreen > VerticalScroll { width: 94%; height: 92%; border: round $accent;
                                       background: $surface; padding: 0 1; }
    StartVllmScreen Input { width: 40; padding: 0 1; }
    StartVllmScreen Input:focus { background: $boost; }
    StartVllmScreen .override { height: 1; }
    StartVllmScreen .override Label { width: 30; padding: 0 1 0 2; }
    StartVllmScreen #overrides { height: auto; margin-top: 1; }
    StartVllmScreen #plan { margin-top: 1; }
    StartVllmScreen #buttons { height: auto; margin-top: 1; }
    StartVllmScreen Button { margin-right: 2; }
    """

    def __init__(self, choices: list[tuple[str, str]], model: str | None = None) -> None:
        """`choices`: (node, profile) pairs an operator may start here."""
        super().__init__()
        self.choices = choices
        self.model = model
        self.plan: JobPlan | None = None
        self._shown: tuple[str, str] | None = None  # the profile whose fields are shown

    @property
    def console(self) -> ConsoleHost:
        return host_of(self)

    def compose(self) -> ComposeResult:
        fleet = self.console.fleet
        title = "Start vLLM" + (f" for {self.model}" if self.model else "")
        # Not focusable itself: the first field is, so Tab goes field to field.
        with VerticalScroll(can_focus=False):
            yield Label(Text(title, style="bold"))
            yield Select(
                [
                    (f"{p}  on {n}  ({fleet.profiles[p].served_model_name})", (n, p))
                    for n, p in self.choices
                ],
                value=self.choices[0],
                allow_blank=False,
                id="profile",
            )
            yield Vertical(id="overrides")
            yield SafeStatic(id="plan")  # the agent's plan, or its refusal
            with Horizontal(id="buttons"):
                yield Button("Start (ctrl+s)", id="start", variant="warning", disabled=True)
                yield Button("Cancel (esc)", id="cancel")

    async def on_mount(self) -> None:
        await self._show_overrides()
        self.refresh_plan()

    @property
    def selected(self) -> tuple[str, str]:
        value = self.query_one("#profile", Select).value
        return value if isinstance(value, tuple) else self.choices[0]

    async def _show_overrides(self) -> None:
        box = self.query_one("#overrides", Vertical)
        await box.remove_children()
        self._shown = self.selected
        _, name = self.selected
        profile = self.console.fleet.profiles[name]
        keys = [*profile.overridable, *(f"args.{a}" for a in profile.allowed_args)]
        rows: list[Horizontal | Static] = []
        for key in keys:
            current = _current(profile, key)
            rows.append(
                Horizontal(
                    Label(key),
                    Input(placeholder=current, id=f"o-{key.replace('.', '--')}", compact=True),
                    classes="override",
                )
            )
        if not rows:
            rows.append(Static(Text("this profile allows no overrides", style="dim")))
        await box.mount_all(rows)

    def overrides(self) -> dict[str, Any]:
        import json

        out: dict[str, Any] = {}
        for field in self.query(Input):
            raw = field.value.strip()
            if not raw or field.id is None:
                continue
            key = field.id.removeprefix("o-").replace("--", ".")
            try:
                out[key] = json.loads(raw)
            except ValueError:
                out[key] = raw
        return out

    @on(Select.Changed, "#profile")
    async def _profile_changed(self) -> None:
        if self._shown == self.selected:
            return  # the Select's first value: remounting would take the focus from a field
        await self._show_overrides()
        self.refresh_plan()

    @on(Input.Changed)
    def _override_changed(self) -> None:
        self.refresh_plan()

    @work(exclusive=True, group="plan")
    async def refresh_plan(self) -> None:
        node, name = self.selected
        out = self.query_one("#plan", Static)
        start = self.query_one("#start", Button)
        start.disabled = True
        self.plan = None
        out.update(Text("asking the agent for the plan ...", style="dim"))
        actions = self.console.agent_client(node)
        try:
            plan = await actions.plan(name, self.overrides())
        except ActionError as exc:
            out.update(Text(f"refused: {exc}", style="bold red"))
            return
        finally:
            await actions.close()
        self.plan = plan
        t = Text()
        t.append(f"node {node}  engine {plan.engine_id}  {plan.endpoint}\n", style="bold")
        t.append("the agent will run (argv, no shell):\n", style="dim")
        t.append("  " + shlex.join(plan.argv) + "\n")
        if plan.env:
            env = " ".join(f"{k}={v}" for k, v in plan.env.items())
            t.append(f"  env: {env}\n")
        apart = detached(self.console.fleet, name, plan.endpoint)
        if apart:
            t.append(f"note: {apart}\n", style="bold yellow")
        t.append("preflight\n", style="dim")
        for check in plan.checks:
            mark = ("  ok   ", "green") if check.ok else ("  FAIL ", "bold red")
            t.append(mark[0], style=mark[1])
            t.append(f"{check.name:<7} {check.detail}\n")
        out.update(t)
        start.disabled = not plan.ok
        start.label = f"Start {name} on {node} (ctrl+s)"

    def action_close(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#cancel")
    def _cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#start")
    def _start_pressed(self) -> None:
        self.action_start()

    def action_start(self) -> None:
        plan = self.plan
        if plan is None or not plan.ok:
            self.notify("the preflight has not passed", severity="warning")
            return
        node, name = self.selected
        overrides = self.overrides()
        body = (
            f"Start vLLM profile {name} on node {node} as engine {plan.engine_id}.\n\n"
            f"{shlex.join(plan.argv)}"
        )
        apart = detached(self.console.fleet, name, plan.endpoint)
        if apart:
            body += f"\n\nNote: {apart}"

        self.console.confirm(
            f"Start {name} on {node}?",
            body,
            f"start on {node}",
            lambda: self._submit(node, name, overrides),
        )

    @work(exclusive=True, group="start")
    async def _submit(self, node: str, name: str, overrides: dict[str, Any]) -> None:
        job = await self.console.agent_call(
            node, lambda a: a.start(name, overrides), "start refused"
        )
        if job is None:
            self.refresh_plan()
            return
        self.dismiss((node, job.id))


def detached(fleet: Fleet, profile: str, endpoint: str) -> str | None:
    """What a start at `endpoint` means for the deployments that name `profile`: said
    when none of them would reach it (a port override moved it), since then the gateway
    routes nothing to the new engine."""
    named = [(m.name, d) for m in fleet.models for d in m.deployments if d.profile == profile]
    if not named or any(d.endpoint.rstrip("/") == endpoint.rstrip("/") for _, d in named):
        return None
    where = ", ".join(f"{d.id} ({model}) expects {d.endpoint}" for model, d in named)
    return (
        f"the engine will listen at {endpoint}, but {where}: it would be detached from "
        "its deployment, and the gateway would route nothing to it"
    )


def _current(profile: Profile, key: str) -> str:
    if key.startswith("args."):
        value = profile.args.get(key[5:])
        return "(not set)" if value is None else str(value)
    return str(getattr(profile, key, ""))


class JobScreen(ViewScreen):
    """One job, live: steps with durations, cold-start phases, the engine's log tail."""

    DEFAULT_CSS = """
    JobScreen #job-info { height: auto; padding: 0 1; }
    JobScreen #steps { height: auto; max-height: 8; overflow-x: hidden; }
    JobScreen #log-title { padding: 0 1; border-top: solid $panel-lighten-2; }
    JobScreen #job-log { height: 1fr; padding: 0 1; }
    """

    BINDINGS = [Binding("c", "cancel_job", "cancel job", id="cancel_job")]

    def __init__(self, node: str, job_id: str) -> None:
        super().__init__()
        self.node, self.job_id = node, job_id
        self.where = f"Job {job_id} on {node}"
        self.job: Job | None = None
        self.log_lines: list[str] = []

    def compose_body(self) -> ComposeResult:
        yield SafeStatic(id="job-info")
        yield FleetTable([("STEP", 11), ("STATE", 10), ("TOOK", 8), ("DETAIL", None)], id="steps")
        yield Static(Text("engine log", style="bold"), id="log-title")
        with VerticalScroll(id="job-log"):
            yield SafeStatic(id="log")  # the engine's own output

    def on_mount(self) -> None:
        super().on_mount()
        self.job_poll = Poll(self, JOB_EVERY_S, self.fetch, "job")
        self.job_poll.now()

    async def fetch(self) -> None:
        """The job and its log tail from the agent (the snapshot lags by an interval)."""
        if self.console.offline:  # a replay: the job as the recorded snapshot has it
            state = self.built.states.get(self.node) if self.built is not None else None
            jobs = state.snapshot.jobs if state and state.snapshot else []
            self.job = next((j for j in jobs if j.id == self.job_id), self.job)
            self._draw_job()
            return
        ended = self.job is not None and self.job.state not in ("queued", "running")
        if ended and self.log_lines:
            return  # an ended job does not change
        actions = self.console.agent_client(self.node)
        try:
            self.job = await actions.job(self.job_id)
            self.log_lines = await actions.log(self.job_id, tail=40)
        except ActionError as exc:
            self.query_one("#job-info", Static).update(Text(str(exc), style="red"))
            return
        finally:
            await actions.close()
        self._draw_job()

    def draw(self, built: ViewBuilt) -> None:
        self._draw_job()

    def _draw_job(self) -> None:
        job = self.job
        info = self.query_one("#job-info", Static)
        if job is None:
            waiting = "not in the recording at this moment" if self.console.offline else None
            info.update(Text(waiting or "asking the agent ...", style="dim"))
            return
        t = Text()
        t.append(f"{job.kind} ", style="bold")
        t.append(f"{job_target(job)} on {self.node}  ")
        t.append(job.state.upper(), style=STATE_STYLE.get(job.state, ""))
        t.append(f"  {took(job)}  by {job.who}")
        engine = job.result.get("engine_id")
        if engine:
            t.append(f"  engine {engine}")
        if job.error:
            t.append(f"\n{job.error}", style="bold red")
        cold = job.result.get("cold_start")
        if isinstance(cold, dict):
            t.append("\ncold start ")
            phases = cold.get("phases", {})
            seen = [p for p in COLD_START_PHASES if phases.get(p) is not None]
            for i, phase in enumerate(seen):
                t.append(" → " if i else " ")
                t.append(f"{phase} {phases[phase]:.1f}s", style="bold" if phase == "ready" else "")
            missing = [p for p in COLD_START_PHASES if phases.get(p) is None]
            if missing:
                t.append(f"   not seen (yet): {', '.join(missing)}", style="dim")
        if job.result.get("argv"):
            t.append("\n" + shlex.join(job.result["argv"]), style="dim")
        if job.kind == "drill.run":
            self.query_one("#log-title", Static).update(Text("drill log", style="bold"))
            key = job.result.get("build_key")
            if key:
                t.append(f"\nbuild key {key}, cache {job.result.get('cache')}", style="dim")
            t.append("\n")
            t.append_text(step_bars(job.steps))
            for gate in job.result.get("gates") or []:
                t.append(f"{gate['gate']}: ", style="bold")
                t.append(
                    "pass" if gate["ok"] else "FAIL", style="green" if gate["ok"] else "bold red"
                )
                t.append(f"  {gate['detail']}\n", style="dim")
            t.append_text(bench_table(job.result.get("benchmark")))
            rebuilt = job.result.get("time_to_rebuild_s")
            if rebuilt:
                t.append(f"time to rebuild {fmt.seconds(rebuilt)}", style="bold")
        info.update(t)
        rows = []
        # DETAIL gets what the other columns leave, cut with an ellipsis, never by the
        # terminal's edge mid-word (the margin, STEP, STATE, TOOK and a scrollbar).
        room = max(8, (self.size.width or 80) - 1 - 11 - 10 - 8 - 2)
        for step in job.steps:
            duration = (
                fmt.seconds((step.ended or time.time()) - step.started) if step.started else "-"
            )
            rows.append(
                Row(
                    step.name,
                    (
                        Text(step.name, style="bold"),
                        Text(step.state, style=STATE_STYLE.get(step.state, "")),
                        Text(duration),
                        fmt.fit(step.detail or "", room),
                    ),
                )
            )
        self.query_one("#steps", FleetTable).show(rows)
        lines = self.log_lines or job.result.get("log_tail", [])
        self.query_one("#log", Static).update(
            Text("\n".join(lines[-40:]) or "(no output yet)", style="" if lines else "dim")
        )
        self.query_one("#job-log", VerticalScroll).scroll_end(animate=False)

    def action_cancel_job(self) -> None:
        reason = self.console.action_blocked(self.node)
        if reason:
            self.notify(reason, severity="warning")
            return
        if self.job is None or self.job.state not in ("queued", "running"):
            self.notify("this job has ended", severity="warning")
            return

        self.console.confirm(
            f"Cancel job {self.job_id} on {self.node}?",
            f"{self.job.kind} {job_target(self.job)}: a start being cancelled stops the "
            "engine it started.",
            "cancel the job",
            self._cancel,
        )

    @work(group="cancel")
    async def _cancel(self) -> None:
        await self.console.agent_call(self.node, lambda a: a.cancel(self.job_id), "cancel")
        self.job_poll.now()


class JobsScreen(ViewScreen):
    """Every agent's recent jobs from the snapshots, and the gateway's failover jobs,
    newest first. Enter opens one: its steps, its log or its routes."""

    where = "Jobs"
    # Widths include the one space that separates columns (FleetTable has no padding).
    COLUMNS = [
        ("NODE", 11),
        ("JOB", 13),
        ("KIND", 19),  # failover.emergency
        ("TARGET", 22),
        ("STATE", 10),
        ("TOOK", 8),
        ("BY", 12),
        ("STEP / RESULT", None),
    ]
    SPARE = (6, 5, 3)  # at 80 columns BY, TOOK and TARGET go first (console/tui/columns.py)

    def compose_body(self) -> ComposeResult:
        self.fitted = Fitted(self, self.COLUMNS, "jobs", self._redraw, self.SPARE)
        yield from self.fitted.compose()

    def _redraw(self) -> None:
        self.redraw()

    def _gateway(self) -> bool:
        """Whether the console reads the gateway's actions: not without a gateway (nor in
        a replay, which reads none: its failovers are in Events)."""
        console = self.console
        return not console.offline and GatewayClient.configured(console.fleet)

    def draw(self, built: ViewBuilt) -> None:
        if not self.fitted.ready():
            return
        fit = self.fitted.fit
        rows: list[Row] = []
        found: list[tuple[str, Job]] = []
        for node, state in built.states.items():
            if state.snapshot is not None:
                found += [(node, j) for j in state.snapshot.jobs]
        if self._gateway():
            found += [(GATEWAY, j) for j in built.gateway_jobs]
            if built.gateway_blind:  # unknown, not none
                blanks = [Text("")] * (len(self.COLUMNS) - 2)
                why = fmt.fit(f"failover jobs unknown: {built.gateway_blind}", fit.room, "yellow")
                rows.append(Row(f"@{GATEWAY}", fit.pick((Text(GATEWAY), *blanks, why))))
        found.sort(key=lambda nj: nj[1].created or 0, reverse=True)
        for node, job in found:
            note = job_note(job)
            width = dict(self.COLUMNS)
            cells = (
                fmt.fit(node, width["NODE"] or 0),
                fmt.fit(job.id, width["JOB"] or 0, "bold"),
                fmt.fit(job.kind, width["KIND"] or 0),
                fmt.fit(job_target(job), width["TARGET"] or 0),
                Text(job.state, style=STATE_STYLE.get(job.state, "")),
                Text(took(job)),
                fmt.fit(job.who or "?", width["BY"] or 0),
                fmt.cut(note, fit.room),
            )
            fields = {"node": node, "kind": job.kind, "state": job.state}
            # "@": no node is named so (fleet.toml ids start with a letter or a digit).
            key = f"@{GATEWAY}/{job.id}" if node == GATEWAY else f"{node}/{job.id}"
            rows.append(Row(key, fit.pick(cells), fields, f"{node} {job.kind} {job.id}"))
        if not rows:
            none = "no job in the last 10 minutes: s on a Node starts vLLM"
            rows.append(empty_row(len(fit.shown), fmt.fit(none, fit.room).plain))
        self.query_one(FleetTable).show(rows, self.filter)

    @on(DataTable.RowSelected, "#jobs")
    def _open(self, event: DataTable.RowSelected) -> None:
        key = str(event.row_key.value)
        if key.startswith(f"@{GATEWAY}/"):
            self.app.push_screen(GatewayJobScreen(key.partition("/")[2]))
        elif "/" in key:
            node, _, job_id = key.partition("/")
            self.console.open_job(node, job_id)


class GatewayJobScreen(JobScreen):
    """One of the gateway's failover jobs, live: its steps (each shift's verification
    figures in its detail), then the routes before and after. Cancelling is the failover
    plan's."""

    def __init__(self, job_id: str) -> None:
        super().__init__(GATEWAY, job_id)
        self.where = f"Failover job {job_id} on the gateway"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel_job":
            return False  # the agent's cancel; a failover is cancelled where it was started
        return super().check_action(action, parameters)

    async def fetch(self) -> None:
        if self.job is not None and self.job.state not in ("queued", "running"):
            return  # an ended job does not change
        found = await self.console.gateway_call(
            lambda g: g.job(self.job_id), reads=True,
            failed=lambda why: self.query_one("#job-info", Static).update(Text(why, style="red")),
        )  # fmt: skip
        if found is None:
            return
        self.job = gateway_job(found) or self.job
        self._draw_job()

    def _draw_job(self) -> None:
        super()._draw_job()
        job = self.job
        if job is None:
            return
        self.query_one("#log-title", Static).update(Text("routes", style="bold"))
        result = job.result
        t = Text()
        if result.get("dataplane_is"):
            t.append(f"data plane: {result['dataplane_is']}\n", style="dim")
        for name in ("before", "after"):
            weights = result.get(name)
            pending = name == "after" and job.state in ("queued", "running")
            shown = weights_text(weights) if weights else ("not yet" if pending else "unknown")
            t.append(f"{name:<7}", style="bold")
            t.append(f"{shown}\n")
        self.query_one("#log", Static).update(t)
