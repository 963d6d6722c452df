"""The `:` command line, the `/` filter line and replay's `t` jump: one prompt and one
Input in the bottom row, shown on demand."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Input, Label

# mode -> (the prompt at the row's start, the hint shown while nothing is typed)
MODES = {
    ":": (":", "nodes gpus models jobs drills events | model NAME | node NAME | engine NODE/ID"),
    "/": ("/", "text, or util>80 engine=triton ttft_p95>0.5 (all must hold; empty clears)"),
    "at": ("jump to ", "07:23:25 (UTC), 2026-12-03 07:23:25, +1:30 from the start (also :at TIME)"),
}


class CommandLine(Horizontal):
    # The Input is compact: Textual's focused Input draws a 3-row border, which in one row
    # left only its top edge on screen and hid what the operator typed.
    DEFAULT_CSS = """
    CommandLine { dock: bottom; display: none; height: 1; margin-bottom: 1; background: $boost; }
    CommandLine.open { display: block; }
    CommandLine > Label { width: auto; padding: 0 0 0 1; text-style: bold; }
    CommandLine > Input { width: 1fr; padding: 0; background: $boost; }
    """
    BINDINGS = [Binding("escape", "close", "close", show=False)]

    @dataclass
    class Entered(Message):
        mode: str  # ":", "/" or "at"
        text: str

    def __init__(self) -> None:
        super().__init__(id="command-line")
        self.mode = ":"

    def compose(self) -> ComposeResult:
        yield Label(":")
        yield Input(compact=True)  # a filter being changed is selected: typing replaces it

    @property
    def input(self) -> Input:
        return self.query_one(Input)

    @property
    def value(self) -> str:
        return self.input.value

    def open(self, mode: str, text: str = "", hint: str | None = None) -> None:
        """Open for `mode`; `hint` replaces the mode's own (a replay names its span)."""
        self.mode = mode
        prompt, hint = MODES[mode][0], hint or MODES[mode][1]
        self.query_one(Label).update(prompt)
        field = self.input
        field.placeholder = hint
        field.value = text
        field.cursor_position = len(text)
        self.add_class("open")
        field.focus()

    def action_close(self) -> None:
        self.remove_class("open")
        self.input.value = ""
        self.screen.focus_next()

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(self.Entered(self.mode, event.value.strip()))
        self.action_close()
