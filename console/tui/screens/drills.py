"""Drills: TensorRT-LLM rebuild drills, their history and a drill's step timeline; and the
incident playbook that strings the existing jobs together.

The Drills screen lists each drill in fleet.toml with the state of its engine (current,
REBUILD REQUIRED, unknown provenance) and its last run; below, every drill job the agents
remember, and the selected one's steps as a bar chart of durations, live while it runs.
`R` runs the selected drill after a confirmation that names the drill, node and deployment.

The playbook (`p` on Models) is one guided flow for a stale or broken TensorRT-LLM
deployment: start a vLLM standby, fail over to it, run the rebuild drill, fail back when
it passed. Each step is the existing job; the checklist shows each one's state from the
live snapshots and the gateway (planned in console/collect/moves/playbook.py), and Enter starts
the next step, each behind its own confirmation.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from console.collect.clients.actions import ActionError
from console.collect.moves import playbook
from console.collect.moves.playbook import Check
from console.core.snapshot import Job, TrtEngine
from console.tui import format as fmt
from console.tui.built import ViewBuilt
from console.tui.columns import Fitted
from console.tui.host import ConsoleHost
from console.tui.polling import Poll
from console.tui.screens.base import ViewScreen
from console.tui.screens.jobtext import STATE_STYLE, job_note, step_bars, took
from console.tui.widgets.safe_static import SafeStatic
from console.tui.widgets.table import FleetTable, Row, empty_row

HISTORY_EVERY_S = 5.0


BADGE_STYLE = "bold black on yellow"


def stale_badge(trt: TrtEngine) -> str:
    """What a stale TensorRT-LLM deployment needs, as its badge says it: on the PyTorch
    backend there is no engine to build, so the new stack is validated against the
    baseline (RE-VALIDATE, the what-if's `re-validate`); on the engine backend, or where
    neither its manifest nor a drill says which it runs, REBUILD REQUIRED."""
    return " RE-VALIDATE " if trt.backend == "pytorch" else " REBUILD REQUIRED "


def trt_badge(trt: TrtEngine | None) -> Text:
    if trt is None:
        return Text("not checked", style="dim")
    if trt.state == "stale":
        return Text(stale_badge(trt), style=BADGE_STYLE)
    if trt.state == "current":
        return Text("current", style="green")
    if trt.build_key is not None:  # a manifest, but some facts could not be read
        return Text("not all checked", style="yellow")
    return Text("unknown provenance", style="yellow")


def trt_of(built: ViewBuilt, node: str, deployment: str) -> TrtEngine | None:
    state = built.states.get(node)
    snap = state.snapshot if state is not None else None
    if snap is None:
        return None
    return next((t for t in snap.trt_engines if t.deployment == deployment), None)


def drill_node(console: ConsoleHost, name: str) -> str | None:
    drill = console.fleet.drills.get(name)
    found = console.fleet.deployment(drill.deployment) if drill else None
    return found[1].node if found else None


class DrillsScreen(ViewScreen):
    where = "Drills"
    DEFAULT_CSS = """
    DrillsScreen #drill-defs { height: auto; max-height: 12; }
    DrillsScreen #drill-history { height: 1fr; max-height: 14; }
    DrillsScreen #drill-detail { height: 1fr; padding: 0 1; border-top: solid $panel-lighten-2; }
    """
    BINDINGS = [
        Binding("R", "run_drill", "run drill", id="run_drill"),
        Binding("enter", "open_job", "open job", show=False),
    ]
    DEFS = [
        ("DRILL", 18),
        ("NODE", 10),
        ("DEPLOYMENT", 16),
        ("PIPELINE", 9),
        ("PRECISION", 10),
        ("ENGINE", 20),
        ("LAST RUN", None),
    ]
    HISTORY = [
        ("JOB", 13),
        ("DRILL", 18),
        ("NODE", 10),
        ("STATE", 10),
        ("TOOK", 8),
        ("BY", 12),
        ("STEP / RESULT", None),
    ]
    # At 80 columns these go first (console/tui/columns.py): the ENGINE badge stays.
    DEFS_SPARE, HISTORY_SPARE = (4, 3, 1), (5, 4)

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[str, tuple[str, Job]] = {}  # job id -> (node, job), from agents
        self.problems: list[str] = []

    def compose_body(self) -> ComposeResult:
        self.defs = Fitted(self, self.DEFS, "drill-defs", self._redraw, self.DEFS_SPARE)
        self.jobs = Fitted(self, self.HISTORY, "drill-history", self._redraw, self.HISTORY_SPARE)
        yield from self.defs.compose()
        yield from self.jobs.compose()
        yield SafeStatic(id="drill-detail")

    def _redraw(self) -> None:
        self.redraw()

    def on_mount(self) -> None:
        super().on_mount()
        self.history_poll = Poll(self, HISTORY_EVERY_S, self.fetch_history, "drill-history")
        self.history_poll.now()

    async def fetch_history(self) -> None:
        if self.console.offline:  # a replay: the drill jobs are the recorded snapshots'
            return
        nodes = {n for n in (drill_node(self.console, d) for d in self.console.fleet.drills) if n}
        problems = []
        for node in sorted(nodes):
            declared = next((n for n in self.console.fleet.nodes if n.name == node), None)
            if declared is None or declared.agent is None:
                continue
            try:
                actions = self.console.agent_client(node)
            except Exception as exc:  # a token variable not set: say so, keep the rest
                problems.append(str(exc))
                continue
            try:
                for job in await actions.jobs(100):
                    if job.kind == "drill.run":
                        self.history[job.id] = (node, job)
            except ActionError as exc:
                problems.append(str(exc))
            finally:
                await actions.close()
        self.problems = problems
        if self.built is not None:
            self.draw(self.built)

    def _jobs(self, built: ViewBuilt) -> list[tuple[str, Job]]:
        """Drill jobs: the agents' history, updated by the snapshots' live copies."""
        found = dict(self.history)
        for node, state in built.states.items():
            for job in state.snapshot.jobs if state.snapshot else []:
                if job.kind == "drill.run":
                    found[job.id] = (node, job)
        return sorted(found.values(), key=lambda nj: nj[1].created or 0, reverse=True)

    def draw(self, built: ViewBuilt) -> None:
        if not (self.defs.ready() and self.jobs.ready()):
            return
        jobs = self._jobs(built)
        fit, width = self.defs.fit, dict(self.DEFS)
        defs: list[Row] = []
        for name, drill in self.console.fleet.drills.items():
            node = drill_node(self.console, name) or "?"
            last = next((j for _, j in jobs if j.params.get("drill") == name), None)
            cells = (
                fmt.fit(name, width["DRILL"] or 0, "bold"),
                fmt.fit(node, width["NODE"] or 0),
                fmt.fit(drill.deployment, width["DEPLOYMENT"] or 0),
                fmt.fit(drill.pipeline, width["PIPELINE"] or 0),
                fmt.fit(drill.precision, width["PRECISION"] or 0),
                trt_badge(trt_of(built, node, drill.deployment)),
                fmt.cut(_last_text(last), fit.room),
            )
            defs.append(Row(f"d:{name}", fit.pick(cells), {"drill": name, "node": node}, name))
        if not defs:
            why = "no [drills.NAME] in fleet.toml (docs/drills.md)"
            defs.append(empty_row(len(fit.shown), fmt.fit(why, fit.room).plain))
        self.query_one("#drill-defs", FleetTable).show(defs, self.filter)
        rows: list[Row] = []
        for node, job in jobs:
            note = job_note(job)
            fit, width = self.jobs.fit, dict(self.HISTORY)
            cells = (
                fmt.fit(job.id, width["JOB"] or 0, "bold"),
                fmt.fit(str(job.params.get("drill", "?")), width["DRILL"] or 0),
                fmt.fit(node, width["NODE"] or 0),
                Text(job.state, style=STATE_STYLE.get(job.state, "")),
                Text(took(job)),
                fmt.fit(job.who or "?", width["BY"] or 0),
                fmt.cut(note, fit.room),
            )
            fields = {"drill": job.params.get("drill"), "node": node, "state": job.state}
            rows.append(Row(f"{node}/{job.id}", fit.pick(cells), fields, f"{node} {job.id}"))
        self.query_one("#drill-history", FleetTable).show(rows, self.filter)
        self._draw_detail(jobs)

    def _draw_detail(self, jobs: list[tuple[str, Job]]) -> None:
        detail = self.query_one("#drill-detail", Static)
        picked = self._picked(jobs)
        t = Text()
        for problem in self.problems:
            t.append(f"{problem}\n", style="red")
        if picked is None:
            t.append("no drill has run yet: R runs the selected drill", style="dim")
            detail.update(t)
            return
        node, job = picked
        t.append(f"{job.params.get('drill')} ", style="bold")
        t.append(f"job {job.id} on {node}  ")
        t.append(job.state.upper(), style=STATE_STYLE.get(job.state, ""))
        t.append(f"  {took(job)}")
        key, cache = job.result.get("build_key"), job.result.get("cache")
        if key:
            t.append(f"  build key {key} (cache {cache})", style="dim")
        t.append("\n")
        t.append_text(step_bars(job.steps))
        gates = job.result.get("gates") or []
        if gates:
            t.append("gates  ")
            for gate in gates:
                t.append(
                    f"{gate['gate']} {'pass' if gate['ok'] else 'FAIL'}  ",
                    style="green" if gate["ok"] else "bold red",
                )
        if job.error:
            t.append(f"\n{job.error}", style="bold red")
        detail.update(t)

    def _picked(self, jobs: list[tuple[str, Job]]) -> tuple[str, Job] | None:
        row = self.query_one("#drill-history", FleetTable).selected()
        if row is not None and "/" in row.key:
            key = row.key.partition("/")[2]
            found = next((nj for nj in jobs if nj[1].id == key), None)
            if found is not None:
                return found
        running = next((nj for nj in jobs if nj[1].state in ("queued", "running")), None)
        return running or (jobs[0] if jobs else None)

    @on(DataTable.RowHighlighted, "#drill-history")
    def _highlighted(self, _: DataTable.RowHighlighted) -> None:
        if self.built is not None:
            self._draw_detail(self._jobs(self.built))

    @on(DataTable.RowSelected, "#drill-history")
    def _open(self, event: DataTable.RowSelected) -> None:
        key = str(event.row_key.value)
        if "/" in key:
            node, _, job_id = key.partition("/")
            self.console.open_job(node, job_id)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "run_drill" and (self.console.read_only or not self.console.fleet.drills):
            return None
        return True

    def action_run_drill(self) -> None:
        row = self.query_one("#drill-defs", FleetTable).selected()
        if row is None or "drill" not in row.fields:
            self.notify("select a drill in the upper table first", severity="warning")
            return
        self.console.run_drill(str(row.fields["drill"]))

    def action_open_job(self) -> None:
        row = self.query_one("#drill-history", FleetTable).selected()
        if row is not None and "/" in row.key:
            node, _, job_id = row.key.partition("/")
            self.console.open_job(node, job_id)


def _last_text(job: Job | None) -> Text:
    if job is None:
        return Text("never", style="dim")
    text = Text(job.state, style=STATE_STYLE.get(job.state, ""))
    rebuilt = job.result.get("time_to_rebuild_s")
    if rebuilt:
        text.append(f" in {fmt.seconds(rebuilt)}")
    if job.created:
        when = time.strftime("%m-%d %H:%MZ", time.gmtime(job.created))
        text.append(f"  {when}", style="dim")
    return text


# -- the playbook -----------------------------------------------------------------------


PLAY_STYLE = {
    "done": "green",
    "next": "bold cyan",
    "running": "cyan",
    "waiting": "dim",
    "failed": "bold red",
    "blocked": "yellow",
}
PLAY_MARK = {
    "done": "✔",
    "next": "▶",
    "running": "…",
    "waiting": "·",
    "failed": "✘",
    "blocked": "!",
}


class PlaybookScreen(ViewScreen):
    """The incident playbook for one model: a checklist over the existing jobs."""

    DEFAULT_CSS = """
    PlaybookScreen #playbook-head { height: auto; padding: 0 1; }
    PlaybookScreen #playbook { height: 1fr; }
    PlaybookScreen #playbook-step { height: auto; padding: 0 1; border-top: solid $panel; }
    """
    BINDINGS = [Binding("enter", "next_step", "do the step marked ▶", id="next_step")]
    COLUMNS = [("", 3), ("STEP", 30), ("STATE", 9), ("DETAIL", None)]

    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model
        self.where = f"Playbook {model}"
        self.checks: list[Check] = []

    def compose_body(self) -> ComposeResult:
        yield SafeStatic(id="playbook-head")
        yield FleetTable(self.COLUMNS, id="playbook")
        yield SafeStatic(id="playbook-step")  # the step to do, whole: the table cuts it

    def draw(self, built: ViewBuilt) -> None:
        self.checks = playbook.plan(
            self.console.fleet,
            self.model,
            built.view,
            built.states,
            built.gateway,
            built.gateway_jobs,
            built.gateway_error,
        )
        head = Text()
        head.append(f"Incident playbook: {self.model}\n", style="bold")
        head.append(
            "A stale or broken TensorRT-LLM deployment: move its traffic to vLLM, rebuild, "
            "move it back. Enter does the step marked ▶, each behind its own confirmation.",
            style="dim",
        )
        self.query_one("#playbook-head", Static).update(head)
        rows = []
        # The detail gets what the fixed columns leave (cut with an ellipsis; the step to
        # do is shown whole below the table).
        room = (self.size.width or 80) - 3 - sum(w or 0 for _, w in self.COLUMNS)
        for i, check in enumerate(self.checks, 1):
            style = PLAY_STYLE.get(check.state, "")
            cells = (
                Text(f" {PLAY_MARK.get(check.state, ' ')}", style=style),
                Text(f"{i}. {check.name}", style=style),
                Text(check.state, style=style),
                fmt.fit(check.detail, max(room, 8)),
            )
            rows.append(Row(str(i), cells, {"state": check.state}, check.name))
        self.query_one("#playbook", FleetTable).show(rows)
        step = next((c for c in self.checks if c.state == "next"), None) or next(
            (c for c in self.checks if c.state != "done"), None
        )
        shown = Text()
        if step is not None:
            n = self.checks.index(step) + 1
            shown.append(f"{PLAY_MARK.get(step.state, ' ')} {n}. {step.name} ({step.state}): ",
                         style=PLAY_STYLE.get(step.state, "bold"))  # fmt: skip
            shown.append(step.detail)
        self.query_one("#playbook-step", Static).update(shown)

    @on(DataTable.RowSelected, "#playbook")
    def _selected(self, _: DataTable.RowSelected) -> None:
        self.action_next_step()

    def action_next_step(self) -> None:
        step = next((c for c in self.checks if c.state == "next" and c.action), None)
        if step is None:
            holding = next((c for c in self.checks if c.state != "done"), None)
            why = f"{holding.name}: {holding.detail}" if holding else "every step is done"
            self.notify(f"nothing to do now: {why}", severity="information")
            return
        console = self.console
        found = console.fleet.deployment(step.target) if step.target else None
        if step.action == "start_standby" and found is not None:
            console.start_vllm(node=found[1].node, model=self.model)
        elif step.action in ("fail_over", "fail_back"):
            # The plan opens on the step's target; a failover drains the step's source onto
            # it, so that in a model with replicas the others keep their traffic.
            console.fail_over(self.model, step.target, source=step.source)
        elif step.action == "run_drill" and step.target is not None:
            drill = playbook.drill_rebuilding(console.fleet, step.target)
            if drill is not None:
                console.run_drill(drill)
