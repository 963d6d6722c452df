"""`?`: the keys, the commands and the filter syntax on one page."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

FILTERS = """\
/ filters the current table:  gpu-a   util>80   engine=triton   ttft_p95>0.5
  several terms must all hold; an empty filter clears it; ~ means "contains";
  a field the table does not have is named, with the fields it has
Enter opens the selected row; Esc clears the filter, then goes back.
"""

# Where each latency on Models was measured (console.collect.views.measured); the header's
# second line says the same in one word.
MEASURED = """\
TTFT95 engine     the engine's own histogram: its clock starts when the engine gets the
                  request, after the API server has parsed and tokenized it
TTFT95 gateway    the gateway's clock: request in to first byte out, as clients feel it
GAP gw-eng        gateway minus engine p95: the API server, the network and the gateway.
                  A large gap means the time is lost before the engine, not in it;
                  yellow when the gap is what breaks the SLO. ~0: the gateway reads
                  faster, within the two figures' error; ?: faster by more (the two
                  windows do not hold the same requests yet). Never negative.
ITL95 E2E95       the engine's and the gateway's p95, side by side; TTFT50 the engine's
TTFT/ITL mean     a windowed mean, where the engine has no histogram (Triton): never a
                  p95, so never in a p95 column, and never judged against the SLO
SLO               the verdict, on what clients feel (the gateway's p95, else the
                  engine's): ok; 1.28x the limit, a warning (yellow); past 2x, critical
                  (red); ? unknown, ?mean only means: unknown is never ok
hidden at this    the columns a narrow terminal cannot hold, named under the table
  width
standby           a deployment with weight 0 that is not running: no traffic, no alert
no token          this console has no token for the node (its token_env is not set)
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90%; max-width: 96; height: 90%;
                                  border: round $accent; background: $surface; padding: 0 1; }
    """

    def __init__(self, keys: list[tuple[str, str, str]], commands: list[tuple[str, str]]) -> None:
        """`keys`: (where, key, what), from the bindings; `commands`: (usage, what)."""
        super().__init__()
        self.keys = keys
        self.commands = commands

    def compose(self) -> ComposeResult:
        t = Text()
        where = None
        for place, key, what in self.keys:
            if place != where:
                where = place
                t.append(f"{'' if place == 'everywhere' else chr(10)}keys {place}\n", style="bold")
            t.append(f"  {key:<14}{what}\n")
        t.append("\ncommands (type : then the command, Enter)\n", style="bold")
        for usage, what in self.commands:
            t.append(f"  :{usage:<17}{what}\n")
        t.append("\n")
        t.append(FILTERS)
        t.append("\nwhere each number was measured (Models)\n", style="bold")
        t.append(MEASURED)
        with VerticalScroll():
            yield Static(t)

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)
