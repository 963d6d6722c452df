"""Fail over: one move of a model's weights, planned, confirmed by typing the model's name,
then the job live.

The moves (docs/gateway.md): all of the model to one deployment (a fail-back when it
undoes the last move), drain one deployment (its weight to the others in proportion, or
onto one), or restore the weights from before an earlier job. The target is preselected
healthiest first (console.collect.moves.failover_targets), and the plan says why. The plan shows
every deployment side by side (engine and version, state, the engine's own TTFT p95 and
the gateway's, queue, KV cache, the weight before and after the move, in flight), the
gateway's preflight and the steps. The job runs in the gateway: closing the console does
not stop it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from console.collect.moves.failover_targets import Candidate, preselected, rank
from console.collect.views.gateway_view import GatewayDeployment
from console.collect.views.view import DeploymentRow
from console.core.config.load import Model
from console.core.gateway_wire import FailoverJob, Plan
from console.core.snapshot import Percentiles
from console.tui import format as fmt
from console.tui.built import ViewBuilt
from console.tui.host import ConsoleHost, host_of
from console.tui.polling import Poll
from console.tui.screens.jobtext import STATE_STYLE, weights_text
from console.tui.widgets.safe_static import SafeStatic

MOVES = [("all to one", "to"), ("drain one", "drain"), ("restore earlier", "restore")]
OTHERS = "others"  # the onto choice: spread over the other deployments, in proportion


class FailoverScreen(ModalScreen[str | None]):
    """Dismissed with "standby" when the operator asks to start a vLLM standby first."""

    BINDINGS = [Binding("escape", "close", "close")]
    AUTO_FOCUS = "#target"  # the first field to fill: what takes (or loses) the traffic
    DEFAULT_CSS = """
    FailoverScreen { align: center middle; }
    FailoverScreen > VerticalScroll { width: 96%; height: 94%; border: thick $warning;
                                      background: $surface; padding: 0 1; }
    FailoverScreen Horizontal { height: auto; margin-top: 1; }
    FailoverScreen Select { width: 1fr; max-width: 40; margin-right: 1; }
    FailoverScreen #move { max-width: 19; }
    FailoverScreen #how { margin-top: 0; }
    FailoverScreen #mode { max-width: 23; }
    FailoverScreen #onto.hidden { display: none; }
    FailoverScreen #confirm-what { margin-top: 1; }
    FailoverScreen Input { width: 1fr; max-width: 80; background: $boost; }
    FailoverScreen Button { margin-right: 2; }
    FailoverScreen #preflight, FailoverScreen #plan-table { margin-top: 1; }
    """

    def __init__(
        self,
        model: str,
        target: str | None = None,
        source: str | None = None,
        *,
        mode: str = "planned",
        reason: str | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.target = target  # preselected, e.g. the standby the console just started
        self.source = source  # a deployment to drain (onto `target` when given)
        self.mode = mode  # preselected: a critical diagnosis's move is an emergency one
        # Why, when a diagnosis chose the move: the gateway's audit records it, and the
        # confirmation comes filled in (the diagnosis and this plan both name the move and
        # its target; Enter confirms, as `y` does in a yes/no confirmation).
        self.reason = reason
        self.job: FailoverJob | None = None
        self.plan: Plan | None = None  # the gateway's answer for the move shown
        self.jobs: list[FailoverJob] = []  # the model's earlier jobs, for a restore
        self.first_choice: str | None = None  # the target the screen opened with
        # The last view, handed by the app as the plan opens and at each refresh after
        # (EngineroomApp.tick): its rows and the gateway's routes rank the targets.
        self.built: ViewBuilt | None = None

    @property
    def console(self) -> ConsoleHost:
        return host_of(self)

    def _model(self) -> Model:
        return next(m for m in self.console.fleet.models if m.name == self.model)

    def _live(self) -> Mapping[str, GatewayDeployment]:
        """The model's deployments at the gateway; empty before it answered."""
        gateway = self.built.gateway if self.built is not None else None
        return (gateway.routes(self.model) if gateway is not None else None) or {}

    def _weights(self) -> dict[str, int]:
        live = self._live()
        return {d.id: _live_weight(live.get(d.id), d.weight) for d in self._model().deployments}

    def _rows(self) -> list[DeploymentRow]:
        view = self.built.view if self.built is not None else None
        return list(view.models.get(self.model, [])) if view else []

    def ranked(self, exclude: list[str]) -> list[Candidate]:
        """The deployments but `exclude`, healthiest first."""
        return rank(self._model(), self._rows(), self._live() or None, exclude)

    # -- the fields ------------------------------------------------------------------------

    def _carriers(self) -> list[str]:
        """Deployments that carry all of the model now: no target for "all to"."""
        weights = self._weights()
        total = sum(weights.values())
        return [d for d, w in weights.items() if total and w == total]

    def _target_options(self, move: str) -> list[tuple[str, str]]:
        if move == "restore":
            return [(self._job_label(j), j.id) for j in self.jobs] or [
                ("(no earlier job of this model with weights)", "")
            ]
        if move == "drain":
            weights = self._weights()
            # The least healthy first: what one drains is the sick one.
            order = [c.id for c in reversed(self.ranked([]))]
            return [(f"drain {d}", d) for d in order if weights.get(d, 0) > 0] or [
                ("(no deployment has weight)", "")
            ]
        return [(f"to {c.id}", c.id) for c in self.ranked(self._carriers())] or [
            ("(no other deployment)", "")
        ]

    @staticmethod
    def _job_label(job: FailoverJob) -> str:
        when = time.strftime("%H:%M", time.localtime(job.created or 0))
        op = job.kind.split(".")[0]
        return f"before {job.id}, {op} {when}"

    def _onto_options(self, drained: str) -> list[tuple[str, str]]:
        ranked = self.ranked([drained] if drained else [])
        return [("onto the others, in proportion", OTHERS)] + [
            (f"onto {c.id}", c.id) for c in ranked
        ]

    def compose(self) -> ComposeResult:
        move = "drain" if self.source else "to"
        targets = self._target_options(move)
        first = self.source if move == "drain" else self.target
        value = next((t[1] for t in targets if t[1] == first), targets[0][1])
        onto = self._onto_options(value if move == "drain" else "")
        onto_value = next((o[1] for o in onto if self.source and o[1] == self.target), OTHERS)
        self.first_choice = value if move == "to" else onto_value
        # What the fields were given: a Select's first Changed (on mount) repeats it, and
        # must not reset the fields a playbook step preselected.
        self._shown: dict[str, object] = {
            "move": move,
            "target": value,
            "onto": onto_value,
            "mode": self.mode,
        }
        # Not focusable itself: the fields are, so Tab goes field to field. They come first,
        # so that at 80x24 the target and the confirmation are on screen.
        with VerticalScroll(can_focus=False):
            yield Label(Text(f"Fail over {self.model}", style="bold"))
            with Horizontal():
                yield Select(MOVES, value=move, allow_blank=False, id="move", compact=True)
                yield Select(targets, value=value, allow_blank=False, id="target", compact=True)
            with Horizontal(id="how"):
                yield Select(onto, value=onto_value, allow_blank=False, id="onto", compact=True,
                             classes="" if move == "drain" else "hidden")  # fmt: skip
                yield Select(
                    [("planned (verified)", "planned"), ("emergency (at once)", "emergency")],
                    value=self.mode,
                    allow_blank=False,
                    id="mode",
                    compact=True,
                )  # fmt: skip
            ask = _ask(move, value, onto_value)
            # The move in words, wrapped: as a placeholder it was cut at 80 columns (the
            # target lost) and went away at the first key typed.
            yield SafeStatic(self._confirm_text(ask), id="confirm-what")
            yield Input(
                self.model if self.reason else "",
                placeholder=f"type {self.model}",
                id="confirm",
                compact=True,
            )
            with Horizontal():
                ready = bool(self.reason) and any(ask.values())  # filled in by a diagnosis
                yield Button(self._go_label(ask), id="go", variant="error", disabled=not ready,
                             compact=True)  # fmt: skip
                yield Button("Start a vLLM standby first", id="standby", compact=True)
                yield Button("Close (esc)", id="close", compact=True)
            yield SafeStatic(id="progress")
            yield SafeStatic(id="preflight")
            yield SafeStatic(id="plan-table")  # versions, gateway errors: outside text
            yield SafeStatic(id="steps")

    def on_mount(self) -> None:
        if self.source:
            # A playbook step chose the move: what is left is to read it and type the
            # model's name (the name typed into a Select was lost).
            self.query_one("#confirm", Input).focus()
        self._draw_plan()
        self.progress_poll = Poll(self, 1.0, self._tick, "failover-progress")
        self.progress_poll.now()
        self._preflight()

    # -- what is asked -----------------------------------------------------------------------

    def ask(self) -> dict[str, str | None]:
        """The move the fields say: {to, drain, restore_before} (the others None)."""
        return _ask(
            str(self.query_one("#move", Select).value),
            str(self.query_one("#target", Select).value),
            str(self.query_one("#onto", Select).value),
        )

    def what(self) -> str:
        """The move in words, as the confirmation names it."""
        return _what(self.ask())

    def _confirm_text(self, ask: dict[str, str | None] | None = None) -> str:
        what = _what(ask if ask is not None else self.ask())
        if self.reason:
            return f"{what}: Enter to confirm ({self.reason}; {self.model} typed for you)"
        return f"{what}: type {self.model} below to confirm"

    def _go_label(self, ask: dict[str, str | None] | None = None) -> str:
        ask = ask if ask is not None else self.ask()
        return "Restore" if ask["restore_before"] else "Drain" if ask["drain"] else "Fail over"

    @work(exclusive=True, group="preflight")
    async def _preflight(self) -> None:
        """The gateway's plan for the move the fields say, before anyone confirms."""
        ask = self.ask()
        box = self.query_one("#preflight", Static)
        self.plan = None
        if not any(ask.values()):
            box.update(Text(self._why_preselected()))
            self._draw_plan()
            return
        box.update(Text(f"{self._why_preselected()}\nplan: asking the gateway ...", style="dim"))

        def failed(why: str) -> None:
            if self.is_attached:
                box.update(Text(f"plan: {why}", style="bold red"))

        result = await self.console.gateway_call(
            lambda g: g.plan(self.model, ask["to"], drain=ask["drain"],
                             restore_before=ask["restore_before"]),
            timeout=40, reads=True, failed=failed,
        )  # fmt: skip
        if result is None or not self.is_attached:  # failed, or closed while it was asked
            return
        self.plan = result
        text = Text(self._why_preselected() + "\n", style="dim")
        text.append(f"move: {result.summary or self.what()}\n", style="bold")
        text.append(f"source: {', '.join(result.sources) if result.sources else 'none'}\n")
        mark = ("preflight ok: ", "green") if result.ok else ("preflight FAILED: ", "bold red")
        text.append(mark[0], style=mark[1])
        text.append(result.detail)
        if result.figures_from:  # where the shifts' verification windows read from
            text.append(f"\nverification figures: {result.figures_from}", style="dim")
        box.update(text)
        self._draw_plan()

    def _why_preselected(self) -> str:
        """Why the fields hold what they hold: the chosen deployment's health in words."""
        move = str(self.query_one("#move", Select).value)
        if move == "restore":
            return "restore: the weights each earlier job found when it began"
        chosen = str(self.query_one("#target", Select).value)
        if move == "drain":
            onto = str(self.query_one("#onto", Select).value)
            if onto == OTHERS:
                return "drain: its weight goes to the deployments that have weight, in proportion"
            chosen = onto
        found = [c for c in self.ranked([]) if c.id == chosen]
        if not found:
            return preselected([])
        word = "preselected " if chosen == self.first_choice else ""
        return f"{word}{chosen}: {found[0].why}"

    # -- the plan ------------------------------------------------------------------------------

    def _draw_plan(self) -> None:
        live = self._live()
        rows = {r.id: r for r in self._rows()}
        slo = self._model().slo
        after = (self.plan.weights_after if self.plan else None) or {}
        before = (self.plan.weights_before if self.plan else None) or {}
        # A table that fits the dialog: at 80 columns its cells are cut, never wrapped.
        table = Table(box=None, padding=(0, 1, 0, 0), pad_edge=False, expand=False)
        table.add_column("DEPLOYMENT", no_wrap=True, min_width=10)
        table.add_column("ENGINE", no_wrap=True, overflow="ellipsis", max_width=16)
        table.add_column("STATE", no_wrap=True, overflow="ellipsis", max_width=16)
        # Where each TTFT was measured, as on Models (console.collect.views.measured); ~ is a
        # windowed mean, never a p95.
        table.add_column("TTFT95\nengine", justify="right", no_wrap=True)
        table.add_column("TTFT95\ngateway", justify="right", no_wrap=True)
        table.add_column("QUEUE", justify="right", no_wrap=True)
        table.add_column("KV", justify="right", no_wrap=True)
        table.add_column("WEIGHT\n→ after", justify="right", no_wrap=True)
        table.add_column("INFL", justify="right", no_wrap=True)
        for dep in self._model().deployments:
            row = rows.get(dep.id)
            gw = live.get(dep.id)
            stats = row.stats if row else None
            state = row.state if row else "unknown"
            gw_state = " (gw: down)" if gw is not None and gw.down else ""
            queue = stats.requests_waiting if stats else None
            kv = stats.kv_cache_usage if stats else None
            limit = slo.ttft_p95_ms
            now = before.get(dep.id, _live_weight(gw, dep.weight))
            weight = Text(str(now))
            if dep.id in after:
                changed = after[dep.id] != now
                weight.append(f"→{after[dep.id]}", style="bold" if changed else "dim")
            table.add_row(
                dep.id,
                f"{dep.engine} {(row.version if row else None) or '?'}",
                Text(state + gw_state, style="green" if state == "ready" else "yellow"),
                fmt.latency(stats.latency.ttft_s if stats and stats.latency else None,
                            limit_ms=limit),
                fmt.latency(Percentiles(p95=gw.ttft_p95) if gw is not None else None,
                            limit_ms=limit),
                "?" if queue is None else f"{queue:g}",
                "?" if kv is None else f"{kv:.0%}",
                weight,
                "?" if gw is None or gw.inflight is None else str(gw.inflight),
            )  # fmt: skip
        lines = Group(table, Text(self._data_plane(), style="dim"))
        error = self.built.gateway_error if self.built is not None else None
        if error:
            lines = Group(lines, Text(f"gateway: {error}", style="bold red"))
        self.query_one("#plan-table", Static).update(lines)
        self._draw_steps()

    def _data_plane(self) -> str:
        """Which data plane carries the model's traffic: the gateway's own columns (TTFT,
        in flight) mean something only when it is the built-in one."""
        model = self._model()
        if model.dataplane == "gateway":
            return "data plane: the built-in gateway (the gateway columns are its own)\n"
        plane = next((p for p in self.console.fleet.dataplanes if p.name == model.dataplane), None)
        kind = plane.kind if plane else "?"
        return (
            f"data plane {model.dataplane} ({kind}): the gateway drives it and is not in the "
            "traffic's path; its gateway columns show the weights its jobs set\n"
        )

    def _draw_steps(self) -> None:
        plan = self._model().failover
        mode = self.query_one("#mode", Select).value
        gaining = ", ".join(self.plan.targets if self.plan else []) or "the deployments that gain"
        if mode == "emergency":
            text = f"1. readiness of {gaining}  2. the weights after, at once  3. done"
        else:
            shifts = ", ".join(f"{p}%" for p in plan.steps)
            text = (
                f"1. preflight: {gaining} healthy, serving, canary meets the SLO, room"
                f"\n2. warm-up: {plan.warmup_requests} requests to each that had no traffic"
                f"\n3. shift {shifts} of the way, each verified for {plan.verify_s:g} s "
                f"(a breach rolls back)\n4. drain what is left at weight 0 "
                f"(up to {plan.drain_timeout_s:g} s)\n5. done"
            )
        self.query_one("#steps", Static).update(Text(text, style="dim"))

    # -- reacting --------------------------------------------------------------------------

    @on(Select.Changed)
    def _changed(self, event: Select.Changed) -> None:
        if not self.is_mounted:
            return
        which = str(event.select.id)
        if self._shown.get(which) == event.value:
            return  # what it already showed: nothing the operator changed
        self._shown[which] = event.value
        if event.select.id == "move":
            move = str(event.value)
            target = self.query_one("#target", Select)
            target.set_options(self._target_options(move))
            self.query_one("#onto", Select).set_class(move != "drain", "hidden")
            if move == "restore":
                self._read_jobs()
        if event.select.id in ("move", "target"):
            onto = self.query_one("#onto", Select)
            drained = str(self.query_one("#target", Select).value)
            onto.set_options(self._onto_options(drained))
            onto.value = OTHERS
        self.query_one("#confirm-what", SafeStatic).update(self._confirm_text())
        self.query_one("#go", Button).label = self._go_label()
        self._draw_steps()
        if event.select.id != "mode":
            self._preflight()

    @work(exclusive=True, group="jobs")
    async def _read_jobs(self) -> None:
        """The model's earlier jobs that recorded the weights they found, newest first."""
        jobs = await self.console.gateway_call(lambda g: g.jobs(), "the gateway's jobs",
                                               reads=True)  # fmt: skip
        if jobs is None or not self.is_attached:
            return
        self.jobs = [j for j in jobs if j.params.get("model") == self.model and j.before]
        if str(self.query_one("#move", Select).value) == "restore":
            self.query_one("#target", Select).set_options(self._target_options("restore"))

    @on(Input.Changed, "#confirm")
    def _typed(self, event: Input.Changed) -> None:
        ready = event.value.strip() == self.model and self.job is None and any(self.ask().values())
        self.query_one("#go", Button).disabled = not ready

    @on(Button.Pressed, "#close")
    def action_close(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#standby")
    def _standby(self) -> None:
        """Start a standby (the lifecycle job), then come back here with it as the target."""
        self.dismiss("standby")  # the app starts it once this screen is gone

    @on(Input.Submitted, "#confirm")
    @on(Button.Pressed, "#go")
    def _go(self) -> None:
        """The button, or Enter in the confirmation field once it names the model."""
        if self.job is not None or not any(self.ask().values()):
            return
        if self.query_one("#confirm", Input).value.strip() != self.model:
            return
        self._start(self.ask(), str(self.query_one("#mode", Select).value))

    @work(exclusive=True, group="failover")
    async def _start(self, ask: dict[str, str | None], mode: str) -> None:
        why = f"from the console: {self.reason}" if self.reason else "from the console"
        job = await self.console.gateway_call(
            lambda g: g.failover(self.model, ask["to"], mode, why, drain=ask["drain"],
                                 restore_before=ask["restore_before"]),
            "failover refused",
        )  # fmt: skip
        if job is None:
            return
        self.job = job
        if self.is_attached:
            self.query_one("#go", Button).disabled = True
            self._draw_job()

    async def _tick(self) -> None:
        if not self.is_attached:
            return
        self._draw_plan()
        if self.job is None or self.job.state != "running":
            return
        job_id = self.job.id
        job = await self.console.gateway_call(
            lambda g: g.job(job_id), reads=True,
            failed=lambda why: self.query_one("#progress", Static).update(Text(why, style="red")),
        )  # fmt: skip
        if job is not None and self.is_attached:  # the job and its drawing change together
            self.job = job
            self._draw_job()

    def _draw_job(self) -> None:
        job = self.job
        if job is None:
            return
        t = Text()
        took = time.time() - job.created
        t.append(f"\njob {job.id} {job.kind}  ", style="bold")
        t.append(job.state.upper(), style=STATE_STYLE.get(job.state, ""))
        t.append(f"  {fmt.seconds(took)}\n")
        if (job.plan or {}).get("summary"):
            t.append(f"  {(job.plan or {})['summary']}\n")
        dataplane = (job.model_extra or {}).get("dataplane_is")  # not in FailoverJob
        if dataplane:
            t.append(f"  data plane: {dataplane}\n", style="dim")
        for step in job.steps:
            t.append(f"  {step.name:<12}", style="bold")
            t.append(f"{step.state:<10}", style=STATE_STYLE.get(step.state, ""))
            t.append(f" {step.detail or ''}\n")
        if job.error:
            t.append(f"{job.error}\n", style="bold red")
        if job.after:
            before, after = job.before or {}, job.after
            t.append("routes before ", style="bold")
            t.append(weights_text(before) or "unknown")
            t.append("\n       after  ", style="bold")
            t.append("as before" if after == before else weights_text(after))
            t.append("\n")
        self.query_one("#progress", Static).update(t)


def _ask(move: str, target: str, onto: str) -> dict[str, str | None]:
    """The move of the fields' values: {to, drain, restore_before} (the others None)."""
    chosen = target or None
    if move == "restore":
        return {"to": None, "drain": None, "restore_before": chosen}
    if move == "drain":
        return {"to": None if onto == OTHERS else onto, "drain": chosen, "restore_before": None}
    return {"to": chosen, "drain": None, "restore_before": None}


def _what(ask: dict[str, str | None]) -> str:
    """A move in words, as the confirmation names it."""
    if ask["restore_before"]:
        return f"restore the weights from before job {ask['restore_before']}"
    if ask["drain"]:
        return f"drain {ask['drain']} onto {ask['to'] or 'the others'}"
    return f"all of it to {ask['to'] or '?'}"


def _live_weight(gw: GatewayDeployment | None, declared: int) -> int:
    """The weight the gateway's data plane has, else the declared one (not read yet)."""
    return gw.weight if gw is not None and gw.weight is not None else declared
