"""The yes/no question every action asks first, naming its target; WhyConfirmScreen also
takes the why to record with the move."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from console.tui.format import safe
from console.tui.widgets.safe_static import SafeStatic


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question that names its target; `y` confirms, `n` or Esc cancels."""

    BINDINGS = [
        Binding("y", "answer(True)", "yes"),
        Binding("n,escape", "answer(False)", "no"),
    ]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 80%; max-width: 90; height: auto;
                               border: thick $warning; background: $surface; padding: 1 2; }
    ConfirmScreen Horizontal { height: auto; margin-top: 1; }
    ConfirmScreen Button { margin-right: 2; }
    """

    def __init__(self, title: str, body: str, yes: str) -> None:
        super().__init__()
        self.title_text, self.body, self.yes = title, body, yes

    def compose(self) -> ComposeResult:
        with Vertical():
            # Its target is named from a snapshot (an engine id, a job's profile).
            yield Label(safe(Text(self.title_text, style="bold")))
            yield SafeStatic(self.body)
            with Horizontal():
                yield Button(Text(f"y  {self.yes}"), id="yes", variant="warning")
                yield Button(Text("n  cancel"), id="no")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class WhyConfirmScreen(ConfirmScreen):
    """The question, with a field for the why the audit records: Enter (or the button)
    answers yes, Esc cancels; y and n type into the field. Left empty, `why` is `default`
    (the field's placeholder says so). Read `why` once it answered."""

    DEFAULT_CSS = """
    WhyConfirmScreen #why-row { margin-top: 1; }
    WhyConfirmScreen #why-row > Label { width: auto; padding: 0 1 0 0; text-style: bold; }
    WhyConfirmScreen #why { width: 1fr; background: $boost; }
    """
    AUTO_FOCUS = "#why"

    def __init__(self, title: str, body: str, yes: str, default: str, max_length: int) -> None:
        super().__init__(title, body, yes)
        self.default, self.max_length = default, max_length
        self.why = default

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(safe(Text(self.title_text, style="bold")))
            yield SafeStatic(self.body)
            # Compact: a focused Input's border took two of its three rows and hid the
            # text typed in a short box (the command line had it so).
            with Horizontal(id="why-row"):
                yield Label("why:")
                yield Input(placeholder=f"{self.default} (left empty)", id="why",
                            max_length=self.max_length, compact=True)  # fmt: skip
            with Horizontal():
                yield Button(Text(f"enter  {self.yes}"), id="yes", variant="warning")
                yield Button(Text("esc  cancel"), id="no")

    def action_answer(self, answer: bool) -> None:
        if answer:
            self.why = self.query_one("#why", Input).value.strip() or self.default
        self.dismiss(answer)

    @on(Input.Submitted, "#why")
    def _submitted(self) -> None:
        self.action_answer(True)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.action_answer(event.button.id == "yes")
