"""The yes/no question every action asks first, naming its target."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label

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
