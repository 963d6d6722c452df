"""Rollouts (`:rollouts`, `o`): the gateway's rollouts (issue 31, docs/rollouts.md), the
newest open one on top: where it is, why it stopped, its waves, each deployment's state
and its TTFT and ITL p95 before and after its turn; keys pause, resume and abort it.

The rollout runs in the gateway: this screen only reads it (a poll that starts its next
call once the last ended) and asks the workflows (console/tui/workflows.py
`steer_rollout`) to steer it, each move confirmed by name. The web view and replay show
it and refuse the keys (console/tui/readonly.py); a viewer token shows them dimmed. A
replay asks no gateway: its records are the recording's at the cursor, as the console
that recorded read them (console/collect/recordings/rollouts.py).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll

from console.collect.clients.gateway_client import GatewayClient
from console.collect.recordings.replay import ReplayCollector
from console.tui.built import ViewBuilt
from console.tui.polling import Poll
from console.tui.screens.base import ViewScreen
from console.tui.screens.rollouttext import chosen, label, rollout_text, steer_refusal
from console.tui.widgets.safe_static import SafeStatic

STEERS = {"pause_rollout": "pause", "resume_rollout": "resume", "abort_rollout": "abort"}


class RolloutsScreen(ViewScreen):
    where = "Rollouts"
    DEFAULT_CSS = """
    RolloutsScreen #rollout-scroll { height: 1fr; padding: 0 1; }
    """
    BINDINGS = [
        Binding("p", "pause_rollout", "pause (confirm)", id="pause_rollout"),
        Binding("r", "resume_rollout", "resume (confirm)", id="resume_rollout"),
        Binding("A", "abort_rollout", "abort (confirm)", id="abort_rollout"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []
        self.error: str | None = None  # the last read failed: what is shown is that old
        self.read = False  # the gateway answered once
        self.rollout_poll: Poll | None = None  # None: no gateway to ask (or a replay)
        self.recorded: ReplayCollector | None = None  # a replay: the records at its cursor

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="rollout-scroll"):
            yield SafeStatic(id="rollout")  # the gateway's record: outside text

    def on_mount(self) -> None:
        super().on_mount()
        source = self.console.collector
        if self.console.offline and isinstance(source, ReplayCollector):
            self.recorded = source
        elif not self.console.offline and GatewayClient.configured(self.console.fleet):
            self.rollout_poll = Poll(self, max(1.0, self.console.refresh_s), self.fetch,
                                     "rollouts")  # fmt: skip
            self.rollout_poll.now()

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        if self.rollout_poll is not None:
            self.rollout_poll.now()  # back on it: read now, not up to a poll later

    async def fetch(self) -> None:
        """The gateway's rollouts, newest first; nothing while the screen is not shown (it
        is installed once and kept: coming back reads at once)."""
        if not self.is_current:
            return

        def failed(why: str) -> None:  # no answer, or its token gone meanwhile
            self.error = why

        found = await self.console.gateway_call(
            lambda g: g.rollouts(), timeout=max(2.0, self.console.refresh_s * 2), reads=True,
            failed=failed,
        )  # fmt: skip
        if found is not None:  # drawn as a replay draws its recording's: their fields
            self.records, self.error, self.read = [r.model_dump() for r in found], None, True
        if self.is_attached:
            self._draw()

    def draw(self, built: ViewBuilt) -> None:
        if self.recorded is not None:  # the recording's, at the cursor (None: none yet)
            self.records = self.recorded.rollouts or []
            self.error, self.read = self.recorded.rollouts_error, True
        self._draw()

    def _draw(self) -> None:
        box = self.query("#rollout")
        if not box:
            return
        t = Text()
        missing = self._no_gateway()
        if missing:
            t.append(missing, style="yellow")
        elif not self.read and self.error is None:
            t.append("asking the gateway for its rollouts ...", style="dim")
        else:
            if self.error:
                old = " (what follows is from its last answer)" if self.read else ""
                t.append(f"the gateway did not answer: {self.error}{old}\n\n", style="bold red")
            now = self.recorded.at if self.recorded is not None else None  # a replay's cursor
            view = self.built.view if self.built is not None else None
            t.append_text(rollout_text(self.records, self._refused(), view, now))
        box.first(SafeStatic).update(t)

    def _no_gateway(self) -> str | None:
        if self.console.offline:
            if self.recorded is not None and self.recorded.rollouts is not None:
                return None
            return ("a replay: the gateway is not asked, and the recording holds no rollouts "
                    "at this moment (recorded without a gateway, or before its rollouts were "
                    "read)")  # fmt: skip
        if not GatewayClient.configured(self.console.fleet):
            return "no gateway: declare [gateway] in fleet.toml and set its token variable"
        return None

    def _refused(self) -> str | None:
        """Why the keys do nothing here (shown in place of them); None when they may."""
        console = self.console
        if console.read_only:
            return "read-only console: pausing, resuming and aborting rollouts is disabled"
        if console.gateway_role == "viewer" and console.fleet.gateway is not None:
            return (f"the gateway token ({console.fleet.gateway.token_env}) is a viewer token: "
                    "pause, resume and abort need the gateway's admin token")  # fmt: skip
        return None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in STEERS and (self._refused() or self._no_gateway()):
            return None  # shown dimmed; the line above the waves says why
        return True

    def _steer(self, verb: str) -> None:
        record = chosen(self.records)
        if record is None:
            self.notify("no rollout to steer", severity="warning")
            return
        why_not = steer_refusal(record, verb)
        if why_not:
            self.notify(why_not, severity="warning")
            return
        poll = self.rollout_poll
        self.console.steer_rollout(
            str(record["id"]), verb, label(record), done=poll.now if poll is not None else None
        )

    def action_pause_rollout(self) -> None:
        self._steer("pause")

    def action_resume_rollout(self) -> None:
        self._steer("resume")

    def action_abort_rollout(self) -> None:
        self._steer("abort")
