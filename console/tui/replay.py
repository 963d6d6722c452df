"""`engineroom replay FILE`: the same console on a recording, read-only, with a time cursor.

Every screen draws what the ReplayCollector holds at the cursor, as the live console
draws what the collector polled. Keys: space plays or pauses, `.` and `,` step a second,
`>` and `<` change the speed (1×, 10×, 60×), `]` and `[` jump to the next or previous
alert or operator action, `t` (or `:at TIME`) jumps to a time. The action keys answer
"replay is read-only".
"""

from __future__ import annotations

import time

from textual.binding import Binding

from console.collect.recordings.reader import Recording
from console.collect.recordings.replay import SPEEDS, RecordedEvents, ReplayCollector, fleet_of
from console.collect.recordings.timeline import parse_time
from console.core.config.load import Fleet
from console.tui.app import EngineroomApp
from console.tui.readonly import RefusingApp
from console.tui.widgets.time_cursor import TimeCursor, clock

READ_ONLY = "replay is read-only: this is a recording, not the fleet"


class ReplayApp(RefusingApp):
    REFUSAL = "replay is read-only: {what} is disabled; this is a recording, not the fleet"

    offline = True
    COLON_COMMANDS = [
        ("at TIME", "jump to a time: 07:23:25 (UTC), +1:30 from the start (also t)"),
        *EngineroomApp.COLON_COMMANDS,
    ]
    BINDINGS = [
        Binding("space", "play", "play/pause", id="replay_play"),
        Binding("full_stop", "step(1)", "step", id="replay_step"),
        Binding("comma", "step(-1)", "step back", id="replay_back", show=False),
        Binding("greater_than_sign", "speed(1)", "faster", id="replay_faster", show=False),
        Binding("less_than_sign", "speed(-1)", "slower", id="replay_slower", show=False),
        Binding("right_square_bracket", "mark(1)", "next event", id="replay_next"),
        Binding("left_square_bracket", "mark(-1)", "prev event", id="replay_prev", show=False),
        Binding("t", "jump", "jump to", id="replay_jump"),
    ]

    def __init__(self, fleet: Fleet, replay: ReplayCollector) -> None:
        super().__init__(fleet, collector=replay)
        self.replay = replay
        self.events = RecordedEvents(replay)
        self.playing = False
        self.speed = SPEEDS[0]
        self._played_at = time.monotonic()
        self._said_broken = False

    async def on_mount(self) -> None:
        await super().on_mount()
        self.set_interval(0.1, self._play)

    # the header and the cursor
    def replay_label(self) -> str | None:
        return clock(self.replay.at)

    def replay_time(self) -> float | None:
        return self.replay.at

    def tick(self) -> None:
        self.gateway_snapshot = self.replay.gateway_snapshot
        super().tick()
        self._show_cursor()

    def _show_cursor(self) -> None:
        if self.replay.broken is not None and not self._said_broken:
            # A record past here breaks the file's schema: the replay ends before it.
            self._said_broken = True
            self.notify(self.replay.broken, title="recording", severity="error", timeout=30)
        if not self.screen_stack:
            return
        for cursor in self.screen.query(TimeCursor):
            cursor.show(self.replay, self.playing, self.speed)

    def _moved(self) -> None:
        self.tick()

    # moving the cursor
    def _play(self) -> None:
        now = time.monotonic()
        elapsed, self._played_at = now - self._played_at, now
        if not self.playing:
            return
        self.replay.move_to(self.replay.at + elapsed * self.speed)
        if self.replay.at >= self.replay.last:
            self.playing = False
        self._show_cursor()

    def action_play(self) -> None:
        if not self.playing and self.replay.at >= self.replay.last:
            self.replay.move_to(self.replay.first)  # played to the end: from the start
        self.playing = not self.playing
        self._played_at = time.monotonic()
        self._moved()

    def action_step(self, seconds: int) -> None:
        self.playing = False
        self.replay.move_to(self.replay.at + seconds * self.refresh_s)
        self._moved()

    def action_speed(self, change: int) -> None:
        i = SPEEDS.index(self.speed) + change
        self.speed = SPEEDS[min(max(i, 0), len(SPEEDS) - 1)]
        self._show_cursor()

    def action_mark(self, direction: int) -> None:
        mark = self.replay.next_mark(forward=direction > 0)
        if mark is None:
            self.notify("no alert or action " + ("after" if direction > 0 else "before") + " this")
            return
        self.playing = False
        self.replay.move_to(mark.time)
        self.notify(f"{mark.kind}: {mark.subject} {mark.message}", timeout=6)
        self._moved()

    def action_jump(self) -> None:
        # The hint's example is a time inside the recording (a fixed 07:23:25 was not).
        first, last = clock(self.replay.first), clock(self.replay.last)
        hint = f"{first[11:19]} to {last[11:19]} (UTC), {first[:19]}, +1:30 from the start"
        self._command_line().open("at", hint=hint)

    def entered(self, mode: str, text: str) -> None:
        if mode == "at":
            self.jump_to(text)
        else:
            super().entered(mode, text)

    def jump_to(self, text: str) -> None:
        try:
            t = parse_time(text, self.replay.first)
        except ValueError as exc:
            self.notify(str(exc), title="jump", severity="error")
            return
        if not self.replay.first <= t <= self.replay.last:
            where = "before" if t < self.replay.first else "after"
            self.notify(
                f"no data {where} the recording: it runs from {clock(self.replay.first)} "
                f"to {clock(self.replay.last)}",
                title="jump",
                severity="warning",
            )
            t = min(max(t, self.replay.first), self.replay.last)
        self.playing = False
        self.replay.move_to(t)
        self._moved()

    def run_command(self, text: str) -> None:
        word, _, arg = text.lstrip(":").strip().partition(" ")
        if word.lower() == "at":
            self.jump_to(arg.strip())
        else:
            super().run_command(text)

    # nothing acts on the fleet from a recording (RefusingApp); screens say why up front
    def action_blocked(self, node: str) -> str | None:
        return READ_ONLY


def run_replay(path: str, at: str | None = None) -> int:
    """Open the console on a recording; its fleet file travels inside it."""
    recording = Recording(path)
    if recording.torn:
        print(f"engineroom replay: {path}: {recording.torn}; replaying up to there")
    fleet = fleet_of(recording)
    # Without --at the collector opens once every node was read (Recording.first_round).
    start = None if at is None else parse_time(at, recording.start)
    app = ReplayApp(fleet, ReplayCollector(fleet, recording=recording, at=start))
    app.exit_watchdog = lambda: None  # its own process: an exit that blocks is ended
    return app.run() or app.return_code or 0  # 129: its terminal hung up
