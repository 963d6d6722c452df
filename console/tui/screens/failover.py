"""Fail over: the plan for one model, a typed confirmation, then the job live.

The plan shows every deployment of the model side by side (engine and version, state,
the engine's own TTFT p95 and the gateway's, queue, KV cache, live weight, in flight),
the steps the gateway will take, and asks the operator to type the model's name. The
job runs in the gateway: closing the console does not stop it.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from console.collect.gateway_client import GatewayClient, GatewayError
from console.core.snapshot import percentiles_from
from console.tui import format as fmt
from console.tui.polling import Poll
from console.tui.screens.jobs import STATE_STYLE
from console.tui.widgets.safe_static import SafeStatic


class FailoverScreen(ModalScreen[str | None]):
    """Dismissed with "standby" when the operator asks to start a vLLM standby first."""

    BINDINGS = [Binding("escape", "close", "close")]
    DEFAULT_CSS = """
    FailoverScreen { align: center middle; }
    FailoverScreen > VerticalScroll { width: 96%; height: 94%; border: thick $warning;
                                      background: $surface; padding: 0 1; }
    FailoverScreen Horizontal { height: auto; margin-top: 1; }
    FailoverScreen Select { width: 1fr; max-width: 44; margin-right: 2; }
    FailoverScreen Input { width: 1fr; max-width: 60; margin-top: 1; background: $boost; }
    FailoverScreen Button { margin-right: 2; }
    FailoverScreen #preflight, FailoverScreen #plan-table { margin-top: 1; }
    """

    def __init__(self, model: str, target: str | None = None) -> None:
        super().__init__()
        self.model = model
        self.target = target  # preselected, e.g. the standby the console just started
        self.job: dict[str, Any] | None = None

    @property
    def console(self) -> Any:
        return self.app

    def _deployments(self) -> list[Any]:
        return next(m for m in self.console.fleet.models if m.name == self.model).deployments

    def compose(self) -> ComposeResult:
        deployments = self._deployments()
        live = self._live()
        heaviest = max(deployments, key=lambda d: live.get(d.id, {}).get("weight", d.weight))
        targets = [(f"to {d.id} ({d.engine})", d.id) for d in deployments if d.id != heaviest.id]
        if self.target is not None and any(t[1] == self.target for t in targets):
            targets.sort(key=lambda t: t[1] != self.target)
        # Not focusable itself: the first field is, so Tab goes field to field. The fields
        # come first, so that at 80x24 the target and the confirmation are on screen.
        with VerticalScroll(can_focus=False):
            yield Label(Text(f"Fail over {self.model}", style="bold"))
            with Horizontal():
                yield Select(
                    targets or [("(no other deployment)", "")],
                    value=targets[0][1] if targets else "",
                    allow_blank=False,
                    id="target",
                    compact=True,
                )
                yield Select(
                    [("planned (in verified steps)", "planned"),
                     ("emergency (all at once)", "emergency")],
                    value="planned",
                    allow_blank=False,
                    id="mode",
                    compact=True,
                )  # fmt: skip
            yield Input(
                placeholder=f"type {self.model} to confirm, then Enter",
                id="confirm",
                compact=True,
            )
            with Horizontal():
                yield Button("Fail over", id="go", variant="error", disabled=True, compact=True)
                yield Button("Start a vLLM standby first", id="standby", compact=True)
                yield Button("Close (esc)", id="close", compact=True)
            yield SafeStatic(id="progress")
            yield SafeStatic(id="preflight")
            yield SafeStatic(id="plan-table")  # versions, gateway errors: outside text
            yield SafeStatic(id="steps")

    def on_mount(self) -> None:
        self._draw_plan()
        self.progress_poll = Poll(self, 1.0, self._tick, "failover-progress")
        self.progress_poll.now()
        self._preflight()

    @work(exclusive=True, group="preflight")
    async def _preflight(self) -> None:
        """The gateway's preflight for the chosen target, before anyone confirms."""
        target = str(self.query_one("#target", Select).value)
        box = self.query_one("#preflight", Static)
        if not target:
            box.update("")
            return
        box.update(Text(f"preflight of {target}: asking the gateway ...", style="dim"))
        client = GatewayClient(self.console.fleet, timeout=40)
        try:
            result = await client.plan(self.model, target)
        except GatewayError as exc:
            box.update(Text(f"preflight: {exc}", style="bold red"))
            return
        finally:
            await client.close()
        mark = ("preflight ok: ", "green") if result["ok"] else ("preflight FAILED: ", "bold red")
        text = Text(mark[0], style=mark[1])
        text.append(result["detail"])
        if result.get("figures_from"):  # where the shifts' verification windows read from
            text.append(f"\nverification figures: {result['figures_from']}", style="dim")
        box.update(text)

    def _live(self) -> dict[str, Any]:
        snap = self.console.gateway_snapshot or {}
        result: dict[str, Any] = snap.get("models", {}).get(self.model, {})
        return result

    def _draw_plan(self) -> None:
        live = self._live()
        rows = {
            r.id: r
            for r in (self.console.view.models.get(self.model, []) if self.console.view else [])
        }
        slo = next(m for m in self.console.fleet.models if m.name == self.model).slo
        # A table that fits the dialog: at 80 columns its cells are cut, never wrapped.
        table = Table(box=None, padding=(0, 1, 0, 0), pad_edge=False, expand=False)
        table.add_column("DEPLOYMENT", no_wrap=True, min_width=10)
        table.add_column("ENGINE", no_wrap=True, overflow="ellipsis", max_width=16)
        table.add_column("STATE", no_wrap=True, overflow="ellipsis", max_width=16)
        # Where each TTFT was measured, as on Models (console.collect.measured); ~ is a
        # windowed mean, never a p95.
        table.add_column("TTFT95\nengine", justify="right", no_wrap=True)
        table.add_column("TTFT95\ngateway", justify="right", no_wrap=True)
        table.add_column("QUEUE", justify="right", no_wrap=True)
        table.add_column("KV", justify="right", no_wrap=True)
        table.add_column("WEIGHT", justify="right", no_wrap=True)
        table.add_column("INFL", justify="right", no_wrap=True)
        for dep in self._deployments():
            row = rows.get(dep.id)
            gw = live.get(dep.id, {})
            stats = row.stats if row else None
            state = row.state if row else "unknown"
            gw_state = "" if gw.get("up", True) else " (gw: down)"
            queue = stats.requests_waiting if stats else None
            kv = stats.kv_cache_usage if stats else None
            limit = slo.ttft_p95_ms
            table.add_row(
                dep.id,
                f"{dep.engine} {(row.version if row else None) or '?'}",
                Text(state + gw_state, style="green" if state == "ready" else "yellow"),
                fmt.latency(stats.latency.ttft_s if stats and stats.latency else None,
                            limit_ms=limit),
                fmt.latency(percentiles_from(gw.get("ttft_s")) if gw.get("ttft_s") else None,
                            limit_ms=limit),
                "?" if queue is None else f"{queue:g}",
                "?" if kv is None else f"{kv:.0%}",
                str(gw.get("weight", dep.weight)),
                str(gw.get("inflight", "?")),
            )  # fmt: skip
        lines = Group(table, Text(self._data_plane(), style="dim"))
        if self.console.gateway_error:
            lines = Group(lines, Text(f"gateway: {self.console.gateway_error}", style="bold red"))
        self.query_one("#plan-table", Static).update(lines)
        self._draw_steps()

    def _data_plane(self) -> str:
        """Which data plane carries the model's traffic: the gateway's own columns (TTFT,
        in flight) mean something only when it is the built-in one."""
        model = next(m for m in self.console.fleet.models if m.name == self.model)
        if model.dataplane == "gateway":
            return "data plane: the built-in gateway (the gateway columns are its own)\n"
        plane = next((p for p in self.console.fleet.dataplanes if p.name == model.dataplane), None)
        kind = plane.kind if plane else "?"
        return (
            f"data plane {model.dataplane} ({kind}): the gateway drives it and is not in the "
            "traffic's path; its gateway columns show the weights its jobs set\n"
        )

    def _draw_steps(self) -> None:
        plan = next(m for m in self.console.fleet.models if m.name == self.model).failover
        mode = self.query_one("#mode", Select).value
        target = self.query_one("#target", Select).value
        if mode == "emergency":
            text = f"1. readiness of {target}  2. all weight to {target} at once  3. done"
        else:
            shifts = ", ".join(f"{p}%" for p in plan.steps)
            text = (
                f"1. preflight: {target} healthy, serves the model, canary meets the SLO, has room"
                f"\n2. warm-up: {plan.warmup_requests} requests\n3. shift {shifts}, each verified "
                f"for {plan.verify_s:g} s (a breach rolls back)\n4. drain the source "
                f"(up to {plan.drain_timeout_s:g} s)\n5. done"
            )
        self.query_one("#steps", Static).update(Text(text, style="dim"))

    @on(Select.Changed)
    def _changed(self, event: Select.Changed) -> None:
        self._draw_steps()
        if event.select.id == "target" and self.is_mounted:
            self._preflight()

    @on(Input.Changed, "#confirm")
    def _typed(self, event: Input.Changed) -> None:
        ready = event.value.strip() == self.model and self.job is None
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
        if self.job is not None:
            return
        if self.query_one("#confirm", Input).value.strip() != self.model:
            return
        self._start(str(self.query_one("#target", Select).value),
                    str(self.query_one("#mode", Select).value))  # fmt: skip

    @work(exclusive=True, group="failover")
    async def _start(self, target: str, mode: str) -> None:
        client = GatewayClient(self.console.fleet)
        try:
            self.job = await client.failover(self.model, target, mode, "from the console")
        except GatewayError as exc:
            self.notify(str(exc), title="failover refused", severity="error", timeout=15)
            return
        finally:
            await client.close()
        self.query_one("#go", Button).disabled = True
        self._draw_job()

    async def _tick(self) -> None:
        self._draw_plan()
        if self.job is None or self.job.get("state") not in (None, "running"):
            return
        client = GatewayClient(self.console.fleet)
        try:
            self.job = await client.job(self.job["id"])
        except GatewayError as exc:
            self.query_one("#progress", Static).update(Text(str(exc), style="red"))
            return
        finally:
            await client.close()
        self._draw_job()

    def _draw_job(self) -> None:
        job = self.job
        if job is None:
            return
        t = Text()
        took = time.time() - job.get("created", time.time())
        t.append(f"\njob {job['id']} {job['kind']}  ", style="bold")
        t.append(job["state"].upper(), style=STATE_STYLE.get(job["state"], ""))
        t.append(f"  {fmt.seconds(took)}\n")
        if job.get("dataplane_is"):
            t.append(f"  data plane: {job['dataplane_is']}\n", style="dim")
        for step in job.get("steps", []):
            t.append(f"  {step['name']:<12}", style="bold")
            t.append(f"{step['state']:<10}", style=STATE_STYLE.get(step["state"], ""))
            t.append(f" {step.get('detail') or ''}\n")
        if job.get("error"):
            t.append(f"{job['error']}\n", style="bold red")
        if job.get("after"):
            t.append(f"routes before {job.get('before')}  after {job.get('after')}\n")
        self.query_one("#progress", Static).update(t)
