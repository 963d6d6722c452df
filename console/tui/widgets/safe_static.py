"""A Static for text from outside: every detail pane, confirmation and form answer that
shows what an agent, an engine, a gateway or a recording said."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.visual import VisualType
from textual.widgets import Static

from console.tui.format import safe


class SafeStatic(Static):
    """Its text is made safe for the terminal on every update (console.core.safetext):
    lines and tabs kept, every other control, bidi and zero-width character shown as its
    escape. A str is plain text, never markup."""

    def __init__(self, content: VisualType = "", **kwargs: Any) -> None:
        super().__init__(_safe(content), **kwargs)

    def update(self, content: VisualType = "", *, layout: bool = True) -> None:
        super().update(_safe(content), layout=layout)


def _safe(content: VisualType) -> VisualType:
    return safe(content, lines=True) if isinstance(content, Text | str) else content
