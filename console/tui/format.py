"""How values look on screen: units, colours by threshold, unknown as "?" in dim.

Colours carry meaning only where a glance needs it (hot, failing, over SLO); with
NO_COLOR, Textual drops them and the text still says everything.
"""

from __future__ import annotations

from rich.text import Text

from console.core.wire import Percentiles

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
    if used is None:
        return UNKNOWN
    if total:
        return Text(f"{used / 2**30:.0f}/{total / 2**30:.0f}G")
    return Text(f"{used / 2**30:.1f}G")


def watts(value: float | None, limit: float | None = None) -> Text:
    if value is None:
        return UNKNOWN
    near = limit is not None and value >= 0.95 * limit
    return Text(f"{value:.0f}W", style="yellow" if near else "")


def seconds(value: float | None) -> str:
    if value is None:
        return "?"
    if value < 1:
        return f"{value * 1000:.0f}ms"
    return f"{value:.2f}s" if value < 10 else f"{value:.0f}s"


def latency(p: Percentiles | None, which: str = "p95", limit_ms: float | None = None) -> Text:
    """A latency cell coloured against the SLO; a mean-only value is marked with "~"."""
    if p is None:
        return UNKNOWN
    value = getattr(p, which)
    prefix = ""
    if value is None and p.mean is not None:
        value, prefix = p.mean, "~"
    if value is None:
        return UNKNOWN
    style = ""
    if limit_ms is not None:
        style = "bold red" if value * 1000 > limit_ms else "green"
    return Text(prefix + seconds(value), style=style)


def rate(value: float | None) -> Text:
    if value is None:
        return UNKNOWN
    return Text(f"{value:.1f}/s" if value < 10 else f"{value:.0f}/s")


def count(value: float | None) -> Text:
    return UNKNOWN if value is None else Text(f"{value:.0f}")


def error_rate(value: float | None, limit: float | None) -> Text:
    if value is None:
        return UNKNOWN
    bad = limit is not None and value > limit
    return Text(f"{value:.1%}", style="bold red" if bad else "")


STATUS_STYLE = {
    "up": "green",
    "ready": "green",
    "stale": "yellow",
    "loading": "yellow",
    "unknown": "dim",
    "down": "bold red",
    "unhealthy": "bold red",
}


def status(value: str, suffix: str = "") -> Text:
    return Text(value + suffix, style=STATUS_STYLE.get(value, ""))


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
