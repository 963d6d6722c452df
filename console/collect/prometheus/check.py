"""What a value read from Prometheus may be, and how a refused one is said.

Any exporter that Prometheus scrapes writes series the console reads, so every label
value and sample is outside text: a GPU label "²" (a digit to `str.isdigit`, not to
`int`), a memory reading of 1e308 MiB (past any integer a snapshot holds), NaN, a
rate that a counter running backwards made negative, a node name holding an escape
sequence. Each is checked where it becomes a figure. A bad one costs that figure (shown
unknown, never 0 and never a guess), is named in the source's health, and never stops a
refresh.

Gauges keep why a sample was refused in place of its value (a `str`), so that it can be
named when the snapshot is made, and so that the same bad sample reads equal from one
refresh to the next (NaN does not), which keeps the node's snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from console.collect.prometheus.promql import WAITING
from console.core.safetext import for_terminal

Reading = float | str | None  # a number; why it was refused; or not read
Bounds = tuple[float, float, bool]  # low, high (inclusive), whole numbers only
MAX_NAME = 253  # a host name's longest
MAX_GPU_INDEX = 9999

# dcgm-exporter's readings (promql.DCGM_READINGS), in its units.
DCGM_BOUNDS: dict[str, Bounds] = {
    "util": (0, 100, False),  # %
    "fb_used": (0, 2**30, False),  # MiB: a PiB
    "fb_free": (0, 2**30, False),
    "fb_reserved": (0, 2**30, False),
    "temp": (-100, 300, False),  # C
    "power": (0, 100_000, False),  # W
    "sm_clock": (0, 100_000, False),  # MHz
    "xid": (0, 2**31, True),
    "ecc": (0, 2**53, True),
    "throttle": (0, 2**64 - 1, True),  # a bitmask
}
# The agent's own GPU series (promql.AGENT_GPU), by Gpu field.
AGENT_GPU_BOUNDS: dict[str, Bounds] = {
    "utilization_pct": (0, 100, False),
    "memory_used_bytes": (0, 2**60, True),
    "memory_total_bytes": (0, 2**60, True),
    "temperature_c": (-100, 300, False),
    "power_w": (0, 100_000, False),
    "power_limit_w": (0, 100_000, False),
    "sm_clock_mhz": (0, 100_000, False),
    "ecc_uncorrected": (0, 2**53, True),
}
LATENCIES = ("ttft", "itl", "e2e")
RATE: Bounds = (0, 1e9, False)  # per second
RATIO: Bounds = (0, 1, False)
SECONDS: Bounds = (0, 1e6, False)  # a latency
COUNT: Bounds = (0, 1e15, False)
# A model's readings by key ("ttft.p95", "count:e2e"). A key not here ("present", a figure
# the console does not read) has no bounds.
MODEL_BOUNDS: dict[str, Bounds] = {
    "requests_running": RATE,
    "requests_waiting": RATE,
    "kv_cache_usage": RATIO,
    "requests": RATE,
    "request_rate": RATE,
    "errors": RATE,
    "error_rate": RATIO,
    **{f"{fig}.{stat}": SECONDS for fig in LATENCIES for stat in ("p50", "p95", "p99", "mean")},
    **{f"mean:{fig}": SECONDS for fig in LATENCIES},
    **{f"{fig}.count": COUNT for fig in LATENCIES},
    **{f"count:{fig}": COUNT for fig in LATENCIES},
    # tokens and preemptions per second, hits / queries (both sources, the field's name)
    "generation_tokens_rate": RATE,
    "preemption_rate": RATE,
    "prefix_cache_hit_rate": RATIO,
}
# An engine's readings: its API server's CPU, % of one core (more than 100 is several).
ENGINE_BOUNDS: dict[str, Bounds] = {"api_server_cpu": (0, 1e5, False)}


def model_bounds(key: str) -> Bounds | None:
    """The bounds of a model's reading; waiting requests by reason are counts."""
    bounds = MODEL_BOUNDS.get(key)
    if bounds is None and key.startswith(WAITING):  # "waiting:capacity", any reason
        return RATE
    return bounds


def shown(text: str, limit: int = 40) -> str:
    """Outside text, quoted, made safe by the one sanitizer (console.core.safetext), and
    cut."""
    cut = text[:limit] + ("…" if len(text) > limit else "")
    return f"'{for_terminal(cut)}'"


def number(text: str) -> float | None:
    """A finite number as Prometheus writes one (ASCII: `float` also reads "١٢" and
    "1_0"), else None. `promtext.finite`, without its checks for the text format's own
    spellings: this runs for every sample of an answer."""
    try:
        value = float(text) if text.isascii() and "_" not in text else None
    except ValueError:
        return None
    return value if value is not None and value - value == 0 else None  # not NaN, not ±Inf


def reading(text: str) -> float | str:
    """A gauge sample: a finite number, else why it is refused."""
    value = number(text)
    return f"not a finite number ({shown(text)})" if value is None else value


def disagree(old: Reading, new: float | str) -> float | str:
    """Two series for the same reading of the same GPU (two exporters claim one host):
    which is right is not known, so neither is shown."""
    if old is None or old == new:
        return new
    if isinstance(old, str) and old.startswith("two series"):
        return old
    return "two series disagree (" + ", ".join(sorted(map(_value_text, (old, new)))) + ")"


def _value_text(value: Reading) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def gpu_index(label: str) -> int | None:
    """A GPU label as an index (ASCII digits, at most MAX_GPU_INDEX, no leading zero:
    "01" would be a second GPU 1), else None."""
    if label == "0" or (
        label.isascii() and label.isdigit() and len(label) <= 4 and label[0] != "0"
    ):
        return int(label)
    return None


def name_problem(name: str) -> str | None:
    """Why a label value cannot name a node (None: it can)."""
    if len(name) > MAX_NAME:
        return f"is over {MAX_NAME} characters"
    if not name.isprintable():  # control, format (bidi, zero-width) and separator characters
        return "has control or invisible characters"
    return None


class Notes:
    """The samples refused while making one snapshot: counted, the first named."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        self.count = 0
        self.first: str | None = None

    def add(self, what: str, why: str) -> None:
        self.count += 1
        if self.first is None:
            self.first = f"{self.subject}: {what}: {why}"


def checked(
    values: dict[str, Reading], bounds_of: Callable[[str], Bounds | None], notes: Notes, where: str
) -> dict[str, float | None]:
    """`values` with each one refused (None) that is not a number in its bounds; `where`
    names them ("gpu 3", "model 'm'"). Runs for every figure of every snapshot made, so
    the plain case costs a lookup and two comparisons, and `values` itself comes back."""
    out: dict[str, Reading] | None = None
    for key, value in values.items():
        if value.__class__ is float:
            bounds = bounds_of(key)
            if bounds is None:
                continue
            low, high, whole = bounds
            if low <= value <= high:
                if not whole or value.is_integer():
                    continue
                why = f"{value:.4g} is not a whole number"
            else:
                why = f"{value:.4g} is out of range ({low:.3g} to {high:.3g})"
        elif value is None:
            continue
        else:
            why = str(value)
        notes.add(f"{where} {key}", why)
        if out is None:
            out = dict(values)
        out[key] = None
    return cast(dict[str, float | None], values if out is None else out)  # no str left
