"""One SLO verdict per deployment: ok, warning, critical or unknown, and on what.

Every place that says whether a deployment meets its model's SLO reads this one verdict:
the Models screen, the alerts (console/collect/alerts.py), `check` and its JSON, the
failover plan; the Prometheus rules of `engineroom rules` are written from the same
limits, multiples and order of figures (console/collect/rules.py).

- What clients feel decides: the gateway's p95 where the gateway measured the deployment
  (its admin snapshot, console.collect.measured), else the engine's own p95.
- A mean never stands in for a p95: where an engine gives only a windowed mean
  (Triton's counters), that figure is unknown; the mean is kept beside it, to be shown
  as a mean.
- Unknown is never ok: a deployment with any SLO figure unknown and none over is
  "unknown".
- The severity scales with the breach (console.core.alertrules: over the limit is a
  warning, over SLO_CRITICAL_TIMES times it is critical).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from console.core import alertrules
from console.core.alertrules import AlertDef
from console.core.config import Fleet, Model
from console.core.snapshot import ModelStats, Percentiles

Level = Literal["ok", "warning", "critical", "unknown"]
Place = Literal["gateway", "engine"]
Word = Literal["ok", "breach", "unknown"]  # check --json's per-figure "slo" words

# The figures an SLO bounds, each with the alert that says it is over (its limit, its
# comparison, its scale), in the order the verdict lists them.
FIGURES: dict[str, AlertDef] = {
    "ttft": alertrules.SLO_TTFT,
    "itl": alertrules.SLO_ITL,
    "e2e": alertrules.SLO_E2E,
    "errors": alertrules.ERROR_RATE,
}
_RANK: dict[Level, int] = {"ok": 0, "unknown": 1, "warning": 2, "critical": 3}
_WORD: dict[Level, Word] = {"ok": "ok", "warning": "breach", "critical": "breach"}


@dataclass(frozen=True, slots=True)
class Judged:
    """One figure of a deployment against its model's SLO."""

    figure: str  # "ttft", "itl", "e2e", "errors"
    level: Level
    limit: float | None = None  # seconds, or a ratio for errors; None: the SLO sets none
    value: float | None = None  # the p95 (s) or error ratio judged; None: unknown
    measured_at: Place | None = None
    mean: float | None = None  # the engine's windowed mean, where it gave no p95

    @property
    def times(self) -> float | None:
        """The value as a multiple of the limit (1.3 is 30 % over); None when unknown."""
        if self.value is None or not self.limit:
            return None
        return self.value / self.limit

    @property
    def word(self) -> Word:
        return _WORD.get(self.level, "unknown")

    @property
    def why(self) -> str | None:
        """Why a figure is unknown: "no SLO", "mean only", "no figure"; None if known."""
        if self.limit is None:
            return "no SLO"
        if self.value is not None:
            return None
        return "mean only" if self.mean is not None else "no figure"

    def as_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "value": self.value,
            "stat": None if self.value is None else "ratio" if self.figure == "errors" else "p95",
            "measured_at": self.measured_at,
            "limit": self.limit,
            "times_limit": None if (t := self.times) is None else round(t, 3),
            "mean": self.mean,
            "why_unknown": self.why,
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    """A deployment's SLO verdict: the worst of its figures; "unknown" when none is over
    and one it is bound by is not known (a mean, no requests, no reading)."""

    level: Level
    figures: tuple[Judged, ...]

    def of(self, figure: str) -> Judged:
        return next(j for j in self.figures if j.figure == figure)

    @property
    def ok(self) -> bool | None:
        """`check --json`'s slo_ok: True ok, False over, None unknown."""
        return None if self.level == "unknown" else self.level == "ok"

    @property
    def worst(self) -> Judged | None:
        """The figure furthest over its limit, None when none is over."""
        over = [j for j in self.figures if j.level in ("warning", "critical")]
        return max(over, key=lambda j: (_RANK[j.level], j.times or math.inf), default=None)

    @property
    def only_means(self) -> bool:
        """Unknown because the engine gives means, not p95s (Triton's counters)."""
        return self.level == "unknown" and any(j.why == "mean only" for j in self.figures)

    def words(self) -> dict[str, Word]:
        return {j.figure: j.word for j in self.figures}

    def as_dict(self) -> dict[str, Any]:
        return {"level": self.level, "figures": {j.figure: j.as_dict() for j in self.figures}}


UNKNOWN = Verdict("unknown", tuple(Judged(f, "unknown") for f in FIGURES))


def times_text(value: float | None) -> str:
    """How many times its limit a figure over it is, in at most five characters: 1.01x,
    3.20x, 88x, 999x. Rounded up: a figure over its limit never reads 1.00x; "over" where
    the limit is 0 (an error rate of none allowed)."""
    if value is None:
        return "over"
    up = math.ceil(value * 100) / 100
    if up < 10:
        return f"{up:.2f}x"
    return f"{min(max(10, round(value)), 999)}x"


def limits(fleet: Fleet, model: Model | None) -> tuple[float | None, ...]:
    """The model's limits in FIGURES' order (fleet.toml's error rate where it sets none)."""
    return tuple(defn.threshold(fleet, model) for defn in FIGURES.values())


def number(value: Any) -> float | None:
    """A figure from outside (the gateway's JSON): a finite number not under 0, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


def _gateway_p95(gateway: Mapping[str, Any] | None, key: str) -> float | None:
    if gateway is None:
        return None
    found = gateway.get(key)
    return number(found.get("p95")) if isinstance(found, Mapping) else None


def _gateway_errors(gateway: Mapping[str, Any] | None) -> float | None:
    """The gateway's error ratio over its window; None when it passed no request."""
    if gateway is None or not number(gateway.get("requests")):
        return None
    return number(gateway.get("error_rate"))


def judge(
    bounds: tuple[float | None, ...],
    stats: ModelStats | None,
    gateway: Mapping[str, Any] | None = None,
) -> Verdict:
    """The verdict on one deployment: `bounds` from limits(), `stats` the engine's figures
    for the model, `gateway` the deployment in the gateway's admin snapshot (None: no
    gateway, or it does not route this deployment)."""
    lat = stats.latency if stats is not None else None
    engine: tuple[Percentiles | None, ...] = (
        (lat.ttft_s, lat.itl_s, lat.e2e_s) if lat is not None else (None, None, None)
    )
    judged: list[Judged] = []
    level: Level = "ok"
    bound = False
    for (figure, defn), limit, i in zip(FIGURES.items(), bounds, range(4), strict=True):
        mean = None
        place: Place
        if i < 3:
            value, place = _gateway_p95(gateway, f"{figure}_s"), "gateway"
            if value is None:
                pct = engine[i]
                value, place = (pct.p95, "engine") if pct is not None else (None, "engine")
                mean = pct.mean if pct is not None and pct.p95 is None else None
        else:
            value, place = _gateway_errors(gateway), "gateway"
            if value is None:
                value, place = (stats.error_rate if stats is not None else None), "engine"
        if limit is None:
            one: Level = "unknown"
        else:
            bound = True
            severity = defn.severity_at(value, limit)
            one = "unknown" if value is None else severity or "ok"
            if _RANK[one] > _RANK[level]:
                level = one
        known = value is not None
        judged.append(Judged(figure, one, limit, value, place if known else None, mean))
    return Verdict(level if bound else "unknown", tuple(judged))
