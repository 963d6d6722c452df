"""The console: a Textual app over the fleet collector.

The collector polls in the app's event loop, each node with its own timeout, so a hung
node never blocks a key press. The app is the source's one subscriber; once per refresh
it builds one FleetView, puts it with all a screen draws into one ViewBuilt
(console/tui/built.py) and hands that to the screen on top; hidden screens and open
dialogs are not redrawn.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from textual import events, on
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.driver import Driver
from textual.notifications import SeverityLevel
from textual.screen import ModalScreen, Screen
from textual.widgets import Input

from console.collect import tune_gc
from console.collect.prometheus.source import fleet_source
from console.collect.recordings.recorder import Recorder, open_writer
from console.collect.sources.collector import NodeState
from console.collect.sources.source import FleetSource
from console.collect.views.alerts import EventLog
from console.collect.views.gateway_view import GatewaySnapshot, GatewayView
from console.collect.views.operator_actions import ActionTracker, GatewayActions, event_of
from console.collect.views.view import FleetView, ViewBuilder
from console.core.config.load import Fleet
from console.core.diagnosis import Move
from console.core.safetext import for_terminal
from console.tui import format as fmt
from console.tui.built import Header, ViewBuilt, source_note, source_problem
from console.tui.diagnosing import ConsoleDiagnoses
from console.tui.filtering import FilterError, parse_filter
from console.tui.host import ConsoleHost
from console.tui.polling import Poll
from console.tui.screens.base import ViewScreen
from console.tui.screens.diagnoses import DiagnosesScreen, DiagnosisScreen
from console.tui.screens.drills import DrillsScreen, PlaybookScreen
from console.tui.screens.events import EventsScreen
from console.tui.screens.failover import FailoverScreen
from console.tui.screens.fleet import FleetScreen
from console.tui.screens.gpus import GpusScreen
from console.tui.screens.help import HelpScreen
from console.tui.screens.jobs import JobScreen, JobsScreen, StartVllmScreen
from console.tui.screens.models import ModelsScreen
from console.tui.screens.node import NodeScreen
from console.tui.screens.rollouts import RolloutsScreen
from console.tui.terminal.driver import DiffDriver, output_to_devnull
from console.tui.widgets.command_line import CommandLine
from console.tui.widgets.confirm import ConfirmScreen
from console.tui.workflows import Workflows, delegate

VIEWS = {
    "nodes": FleetScreen,
    "fleet": FleetScreen,
    "gpus": GpusScreen,
    "models": ModelsScreen,
    "events": EventsScreen,
    "jobs": JobsScreen,
    "drills": DrillsScreen,
    "diag": DiagnosesScreen,
    "rollouts": RolloutsScreen,
}


EXIT_GRACE_S = 5.0  # the longest a console's exit may take (see EngineroomApp.exit)
# --slow-link: the screen is redrawn this often at most (or at the fleet's refresh_s if
# longer); the fleet is still read, and its alerts judged, at every refresh.
SLOW_LINK_REDRAW_S = 5.0

# The `:` commands, (usage, what): help and the unknown-command hint list these.
COLON_COMMANDS: list[tuple[str, str]] = [
    ("nodes", "the fleet: nodes and the GPU heat grid"),
    ("gpus", "every GPU as a row"),
    ("models", "each model with all its deployments, side by side"),
    ("jobs", "starts, stops, restarts and drills on the agents; the gateway's failovers"),
    ("drills", "rebuild drills and their reports"),
    ("events", "alerts raised and cleared, and operator actions"),
    ("diag", "diagnoses: the named problems, their evidence and the moves to make"),
    ("rollouts", "the gateway's rollouts: waves, steps, figures; pause, resume, abort"),
    ("model NAME", "TTFT and ITL p95 over time for one model"),
    ("node NAME", "one node: GPUs with history, engines, host, versions"),
    ("engine NODE/ID", "one engine: versions, state, configuration"),
    ("job NODE/ID", "one job: its steps and its log"),
    ("start [MODEL]", "the Start vLLM form"),
    ("help", "every key and command (also ?)"),
    ("quit", "leave (the fleet is untouched)"),
]

# Where the screens' own keys work, in the order help lists them.
KEY_PLACES: list[tuple[str, type]] = [
    ("on Models", ModelsScreen),
    ("on a node", NodeScreen),
    ("on Drills", DrillsScreen),
    ("in a playbook", PlaybookScreen),
    ("on a diagnosis", DiagnosisScreen),
    ("on a job", JobScreen),
    ("on Rollouts", RolloutsScreen),
    ("in the Start vLLM form", StartVllmScreen),
    ("in the failover plan", FailoverScreen),
    ("in a confirmation", ConfirmScreen),
]


class EngineroomApp(App[int]):
    CSS_PATH = Path(__file__).with_name("app.tcss")  # whole: subclasses live in other folders
    TITLE = "engineroom"
    ENABLE_COMMAND_PALETTE = True
    gateway_snapshot = GatewaySnapshot()  # the gateway's JSON; set, it is parsed into:
    gateway: GatewayView | None = None  # what the screens read (console.collect.views.gateway_view)
    BINDINGS = [
        Binding("colon", "command", "command", id="command"),
        Binding("slash", "filter", "filter", id="filter"),
        # priority: Esc must work whatever holds the focus (a plot, a table, the command line)
        Binding("escape", "go_back", "back", id="back", priority=True),
        Binding("question_mark", "help", "keys", id="help"),
        Binding("n", "goto('nodes')", "nodes", id="nodes"),
        Binding("g", "goto('gpus')", "gpus", id="gpus"),
        Binding("m", "goto('models')", "models", id="models"),
        Binding("v", "goto('events')", "events", id="events"),
        Binding("j", "goto('jobs')", "jobs", id="jobs"),
        Binding("d", "goto('drills')", "drills", id="drills"),
        # The header's "diag N": one key from any screen to what is wrong.
        Binding("exclamation_mark", "goto('diag')", "diagnoses", id="diag"),
        Binding("o", "goto('rollouts')", "rollouts", id="rollouts"),
        Binding("q", "quit", "quit", id="quit"),
        Binding("ctrl+l", "redraw", "redraw", id="redraw", show=False),
    ]

    offline = False  # a replay: no agent, gateway or role is asked anything
    terminal_driver: DiffDriver | None = None  # set by the driver, on a terminal
    # Set by run_tui (a console in its own process): what to clean up if exit blocks.
    exit_watchdog: Callable[[], object] | None = None
    _exiting = False

    def __init__(
        self,
        fleet: Fleet,
        *,
        read_only: bool = False,
        collector: FleetSource | None = None,
        record: str | Path | None = None,
        slow_link: bool = False,
    ) -> None:
        super().__init__()
        self.fleet = fleet
        self.read_only = read_only or fleet.read_only
        self.simulated = "SIMULATED" in fleet.fleet.name.upper()
        self.collector: FleetSource = collector or fleet_source(fleet)
        self.recorder: Recorder | None = None
        if record is not None:  # --record FILE: what this console sees goes to a recording
            writer = open_writer(fleet, record, "console")
            names = (n.name for n in fleet.nodes)
            self.recorder = Recorder(writer, self.collector.refresh_s, names)
        self.events = EventLog()
        self.actions = ActionTracker()  # operator actions seen, for Events (as a recording)
        self.gateway_actions = GatewayActions(self.actions)  # its failover jobs, its audit
        self.view: FleetView | None = None
        self.built: ViewBuilt | None = None  # the last view and what screens draw with it
        # Redoes only the nodes that changed, each tick; holds alerts to their hysteresis
        # (a replay shows the recording's alerts, at the recording's times).
        self.views = ViewBuilder(fleet, hold=not self.offline)
        self.refresh_s = self.collector.refresh_s
        # --slow-link: redraw less, and nothing that moves by itself (docs/scale.md).
        self.slow_link = slow_link
        self.redraw_s = max(SLOW_LINK_REDRAW_S, self.refresh_s) if slow_link else None
        if slow_link:
            self.animation_level = "none"
        # The source's one subscriber (a caller's own, a benchmark's, is told after it).
        self._told_too, self.collector.on_update = self.collector.on_update, self._node_updated
        self.tick_ms: deque[tuple[float, float]] = deque(maxlen=300)  # (build, draw)
        self.roles: dict[str, str] = {}  # node -> the role its token has on the agent
        self.gateway_snapshot = None  # the gateway's routes and measures; `gateway` parsed
        self.gateway_error: str | None = None
        self.gateway_role: str | None = None  # what our gateway token may do, once asked
        self.diagnoses = ConsoleDiagnoses(fleet, self.offline)  # updated once per view
        self.workflows = Workflows(self)  # where screens go, what the operator does: below

    async def on_mount(self) -> None:
        if self.fleet.keys:
            self.set_keymap(self.fleet.keys)
        await self.collector.__aenter__()
        self.collector.start()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            # The SSH session went away: leave cleanly instead of writing to a dead tty.
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._hung_up)
        self.tick()
        self.screen_change_signal.subscribe(self, self._screen_changed)
        await self.push_screen(FleetScreen())
        tune_gc()  # the sources have asked by now: the collection waits with them
        if not self.read_only:
            self.run_worker(self._learn_roles(), group="roles")
        from console.collect.clients.gateway_client import GatewayClient

        if GatewayClient.configured(self.fleet) and not self.offline:
            # The next poll starts once this one answered: a slow gateway is still shown.
            self.gateway_poll = Poll(self, self.refresh_s, self._gateway_once, "gateway")
            self.gateway_poll.now()
        # A source that reads in refreshes is drawn as each lands, not up to a refresh
        # later (at 10,000 nodes the first read lands ~2 s in; the timer could add 2 s).
        # Its timer is then only for ages and staleness when refreshes stop landing: at
        # the refresh, it drew most refreshes twice (its tick and the landing's).
        every = self.refresh_s * (2 if self.collector.refreshes else 1)
        self._ticker = self.set_interval(every, self.tick)
        self.collector.on_refreshed = self._refresh_landed

    def get_driver_class(self) -> type[Driver]:
        """Textual's terminal driver, writing only the cells that changed (issue 28: the
        console over an SSH link); any other (the web view's, the tests', one named in
        TEXTUAL_DRIVER) as it is."""
        driver = super().get_driver_class()
        if driver.__name__ == "LinuxDriver" and not os.environ.get("TEXTUAL_DRIVER"):
            return DiffDriver
        return driver

    def _hung_up(self) -> None:
        """The terminal is gone: what is still written goes to /dev/null, then leave."""
        output_to_devnull()
        self.exit(return_code=129)  # 128 + SIGHUP, as a shell reports a hung-up process

    def exit(self, *args: Any, **kwargs: Any) -> None:
        """Leave, within EXIT_GRACE_S when this is a console of its own (`exit_watchdog`).

        Textual's exit can block for good writing its last bytes to the terminal (seen:
        a console that outlived its SSH session and ignored SIGTERM, a demo that did not
        end after `q`). The watchdog ends the process then, after `exit_watchdog()` has
        cleaned up (the demo stops its simulated fleet)."""
        if self.exit_watchdog is not None and not self._exiting:
            cleanup = self.exit_watchdog

            def watchdog() -> None:
                time.sleep(EXIT_GRACE_S)
                with contextlib.suppress(Exception):
                    cleanup()
                os._exit(kwargs.get("return_code") or 1)

            threading.Thread(target=watchdog, name="exit-watchdog", daemon=True).start()
        self._exiting = True
        super().exit(*args, **kwargs)

    async def on_unmount(self) -> None:
        await self.collector.__aexit__(None, None, None)
        if self.recorder is not None:
            await asyncio.to_thread(self.recorder.writer.close)

    def _node_updated(self, state: NodeState) -> None:
        """A node's new state, in order: to the recording (--record), to its part of the
        next view (ViewBuilder.node_updated: derived as it arrives, a little at a time, so
        the refresh tick stays short for key presses), and its jobs to Events' actions."""
        if self.recorder is not None:
            self.recorder.node_updated(state)
        self.views.node_updated(state, self.refresh_s, self.collector.history)
        if state.snapshot is not None and state.snapshot.jobs:
            for record in self.actions.jobs(state.name, state.snapshot.jobs):
                self.events.add(event_of(record))
        if self._told_too is not None:
            self._told_too(state)

    def _refresh_landed(self) -> None:
        self.call_later(self._refreshed)  # drawn from the app's own queue

    def _refreshed(self) -> None:
        self.tick()
        self._ticker.reset()  # the timer's next tick counts from here

    def tick(self) -> None:
        """Build the fleet view once and redraw only the screen the operator sees."""
        started = time.perf_counter()
        self.view = self.views.build(
            self.collector.states,
            self.refresh_s,
            history=self.collector.history,
            gateway=self.gateway,  # the SLO is judged on what clients feel
        )
        self.events.update(self.view.alerts)
        self.diagnoses.update(self.view, self.collector.states, self.gateway,
                              self.gateway_error, self.replay_time())  # fmt: skip
        if self.recorder is not None:
            self.recorder.alerts(self.events)
            if self.diagnoses.looked:
                self.recorder.diagnoses(self.diagnoses.found, self.diagnoses.now())
        self.built = built = self._built(self.view)
        built_at = time.perf_counter()
        # The timer can fire once more while the app closes, after its screens are gone.
        screen = self.screen_stack[-1] if self.screen_stack else None
        if isinstance(screen, FailoverScreen):
            screen.built = built  # an open plan redraws on its own poll, from this
        elif isinstance(screen, ViewScreen) and screen.is_mounted and self._redraw_due(screen):
            screen.show_built(built)
        # The console's own cost, kept for the scale benchmark and the debug log.
        self.tick_ms.append(((built_at - started) * 1000, (time.perf_counter() - built_at) * 1000))

    def _built(self, view: FleetView) -> ViewBuilt:
        """The last view built, with all else a screen draws as the console holds it now."""
        health = self.collector.health
        return ViewBuilt(
            view, self.views.changes(), self.views.specs(view), self.gateway,
            self.gateway_error, self.diagnoses.findings(), self.collector.states,
            self.collector.history, tuple(self.events.events), tuple(self.gateway_actions.jobs),
            self.gateway_actions.error, Header(self.read_only, self.simulated, self.replay_label(),
            source_problem(health), source_note(health), self.redraw_s),
        )  # fmt: skip

    def _screen_changed(self, screen: Screen[Any]) -> None:
        """A screen comes on top (pushed, or back after one closed): it is handed the last
        view, with what came since (a gateway's answer), to draw at once."""
        if isinstance(screen, ViewScreen | FailoverScreen) and self.view is not None:
            self.built = screen.built = self._built(self.view)

    def push_screen(self, screen: Any, *args: Any, **kwargs: Any) -> Any:
        # Handed before: a new screen draws before screen_change_signal is published.
        self._screen_changed(self.get_screen(screen) if isinstance(screen, str) else screen)
        return super().push_screen(screen, *args, **kwargs)

    def diagnosis_moved(self, key: tuple[str, str], move: Move) -> None:
        """The operator made `move` for the diagnosis `key`: it is verified from now."""
        self.diagnoses.moved(key, move)

    def _redraw_due(self, screen: ViewScreen) -> bool:
        """Every refresh; with --slow-link once `redraw_s` has passed since the screen was
        last drawn (a key that changes what it shows draws it at once)."""
        if self.redraw_s is None:
            return True
        return time.monotonic() - screen.drawn_at >= self.redraw_s - self.refresh_s / 2

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        if self.slow_link and isinstance(event.widget, Input):
            event.widget.cursor_blink = False  # a blinking cursor is two writes a second

    def action_redraw(self) -> None:
        """Write the whole screen again (Ctrl+L), as if the terminal showed nothing."""
        if self.terminal_driver is not None:
            self.terminal_driver.redraw()
        self.screen.refresh(repaint=True)
        self.refresh(repaint=True)

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:  # fmt: skip
        """Every notification, the screens' and the workflows' too: its text is often an
        agent's or a gateway's refusal, so it is made safe for the terminal and never read
        as markup (`[@click=...]` in an error would be an action)."""
        super().notify(for_terminal(message, lines=True), title=for_terminal(title),
                       severity=severity, timeout=timeout, markup=markup)  # fmt: skip

    # Where a screen goes and the moves (console/tui/workflows.py), as ConsoleHost names them
    open_node = delegate(Workflows.open_node)
    open_model = delegate(Workflows.open_model)
    open_engine = delegate(Workflows.open_engine)
    open_job = delegate(Workflows.open_job)
    open_playbook = delegate(Workflows.open_playbook)
    action_blocked = delegate(Workflows.action_blocked)
    agent_client = delegate(Workflows.agent_client)
    agent_call = delegate(Workflows.agent_call)
    gateway_call = delegate(Workflows.gateway_call)
    confirm = delegate(Workflows.confirm)
    run_drill = delegate(Workflows.run_drill)
    stop_engine = delegate(Workflows.stop_engine)
    fail_over = delegate(Workflows.fail_over)
    steer_rollout = delegate(Workflows.steer_rollout)
    start_vllm = delegate(Workflows.start_vllm)

    def replay_label(self) -> str | None:
        """What the header shows instead of the environment in a replay (the replayed
        time); None for the live fleet."""
        return None

    def replay_time(self) -> float | None:
        """The replayed time the diagnoses are judged at; None for the live fleet."""
        return None

    # the workflows (console/tui/workflows.py) ask the agents; these learn what they may do
    async def _learn_roles(self) -> None:
        """Ask each agent what our token may do, so viewer tokens disable actions up front."""
        await self.collector.roles(self.roles.__setitem__)

    async def _gateway_once(self) -> None:
        from console.collect.clients.gateway_client import GatewayError

        client = self.workflows.gateway_client(timeout=max(1.0, self.refresh_s * 2))
        try:
            self.gateway_snapshot = await client.snapshot()
            self.gateway_error = None
        except GatewayError as exc:
            self.gateway_snapshot, self.gateway_error = None, str(exc)
            self.gateway_actions.lost(str(exc))
        else:
            for record in await self.gateway_actions.read(client):  # for Jobs and Events
                self.events.add(event_of(record))
            if self.gateway_role is None:  # asked at each poll until the gateway says
                with contextlib.suppress(GatewayError):  # an older gateway: actions as before
                    self.gateway_role = await client.whoami()
                if self.gateway_role is not None and self.screen_stack:
                    self.screen.refresh_bindings()  # a viewer's fail over key shows disabled
        try:
            if self.recorder is not None:
                await self.recorder.from_gateway(client, self.gateway_snapshot)
        finally:
            await client.close()

    def action_goto(self, view: str) -> None:
        target = VIEWS[view]
        while len(self.screen_stack) > 2 and not isinstance(self.screen, target):
            self.pop_screen()
        if isinstance(self.screen, target):
            return
        if target is FleetScreen:
            while len(self.screen_stack) > 2:
                self.pop_screen()
            return
        # The fleet-wide views are installed once and kept: coming back to a table of
        # two thousand deployments redraws what changed instead of building it again.
        if not self.is_screen_installed(view):
            self.install_screen(target(), name=view)
        self.push_screen(view)

    def action_go_back(self) -> None:
        if isinstance(self.screen, ModalScreen):
            # Dismissed, not popped: whoever opened the dialog hears it was cancelled (the
            # failover plan comes back when its standby form is).
            self.screen.dismiss(None)
            return
        lines = self.screen.query(CommandLine)
        if lines and lines.first().has_class("open"):
            lines.first().action_close()
            return
        screen = self.screen
        if isinstance(screen, ViewScreen) and screen.filter is not None:
            screen.filter = None  # Esc first clears a filter, then goes back
            screen.redraw()
            return
        if len(self.screen_stack) > 2:
            self.pop_screen()

    COLON_COMMANDS = COLON_COMMANDS  # a replay adds its own

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.help_keys(), self.COLON_COMMANDS))

    def help_keys(self) -> list[tuple[str, str, str]]:
        """(where, key, what) for every binding of the app and its screens, as this
        fleet's [keys] maps them: help is made from the bindings, so it cannot drift."""
        out = [("everywhere", key, what) for key, what in self._keys(type(self))]
        out += [
            ("everywhere", "enter", "open the selected row"),
            ("everywhere", "ctrl+p", "every view and action, searchable"),
        ]
        for place, screen in KEY_PLACES:
            out += [(place, key, what) for key, what in self._keys(screen)]
        return out

    def _keys(self, owner: type) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        ours = [c for c in owner.__mro__ if c.__module__.startswith("console.")]
        for cls in reversed(ours):  # a subclass's keys after its parents'; not Textual's
            for binding in cls.__dict__.get("BINDINGS", ()):
                if not isinstance(binding, Binding) or not binding.description:
                    continue
                key = self.fleet.keys.get(binding.id or "", binding.key)
                shown = ", ".join(self.get_key_display(Binding(k, "")) for k in key.split(","))
                out.append((shown, binding.description))
        return out

    def action_command(self) -> None:
        self._command_line().open(":")

    def action_filter(self) -> None:
        screen = self.screen
        current = screen.filter.text if isinstance(screen, ViewScreen) and screen.filter else ""
        self._command_line().open("/", current)

    def _command_line(self) -> CommandLine:
        return self.screen.query_one(CommandLine)

    @on(CommandLine.Entered)
    def _entered(self, event: CommandLine.Entered) -> None:
        self.entered(event.mode, event.text)

    def entered(self, mode: str, text: str) -> None:
        """What the bottom line's Enter does, by the mode it was opened in."""
        if mode == "/":
            self.apply_filter(text)
        else:
            self.run_command(text)

    def apply_filter(self, text: str) -> None:
        screen = self.screen
        if not isinstance(screen, ViewScreen):
            return
        try:
            wanted = parse_filter(text) if text else None
        except FilterError as exc:
            self.notify(str(exc), title="filter", severity="error")
            return
        before, screen.filter = screen.filter, wanted
        if not screen.redraw():
            return
        unknown = wanted.unknown_fields() if wanted is not None else []
        if unknown and wanted is not None and wanted.tally.fields is not None:
            names = ", ".join(repr(f) for f in unknown)
            have = " ".join(sorted(wanted.tally.fields))
            self.notify(f"no field {names} here; fields: {have}", title="filter", severity="error")
            screen.filter = before  # the table as it was, not emptied by a typo
            screen.redraw()

    def run_command(self, text: str) -> None:
        word, _, arg = text.lstrip(":").strip().partition(" ")
        word, arg = word.lower(), arg.strip()
        if word in VIEWS:
            self.action_goto(word)
        elif word == "node" and arg:
            self.open_node(arg)
        elif word == "model" and arg:
            self.open_model(arg)
        elif word == "job" and "/" in arg:
            node, _, job_id = arg.partition("/")
            self.open_job(node, job_id)
        elif word == "start":
            self.start_vllm(model=arg or None)
        elif word == "engine" and "/" in arg:
            node, _, engine = arg.partition("/")
            self.open_engine(node, engine)
        elif word in ("help", "?"):
            self.action_help()
        elif word in ("q", "quit", "exit"):
            self.exit(0)
        elif word:
            usages = " ".join(f":{usage}" for usage, _ in self.COLON_COMMANDS)
            self.notify(f"unknown command {text!r}: try {usages}", severity="error")

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for name, what in (
            ("nodes", "Fleet: nodes and GPU heat grid"),
            ("gpus", "GPUs: every GPU of the fleet"),
            ("models", "Models: deployments across engines side by side"),
            ("events", "Events: alerts raised and cleared"),
            ("jobs", "Jobs: starts, stops and restarts on every agent"),
            ("diag", "Diagnoses: named problems, their evidence and moves"),
            ("rollouts", "Rollouts: the gateway's, waves and steps; pause, resume, abort"),
        ):
            yield SystemCommand(f"View {name}", what, lambda n=name: self.action_goto(n))
        # The palette reads its titles as markup; node and model names are outside text.
        for node in self.collector.states:
            yield SystemCommand(
                f"Node {fmt.as_markup(node)}",
                "GPUs, engines, host and versions",
                lambda n=node: self.open_node(n),
            )
        for model in self.view.models if self.view else {}:
            yield SystemCommand(
                f"Model {fmt.as_markup(model)}",
                "TTFT and ITL p95 over time",
                lambda m=model: self.open_model(m),
            )
        yield SystemCommand(
            "Filter the table", "/ then text or util>80 engine=triton", self.action_filter
        )
        if not self.read_only and self.fleet.profiles:
            yield SystemCommand(
                "Start vLLM", "from a launch profile, with preflight", self.start_vllm
            )
        yield SystemCommand("Keys", "every key and command", self.action_help)


# The screens see the app only as a ConsoleHost (console/tui/host.py): mypy checks here that
# it is one, so a screen cannot use what the app does not have.
_HOST: type[ConsoleHost] = EngineroomApp


def run_tui(
    fleet: Fleet,
    *,
    read_only: bool = False,
    record: str | None = None,
    cleanup: Callable[[], object] = lambda: None,
    slow_link: bool = False,
) -> int:
    """The console in this process; `cleanup` runs if its exit blocks (EngineroomApp.exit).
    `slow_link`: redraw every SLOW_LINK_REDRAW_S, no animation, and the mouse left to the
    terminal (its every move was a report up the link and a hover redrawn down it)."""
    # A node whose token variable is not set shows as "no token"; the rest is watched.
    app = EngineroomApp(fleet, read_only=read_only, record=record, slow_link=slow_link)
    app.exit_watchdog = cleanup
    return app.run(mouse=not slow_link) or app.return_code or 0  # 129: hung up
