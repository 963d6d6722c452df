"""The `:` command line and the `/` filter line: one Input, shown on demand."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Input


class CommandLine(Input):
    DEFAULT_CSS = """
    CommandLine { dock: bottom; display: none; height: 1; border: none; padding: 0 1; }
    CommandLine.open { display: block; }
    """
    BINDINGS = [Binding("escape", "close", "close", show=False)]

    @dataclass
    class Entered(Message):
        mode: str  # ":" or "/"
        text: str

    def __init__(self) -> None:
        super().__init__(placeholder="", id="command-line")
        self.mode = ":"

    def open(self, mode: str, text: str = "") -> None:
        self.mode = mode
        self.placeholder = (
            "nodes | gpus | models | model NAME | node NAME | engine NODE/ID | events | help | quit"
            if mode == ":"
            else "text, or util>80 engine=triton ttft_p95>0.5 (empty clears)"
        )
        self.value = text
        self.add_class("open")
        self.focus()

    def action_close(self) -> None:
        self.remove_class("open")
        self.value = ""
        self.screen.focus_next()

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(self.Entered(self.mode, event.value.strip()))
        self.action_close()
