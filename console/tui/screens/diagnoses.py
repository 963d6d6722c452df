"""Diagnoses: the named problems the console found (console/collect/diagnose/diagnoser.py), worst
first, and one diagnosis whole: its evidence (each figure, where it was measured, how
old), what would rule it out, and its moves in order.

The moves are made from here, each through the console's own plan, form or confirmation,
filled in: `f` fails over (the failover plan for the diagnosis's model, draining its
deployment, as the playbook opens it), `w` quarantines its deployment (the same plan,
planned: weight 0 at the gateway), `r` restarts its engine, `s` starts a standby (the
Start vLLM form on the profile of the model's standby deployment), `D` runs its
deployment's rebuild drill. Once the job has started (not when a screen merely opened),
the diagnosis is verified from then on (verifying, resolved, still there). Escalating is
shown with the commands to run on the node. A read-only console (the web view, replay)
shows all of it and refuses the moves.
"""

from __future__ import annotations

import time
from dataclasses import replace

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import DataTable

from console.collect.clients.gateway_client import GatewayClient
from console.collect.diagnose.diagnoser import Diagnosis
from console.collect.diagnose.output import move_hint as command_hint
from console.collect.moves.failover_targets import rank
from console.collect.views.gateway_view import GatewayDeployment
from console.core import diagnosis as d
from console.core.config.load import Model
from console.tui import format as fmt
from console.tui.built import ViewBuilt
from console.tui.columns import Fitted
from console.tui.screens.base import ViewScreen
from console.tui.screens.failover import FailoverScreen
from console.tui.widgets.safe_static import SafeStatic
from console.tui.widgets.table import FleetTable, Row, empty_row

SEVERITY = {"critical": ("CRIT", "bold white on red"), "warning": ("WARN", "bold yellow")}
STATE_STYLE = {"active": "", "verifying": "cyan", "resolved": "green", "still there": "bold red"}


def _key(x: Diagnosis) -> str:
    return f"{x.kind.name}/{x.subject}"  # a class's name has no "/"


def _ago(now: float, then: float) -> str:
    """How long a diagnosis has held, in whole units: 0s, 26s, 5m, 2.5h."""
    held = max(0.0, now - then)
    if held < 60:
        return f"{held:.0f}s"
    return f"{held / 60:.0f}m" if held < 3600 else f"{held / 3600:.1f}h"


def state_text(x: Diagnosis, now: float) -> Text:
    """active 5m; verifying failover (12 s); resolved 40 s after failover; still there ..."""
    if x.state == "active":
        return Text(f"active {_ago(now, x.since)}")
    return Text(x.detail or x.state, style=STATE_STYLE.get(x.state, ""))


def title_text(x: Diagnosis) -> str:
    return x.kind.title + (f" ({x.cause})" if x.cause else "")


class DiagnosesScreen(ViewScreen):
    where = "Diagnoses"
    DEFAULT_CSS = """
    DiagnosesScreen #diagnoses-note { height: auto; max-height: 8; padding: 0 1; }
    """

    def columns(self) -> list[tuple[str, int | None]]:
        """At 80 columns each fits; wider, the diagnosis and its subject grow first (a
        model's name is long), and the state gets the rest: a "still there" says what
        still holds."""
        grow = min(max(0, self.app.size.width - 80) // 3, 24)
        return [("SEV", 5), ("DIAGNOSIS", 26 + grow), ("SUBJECT", 19 + grow),
                ("FIRST MOVE", 11), ("STATE / SINCE", None)]  # fmt: skip

    def compose_body(self) -> ComposeResult:
        self.fitted = Fitted(self, self.columns(), "diagnoses", self._redraw)
        yield from self.fitted.compose()
        yield SafeStatic(id="diagnoses-note")

    def _redraw(self) -> None:
        self.redraw()

    def draw(self, built: ViewBuilt) -> None:
        if (spec := self.columns()) != self.fitted.spec:  # the width changed: laid out anew
            self.fitted.spec, self.fitted.fit = spec, replace(self.fitted.fit, room=-1)
        if not self.fitted.ready():
            return
        found = built.findings
        now, fit, width = found.now, self.fitted.fit, dict(self.fitted.spec)
        rows = []
        for x in found.found:
            word, style = SEVERITY[x.kind.severity]
            if x.state == "resolved":
                word, style = "ok", "green"
            cells = (
                Text(word, style=style),
                fmt.fit(title_text(x), width["DIAGNOSIS"] or 0, "bold"),
                fmt.fit(x.subject, width["SUBJECT"] or 0),
                Text(x.moves[0] if x.moves else "-", style="cyan"),
                fmt.cut(fmt.safe(state_text(x, now)), fit.room),
            )
            fields = {"severity": x.kind.severity, "name": x.kind.name, "subject": x.subject,
                      "node": x.node or "", "model": x.model or "", "state": x.state}  # fmt: skip
            rows.append(Row(_key(x), fit.pick(cells), fields, f"{x.headline()} {x.node or ''}"))
        if not rows:
            why = (
                "not looked yet: waiting for every node's first answer"
                if not found.looked
                else "nothing that the classes of docs/diagnoses.md look for"
            )
            rows.append(empty_row(len(fit.shown), fmt.fit(why, max(fit.room, 16)).plain))
        self.query_one(FleetTable).show(rows, self.filter)
        note = Text("Enter: the evidence, what rules it out, the moves", style="dim")
        # What could not be told, one line a class and a missing figure: a fleet of Triton
        # engines (no token counter) would fill the screen with one line each.
        blind: dict[tuple[str, str], list[str]] = {}
        for c in found.cannot_tell:
            blind.setdefault((c.name, c.needs), []).append(c.subject)
        room = max(20, self.size.width - 2)
        for (name, needs), subjects in blind.items():
            title = d.BY_NAME[name].title if name in d.BY_NAME else name
            line = f"cannot tell {title} (needs {needs}): {', '.join(subjects)}"
            note.append("\n")
            note.append_text(fmt.fit(line, room, "yellow"))
        self.query_one("#diagnoses-note", SafeStatic).update(note)

    @on(DataTable.RowSelected, "#diagnoses")
    def _open(self, event: DataTable.RowSelected) -> None:
        key = str(event.row_key.value)
        if "/" in key:
            name, _, subject = key.partition("/")
            self.app.push_screen(DiagnosisScreen((name, subject)))


class DiagnosisScreen(ViewScreen):
    """One diagnosis, whole, redrawn with each view (its state moves on after a move)."""

    DEFAULT_CSS = """
    DiagnosisScreen #diagnosis-scroll { height: 1fr; }
    DiagnosisScreen #diagnosis { padding: 0 1; }
    """
    # Each shows only where the move applies to this diagnosis (check_action); the action
    # names are the read-only consoles' (console/tui/readonly.py), which refuse them.
    BINDINGS = [
        # Short: at 80 columns the footer names three of them beside the app's keys.
        Binding("f", "fail_over", "fail over (plan)", id="fail_over"),
        Binding("w", "quarantine", "quarantine (plan)", id="quarantine"),
        Binding("r", "restart_engine", "restart (confirm)", id="restart_engine"),
        Binding("s", "start_vllm", "start (form)", id="start_vllm"),
        Binding("D", "run_drill", "drill (confirm)", id="diagnosis_drill"),
        Binding("e", "escalate", "escalate (copy)", id="escalate"),
    ]
    KEYED = ("f:", "w:", "r:", "s:", "D:", "e:")  # a move's line that names this screen's key

    def __init__(self, key: tuple[str, str]) -> None:
        super().__init__()
        self.key = key
        self.where = f"Diagnosis {key[1]}"
        self.diagnosis: Diagnosis | None = None
        # The plan this screen opened, and the move it makes (failover, quarantine).
        self._plan: tuple[FailoverScreen, d.Move] | None = None

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="diagnosis-scroll"):
            yield SafeStatic(id="diagnosis")

    def draw(self, built: ViewBuilt) -> None:
        found = built.findings
        before, self.diagnosis = self.diagnosis, found.get(self.key)
        x = self.diagnosis
        if (before is None) != (x is None):
            self.refresh_bindings()  # f shows only while there is a model to fail over
        if x is None:
            name, subject = self.key
            title = d.BY_NAME[name].title if name in d.BY_NAME else name
            gone = f"{title}: {subject} is no longer found (its condition went). Esc: back"
            self.query_one("#diagnosis", SafeStatic).update(Text(gone, style="green"))
            return
        self.query_one("#diagnosis", SafeStatic).update(self.text(x, found.now))

    def text(self, x: Diagnosis, now: float) -> Text:
        word, style = SEVERITY[x.kind.severity]
        t = Text()
        t.append(f" {word} ", style=style)
        t.append(f" {title_text(x)}: {x.subject}\n", style="bold")
        since = time.strftime("%H:%M:%S", time.localtime(x.since))
        if x.state == "active":
            t.append(f"active since {since} ({_ago(now, x.since)})")
        else:
            t.append(f"first seen {since} ({_ago(now, x.since)} ago)  ")
            t.append_text(state_text(x, now))
        t.append(f"\n{x.kind.summary}\n", style="dim")
        t.append("\nEVIDENCE\n", style="bold")
        # Figure, value, then where it was measured and how old it is, each a column.
        wide = min(max((len(e.figure) for e in x.evidence), default=0), 28)
        values = min(max((len(e.value) for e in x.evidence), default=0), 40)
        for e in x.evidence:
            t.append(f"  {e.figure:<{wide}}  ", style="bold")
            t.append(f"{e.value:<{values}}  ")
            t.append(f"at {e.at}, ", style="dim")
            t.append_text(Text("age unknown", style="yellow") if e.age_s is None
                          else fmt.age(e.age_s) + Text(" old", style="dim"))  # fmt: skip
            t.append("\n")
        t.append("\nRULES IT OUT\n", style="bold")
        t.append(f"  {x.kind.rules_out}\n")
        t.append("\nMOVES, IN ORDER\n", style="bold")
        for n, move in enumerate(x.moves, 1):
            t.append(f"  {n}. {d.MOVE_TEXT[move]}\n")
            hint = self.hint(x, move)
            if hint:
                key = hint.startswith(self.KEYED)
                t.append(f"     {hint}\n", style="cyan" if key else "dim")
        return t

    def hint(self, x: Diagnosis, move: d.Move) -> str:
        """Where the move is made: this screen's key, else the command that makes it."""
        command = (
            command_hint(self.console.fleet, x, move).strip().removeprefix("(").removesuffix(")")
        )
        drains = {"failover": self._failover, "quarantine": self._quarantine}.get(move)
        if drains is not None and (plan := drains(x)) is not None:
            command = command.partition(";")[0]
            if self.console.read_only:
                return f"read-only here: {command}, from a console that may act"
            if not GatewayClient.configured(self.console.fleet):
                return f"needs the gateway: [gateway] in fleet.toml, its token set ({command})"
            model, source, target = plan
            if move == "quarantine":
                onto = target or "the others"
                return f"w: the plan draining {source} to weight 0, onto {onto}, planned"
            drain = f", draining {source}" if source else ""
            return f"f: the failover plan for {model}{drain}"
        if move == "failover" and x.node and not x.model:  # a GPU: which model runs there
            return f":node {x.node} shows what runs on it; then f on Models for that model"
        if move == "restart" and (where := self._restartable(x)) is not None:
            if self.console.read_only:
                return "read-only here: restart it from a console that may act"
            return f"r: restart {where[1]} on {where[0]} (asks first; its agent's job)"
        if move == "start" and (again := self._again(x)) is not None:
            node, profile = again
            if self.console.read_only:
                return f"read-only here: {command}, from a console that may act"
            return f"s: start {profile} on {node} again (the Start vLLM form)"
        if move == "standby" and self._again(x) is None and (standby := self._standby(x)):
            node, profile, deployment = standby
            if self.console.read_only:
                return f"read-only here: :start {x.model}, from a console that may act"
            named = f" (profile {profile}, the Start vLLM form)"
            if deployment:  # at 80 columns the line fits where the two names are one
                form = " (the Start vLLM form)" if deployment == profile else named
                return f"s: start standby {deployment} on {node}{form}"
            return f"s: start {profile} on {node} (the Start vLLM form)"
        if move == "standby" and x.model:
            return f":start {x.model} (the Start vLLM form)"
        if move == "drill" and (drill := self._drill(x)) is not None:
            if self.console.read_only:
                command = f"engineroom drill run {drill[0]}"
                return f"read-only here: {command}, from a console that may act"
            return f"D: run drill {drill[0]} on {drill[1]} (asks first; its agent's job)"
        if move == "drill" and x.deployment:
            return f"no drill rebuilds {x.deployment}: [drills.NAME] in fleet.toml (docs/drills.md)"
        if move == "drill":
            return ":drills, then R on its drill"
        if move == "escalate" and (lines := self._escalation(x)) is not None:
            return f"e: copy the commands to run on {x.node} ({'; '.join(lines)})"
        return command

    # -- where each move applies (None: it does not) ---------------------------------------

    def _model(self, x: Diagnosis | None) -> Model | None:
        """The diagnosis's declared model."""
        name = x.model if x is not None else None
        return next((m for m in self.console.fleet.models if m.name == name), None)

    def _failover(self, x: Diagnosis | None) -> tuple[str, str | None, str | None] | None:
        """(model, the deployment to drain, onto which) for the plan; None when this
        diagnosis names no declared model to fail over."""
        model = self._model(x)
        if x is None or model is None or "failover" not in x.moves:
            return None
        if x.deployment not in [dep.id for dep in model.deployments]:
            return model.name, None, None
        return self._drain(model, str(x.deployment))

    def _quarantine(self, x: Diagnosis | None) -> tuple[str, str | None, str | None] | None:
        """The plan that drains the diagnosis's deployment to weight 0: where quarantine
        is one of its moves and it names a deployment of a declared model."""
        model = self._model(x)
        if x is None or model is None or "quarantine" not in x.moves:
            return None
        if x.deployment not in [dep.id for dep in model.deployments]:
            return None
        return self._drain(model, str(x.deployment))

    def _drain(self, model: Model, source: str) -> tuple[str, str | None, str | None]:
        """(model, source, onto which): onto the others in proportion where one of them
        carries weight and is up (the gateway's rule for a drain), else onto the
        healthiest of them, as the plan ranks them."""
        gateway = self.built.gateway if self.built is not None else None
        live = (gateway.routes(model.name) if gateway is not None else None) or {}
        others = [dep for dep in model.deployments if dep.id != source]
        if any(_carries(live.get(dep.id), dep.weight) for dep in others):
            return model.name, source, None  # the others share its weight, in proportion
        rows = self.built.view.models.get(model.name, []) if self.built is not None else []
        best = rank(model, rows, live or None, [source])
        return model.name, source, best[0].id if best else None

    def _restartable(self, x: Diagnosis | None) -> tuple[str, str] | None:
        """(node, engine) when restarting its engine is one of the diagnosis's moves."""
        if x is None or "restart" not in x.moves or not x.node or not x.engine:
            return None
        return x.node, x.engine

    def _again(self, x: Diagnosis | None) -> tuple[str, str] | None:
        """(node, profile) where starting the failed profile again is a move (`s` makes it,
        before a standby) and fleet.toml still declares the profile."""
        if x is None or "start" not in x.moves or x.profile is None:
            return None
        profile = self.console.fleet.profiles.get(x.profile)
        if profile is None or profile.engine != "vllm":
            return None
        return profile.node, x.profile

    def _start(self, x: Diagnosis | None) -> tuple[str, d.Move] | None:
        """The profile `s` opens the Start vLLM form on, and the move that makes."""
        if (again := self._again(x)) is not None:
            return again[1], "start"
        if (standby := self._standby(x)) is not None:
            return standby[1], "standby"
        return None

    def _standby(self, x: Diagnosis | None) -> tuple[str, str, str | None] | None:
        """(node, profile, deployment) the Start vLLM form opens on: the launch profile of
        a standby deployment of the model (weight 0 in fleet.toml, its profile named), else
        of another deployment of it, else the model's first vLLM profile (no deployment);
        None where starting a standby is not a move or no vLLM profile serves the model."""
        if x is None or "standby" not in x.moves or not x.model:
            return None
        profiles = {name: p for name, p in self.console.fleet.profiles.items()
                    if p.engine == "vllm" and p.served_model_name == x.model}  # fmt: skip
        if not profiles:
            return None
        model = self._model(x)
        deployments = model.deployments if model is not None else []
        named = [dep for dep in deployments if dep.profile in profiles and dep.id != x.deployment]
        if named:
            dep = min(named, key=lambda dep: dep.weight != 0)  # a standby (weight 0) first
            profile = str(dep.profile)
            return profiles[profile].node, profile, dep.id
        name = next(iter(profiles))
        return profiles[name].node, name, None

    def _drill(self, x: Diagnosis | None) -> tuple[str, str] | None:
        """(drill, node) where the rebuild drill is a move and fleet.toml declares one for
        the diagnosis's deployment."""
        if x is None or "drill" not in x.moves or not x.deployment:
            return None
        fleet = self.console.fleet
        for name, drill in fleet.drills.items():
            if drill.deployment == x.deployment and (found := fleet.deployment(x.deployment)):
                return name, found[1].node
        return None

    def _escalation(self, x: Diagnosis | None) -> list[str] | None:
        """The commands to gather what the GPU's vendor asks for (d.escalation_commands)."""
        if x is None or "escalate" not in x.moves or not x.node:
            return None
        return d.escalation_commands(self.console.fleet, x.node)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "escalate":  # copies text: read-only consoles may too
            return self._escalation(self.diagnosis) is not None
        applies = {
            "fail_over": self._failover,
            "quarantine": self._quarantine,
            "restart_engine": self._restartable,
            "start_vllm": self._start,
            "run_drill": self._drill,
        }.get(action)
        if applies is None:
            return True
        if applies(self.diagnosis) is None:
            return False  # not this diagnosis's move: the move's line says where to look
        return None if self.console.read_only else True

    # -- making them -------------------------------------------------------------------------

    def _moved(self, key: tuple[str, str], move: d.Move) -> None:
        """The move's job started: the diagnosis is verified from now."""
        self.console.diagnosis_moved(key, move)

    def action_fail_over(self) -> None:
        x = self.diagnosis
        plan = self._failover(x)
        if x is None or plan is None:
            self.notify("no model to fail over for this diagnosis", severity="warning")
            return
        # A critical diagnosis (a wedged engine, a GPU off the bus) is an emergency: a
        # verified shift in steps would keep sending part of the traffic into the fault.
        mode = "emergency" if x.kind.severity == "critical" else "planned"
        self._open_plan(x, plan, mode, "failover")

    def action_quarantine(self) -> None:
        x = self.diagnosis
        plan = self._quarantine(x)
        if x is None or plan is None:
            self.notify("no deployment to quarantine for this diagnosis", severity="warning")
            return
        # Planned: the weight goes in verified steps, whatever the class's severity (an
        # emergency takes it off at once: that is `f`).
        self._open_plan(x, plan, "planned", "quarantine")

    def _open_plan(
        self, x: Diagnosis, plan: tuple[str, str | None, str | None], mode: str, move: d.Move
    ) -> None:
        model, source, target = plan
        reason = f"diagnosis {x.kind.name} on {x.subject}"
        self.console.fail_over(model, target, source=source, mode=mode, reason=reason)
        top = self.app.screen_stack[-1]
        # The plan, when the console opened one (a read-only one refuses and opens none).
        self._plan = (top, move) if isinstance(top, FailoverScreen) else None

    def on_screen_resume(self) -> None:
        # Back from the plan: a job it started is the move; closed without one, nothing
        # was done. (ViewScreen's own handler draws the screen after this.)
        opened, self._plan = self._plan, None
        if opened is not None and opened[0].job is not None:
            self._moved(self.key, opened[1])

    def action_restart_engine(self) -> None:
        x = self.diagnosis
        where = self._restartable(x)
        if x is None or where is None:
            self.notify("no engine to restart for this diagnosis", severity="warning")
            return
        key = x.key
        self.console.stop_engine(*where, restart=True, started=lambda: self._moved(key, "restart"))

    def action_start_vllm(self) -> None:
        x = self.diagnosis
        start = self._start(x)
        if x is None or start is None:
            self.notify("no vLLM launch profile for this diagnosis", severity="warning")
            return
        (profile, move), key = start, x.key
        self.console.start_vllm(model=x.model, profile=profile,
                                started=lambda: self._moved(key, move))  # fmt: skip

    def action_escalate(self) -> None:
        """Escalating as hardware runs nothing here: the commands go to the terminal's
        clipboard (OSC 52, which tmux and most terminals pass on) and onto the screen."""
        x = self.diagnosis
        lines = self._escalation(x)
        if x is None or lines is None:
            self.notify("nothing to escalate for this diagnosis", severity="warning")
            return
        self.app.copy_to_clipboard("\n".join(lines) + "\n")
        self.notify("copied (OSC 52) for the GPU's vendor:\n" + "\n".join(lines), timeout=15)

    def action_run_drill(self) -> None:
        x = self.diagnosis
        drill = self._drill(x)
        if x is None or drill is None:
            self.notify("no drill declared for this diagnosis's deployment", severity="warning")
            return
        key = x.key
        self.console.run_drill(drill[0], started=lambda: self._moved(key, "drill"))


def _carries(gw: GatewayDeployment | None, declared: int) -> bool:
    """Whether a deployment carries weight and is up at the gateway: its live weight,
    else the declared one; unknown (not read yet) counts as up."""
    if gw is None:
        return bool(declared)
    weight = gw.weight if gw.weight is not None else declared
    return bool(weight) and not gw.down
