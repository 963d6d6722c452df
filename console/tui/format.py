"""How values look on screen: units, colours by threshold, unknown as "?" in dim.

Colours carry meaning only where a glance needs it (hot, failing, over SLO); with
NO_COLOR, Textual drops them and the text still says everything.
"""

from __future__ import annotations

from rich.text import Span, Text
from textual.markup import escape

from console.core.alertrules import SLO_CRITICAL_TIMES
from console.core.safetext import for_terminal, marks
from console.core.slo import Verdict, times_text
from console.core.snapshot import Percentiles

UNKNOWN = Text("?", style="dim")
BLOCKS = "▁▂▃▄▅▆▇█"


def util_style(pct: float | None) -> str:
    """all-smi's scale: calm under 60 %, busy to 80 %, hot above."""
    if pct is None:
        return "dim"
    if pct >= 80:
        return "bold red"
    if pct >= 60:
        return "yellow"
    return "green"


def pct(value: float | None, style: str | None = None) -> Text:
    if value is None:
        return UNKNOWN
    return Text(f"{value:.0f}%", style=style if style is not None else util_style(value))


def ratio(value: float | None, warn: float = 0.95) -> Text:
    if value is None:
        return UNKNOWN
    return Text(f"{value:.0%}", style="bold red" if value >= warn else "")


def temp(value: float | None, warn: float, crit: float) -> Text:
    if value is None:
        return UNKNOWN
    style = "bold red" if value >= crit else "yellow" if value >= warn else ""
    return Text(f"{value:.0f}C", style=style)


def gib(used: int | None, total: int | None = None) -> Text:
    """Memory in at most nine characters: 126/140G, and past 999 GiB in TiB: 0.7/1.1T (a
    node of eight 141 GiB GPUs; "1128/1128G" ran into the next column)."""
    if used is None:
        return UNKNOWN
    if total:
        if round(total / 2**30) >= 1000:
            return Text(f"{used / 2**40:.1f}/{total / 2**40:.1f}T")
        return Text(f"{used / 2**30:.0f}/{total / 2**30:.0f}G")
    return Text(f"{used / 2**30:.1f}G")


def watts(value: float | None, limit: float | None = None) -> Text:
    if value is None:
        return UNKNOWN
    near = limit is not None and value >= 0.95 * limit
    return Text(f"{value:.0f}W", style="yellow" if near else "")


def power(value: float | None, limit: float | None) -> Text:
    """Draw and limit in at most ten characters: 623/700W, 1000/1200W, ?/700W."""
    shown = Text("?" if value is None else f"{value:.0f}", style="dim" if value is None else "")
    if value is not None and limit is not None and value >= 0.95 * limit:
        shown.stylize("yellow")
    shown.append("/" + ("?" if limit is None else f"{limit:.0f}") + "W")
    return shown


def seconds(value: float | None) -> str:
    """At most five characters: 999ms, 9.99s, 999s, 99m, 999h. The unit is chosen after
    rounding, so 0.9996 s reads 1.00s, never 1000ms."""
    if value is None:
        return "?"
    if round(value * 1000) < 1000:
        return f"{value * 1000:.0f}ms"
    if round(value, 2) < 10:
        return f"{value:.2f}s"
    if round(value) < 1000:
        return f"{value:.0f}s"
    if round(value / 60) < 100:
        return f"{value / 60:.0f}m"
    return f"{min(value / 3600, 999):.0f}h"


def signed_seconds(value: float | None) -> str:
    """A difference of two latencies: +23ms, -4ms, +1.20s."""
    if value is None:
        return "?"
    return ("-" if value < 0 else "+") + seconds(abs(value))


def latency(p: Percentiles | None, which: str = "p95", limit_ms: float | None = None) -> Text:
    """A percentile cell coloured against the SLO. Where the engine gives only a mean, the
    mean is shown spelled "75ms mean" and never coloured by the SLO: it is not a p95."""
    if p is None:
        return UNKNOWN
    value = getattr(p, which)
    if value is None and p.mean is not None:
        return Text(f"{seconds(p.mean)} mean", style="yellow")
    if value is None:
        return UNKNOWN
    return Text(seconds(value), style=over_style(value, limit_ms) or "")


def over_style(value_s: float, limit_ms: float | None) -> str:
    """A latency's colour by the SLO verdict's scale (console/core/slo.py): green within
    its limit, yellow over it, bold red past SLO_CRITICAL_TIMES times it."""
    if limit_ms is None:
        return ""
    ms = value_s * 1000
    if ms > SLO_CRITICAL_TIMES * limit_ms:
        return "bold red"
    return "bold yellow" if ms > limit_ms else "green"


def p95(value: float | None, limit_ms: float | None = None) -> Text:
    """A p95 cell: "?" where there is none, never a mean in its place."""
    if value is None:
        return UNKNOWN
    return Text(seconds(value), style=over_style(value, limit_ms))


def mean(p: Percentiles | None) -> Text:
    """A windowed mean, in a column of its own: shown only where the engine gave no p95
    (where it did, the p95 says more)."""
    if p is None or p.mean is None or p.p95 is not None:
        return Text("-", style="dim")
    return Text(seconds(p.mean), style="italic")


def verdict(v: Verdict, standby: bool = False) -> Text:
    """The SLO cell: "ok", the worst figure's multiple of its limit ("1.3x", "88x"), "?"
    unknown, "?mean" unknown for want of a p95; "-" for a standby or a model with no SLO."""
    worst = v.worst
    if worst is not None:
        shown = times_text(worst.times)
        return Text(shown, style="bold red" if worst.level == "critical" else "bold yellow")
    if v.level == "ok":
        return Text("ok", style="green")
    if standby or all(j.limit is None for j in v.figures):
        return Text("-", style="dim")
    return Text("?mean" if v.only_means else "?", style="yellow" if v.only_means else "dim")


def rate(value: float | None) -> Text:
    """At most six characters: 9.9/s, 999/s, 9.9k/s, 999k/s (the unit after rounding)."""
    if value is None:
        return UNKNOWN
    if round(value, 1) < 10:
        return Text(f"{value:.1f}/s")
    if round(value) < 1000:
        return Text(f"{value:.0f}/s")
    if round(value / 1000, 1) < 10:
        return Text(f"{value / 1000:.1f}k/s")
    return Text(f"{min(value / 1000, 999):.0f}k/s")


def number(value: float | None) -> str:
    """A count in at most four characters: 9999, 12k, 999k, 12M."""
    if value is None:
        return "?"
    n = round(value)
    if abs(n) < 10_000:
        return str(n)
    if round(n / 1000) < 1000:
        return f"{n / 1000:.0f}k"
    return f"{min(n / 1e6, 999):.0f}M"


def count(value: float | None) -> Text:
    return UNKNOWN if value is None else Text(number(value))


def percent(value: float) -> str:
    """A fraction as a percentage in at most four characters: 0.3%, 9.9%, 12%, 100%."""
    return f"{value:.1%}" if round(value * 100, 1) < 10 else f"{value:.0%}"


def error_rate(value: float | None, limit: float | None) -> Text:
    if value is None:
        return UNKNOWN
    bad = limit is not None and value > limit
    return Text(percent(value), style="bold red" if bad else "")


def safe(value: Text | str, lines: bool = False) -> Text:
    """Outside text as Rich text with every control, bidi and zero-width character shown
    as its escape (console.core.safetext); its styles kept. The same object when there is
    nothing to change: a table asks for each cell it draws. A str becomes plain Text, never
    markup."""
    if isinstance(value, str):
        return Text(for_terminal(value, lines))
    found = marks(value.plain, lines)
    if not found:
        return value
    out, last = value.blank_copy(), 0
    for i, mark in found:
        out.append_text(value[last:i])
        piece = value[i : i + 1]  # the marker keeps the styles of what it stands for
        spans = [Span(0, len(mark), span.style) for span in piece.spans]
        piece.plain, piece.spans = mark, spans
        out.append_text(piece)
        last = i + 1
    out.append_text(value[last:])
    return out


def as_markup(value: str) -> str:
    """Outside text for a place that reads Textual markup (the command palette's names):
    safe for the terminal, and its `[` escaped, so `[@click=...]` stays text."""
    return escape(for_terminal(value))


def fit(value: str, width: int, style: str = "") -> Text:
    """Free text in a column `width` wide: cut with an ellipsis so that one space is always
    left before the next column (the tables have no cell padding). Made safe first, so a
    cut never ends inside an escape."""
    value = for_terminal(value)
    if len(value) < width:
        return Text(value, style=style)
    return Text(value[: max(0, width - 2)] + "…", style=style)


def cut(value: Text, width: int) -> Text:
    """Styled text in a column `width` wide, as `fit` cuts free text: an ellipsis where it
    was cut, and one space always left before the next column."""
    if value.cell_len < width:
        return value
    out = value.copy()
    out.truncate(max(1, width - 1), overflow="ellipsis")
    return out


STATUS_STYLE = {
    "up": "green",
    "ready": "green",
    "stale": "yellow",
    "loading": "yellow",
    "unknown": "dim",
    "down": "bold red",
    "unhealthy": "bold red",
    "no token": "yellow",
}


def status(value: str, suffix: str = "") -> Text:
    return Text(value + suffix, style=STATUS_STYLE.get(value, ""))


def engine_state(state: str, standby: bool) -> Text:
    """One word for one state on every screen: a deployment with weight 0 that is down is a
    standby nobody started, dim, not a red outage."""
    if standby and state == "down":
        return Text("standby", style="dim")
    return status(state)


def age(value: float | None) -> Text:
    if value is None:
        return UNKNOWN
    if value < 60:
        return Text(f"{value:.0f}s", style="dim" if value < 5 else "yellow")
    return Text(f"{value / 60:.0f}m", style="bold red")


def sparkline(
    values: list[float | None], lo: float = 0.0, hi: float = 100.0, width: int = 20
) -> Text:
    """Unicode block sparkline of the newest `width` values; gaps for unknown."""
    tail = values[-width:]
    chars = []
    span = (hi - lo) or 1.0
    for v in tail:
        if v is None:
            chars.append(" ")
        else:
            level = int((min(max(v, lo), hi) - lo) / span * (len(BLOCKS) - 1) + 0.5)
            chars.append(BLOCKS[level])
    last = next((v for v in reversed(tail) if v is not None), None)
    return Text("".join(chars).rjust(width), style=util_style(last) if hi == 100.0 else "cyan")
