"""The top diagnosis on Fleet and Models (issue 30): one line above the table names the
worst open diagnosis, its subject and its first move, and the key to all of them; the
subject's row in the table is marked in the diagnosis's colour (FleetTable.mark). With
no open diagnosis the line is not there and nothing is marked."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.text import Text

from console.collect.diagnose.diagnoser import Diagnosis
from console.tui.widgets.safe_static import SafeStatic
from console.tui.widgets.table import FleetTable

# The header's colours for the diagnoses' count (console/tui/widgets/header.py).
STYLE = {"critical": "bold white on red", "warning": "bold black on yellow"}
WORD = {"critical": "CRIT", "warning": "WARN"}  # as the Diagnoses screen says them


def top(found: Sequence[Diagnosis]) -> Diagnosis | None:
    """The worst open diagnosis: the Diagnoser lists them critical first."""
    return next((x for x in found if x.state != "resolved"), None)


def fleet_key(x: Diagnosis | None) -> str | None:
    """The Fleet table's row of its subject: its node."""
    return x.node if x is not None else None


def models_key(x: Diagnosis | None) -> str | None:
    """The Models table's row of its subject: its (first) deployment, else its model."""
    if x is None or not x.model:
        return None
    if x.deployment:
        return f"d:{x.model}:{x.deployment.split(',')[0]}"
    return f"m:{x.model}"


class TopDiagnosis(SafeStatic):
    DEFAULT_CSS = """
    TopDiagnosis { height: 1; padding: 0 1; }
    TopDiagnosis.-none { display: none; }
    """

    def __init__(self) -> None:
        super().__init__(classes="-none")
        self._said: tuple[object, ...] | None = None

    def show(self, x: Diagnosis | None, open_count: int) -> None:
        said = None if x is None else (x.key, x.state, x.detail, open_count)
        if said == self._said:
            return  # the same line: no repaint
        self._said = said
        self.set_class(x is None, "-none")
        if x is None:
            return
        # As short as it can be said: at 80 columns the move and the key must show.
        t = Text()
        t.append(f" {WORD[x.kind.severity]} ", style=STYLE[x.kind.severity])
        t.append(" ")
        t.append(x.headline(), style="bold")
        if x.moves:
            t.append(f"  first move: {x.moves[0]}", style="cyan")
        t.append(f"  ! all {open_count}" if open_count > 1 else "  ! more", style="dim")
        self.update(t)


def point(
    strip: TopDiagnosis,
    table: FleetTable,
    found: Sequence[Diagnosis],
    open_count: int,
    key_of: Callable[[Diagnosis | None], str | None],
) -> None:
    """Say the top diagnosis on `strip` and mark its subject's row in `table` (drawn at
    the table's next show)."""
    x = top(found)
    strip.show(x, open_count)
    key = key_of(x)
    table.mark = None if x is None or key is None else (key, STYLE[x.kind.severity])
