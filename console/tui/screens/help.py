"""`?`: the keys, the commands and the filter syntax on one page."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

COMMANDS = """\
:nodes            the fleet: nodes and the GPU heat grid
:gpus             every GPU as a row
:models           each model with all its deployments, side by side
:model NAME       TTFT and ITL p95 over time for one model
:node NAME        one node: GPUs with history, engines, host, versions
:engine NODE/ID   one engine: versions, state, configuration
:events           alerts raised and cleared, operator actions
:quit             leave (the fleet is untouched)

/ filters the current table:  gpu-a   util>80   engine=triton   ttft_p95>0.5
  several terms must all hold; an empty filter clears it; ~ means "contains"
Enter opens the selected row; Esc goes back; ctrl+p lists every view and action.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90%; max-width: 96; height: 90%;
                                  border: round $accent; background: $surface; padding: 0 1; }
    """

    def __init__(self, keys: list[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = keys

    def compose(self) -> ComposeResult:
        t = Text()
        t.append("keys\n", style="bold")
        for key, what in self.keys:
            t.append(f"  {key:<14}{what}\n")
        t.append("\ncommands\n", style="bold")
        t.append(COMMANDS)
        with VerticalScroll():
            yield Static(t)

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)
