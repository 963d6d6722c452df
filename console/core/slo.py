"""One SLO verdict per deployment: ok, warning, critical or unknown, and on what.

Every place that says whether a deployment meets its model's SLO reads this one verdict:
the Models screen, the alerts (console/collect/views/alerts.py), `check` and its JSON, the
failover plan; the Prometheus rules of `engineroom rules` are written from the same
limits, multiples and order of figures (console/collect/promrules/alerts.py).

- What clients feel decides: the gateway's p95 where the gateway measured the deployment
  (its admin snapshot, console.collect.views.gateway_view), else the engine's own p95.
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
from typing import Any, Literal, NamedTuple, Protocol

from console.core import alertrules
from console.core.alertrules import AlertDef
from console.core.config.model import Fleet, Model
from console.core.snapshot import ModelStats

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


class Judged(NamedTuple):
    """One figure of a deployment against its model's SLO. (Tuples: made for every
    deployment row the view makes, 20,000 at 10,000 nodes.)"""

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


class Verdict(NamedTuple):
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


class ClientFigures(Protocol):
    """A deployment as the gateway measured it (console.collect.views.gateway_view parses the
    gateway's snapshot into these): each figure None where unknown."""

    @property
    def ttft_p95(self) -> float | None: ...
    @property
    def itl_p95(self) -> float | None: ...
    @property
    def e2e_p95(self) -> float | None: ...
    @property
    def error_ratio(self) -> float | None: ...  # None where it passed no request


# (figure, its alert's severity, critical_times) in FIGURES' order. Every SLO alert
# compares with ">" (asserted here): the loop below compares inline, since it runs for
# every deployment row the view makes (20,000 at 10,000 nodes, the undeclared ones too).
assert all(defn.op == ">" for defn in FIGURES.values())
_SCALES = tuple((f, d.severity, d.critical_times) for f, d in FIGURES.items())
_NO_SLO = tuple(Judged(figure, "unknown") for figure in FIGURES)  # a figure none bounds
_new_judged = tuple.__new__


def judge(
    bounds: tuple[float | None, ...],
    stats: ModelStats | None,
    gateway: ClientFigures | None = None,
) -> Verdict:
    """The verdict on one deployment: `bounds` from limits(), `stats` the engine's figures
    for the model, `gateway` the deployment in the gateway's admin snapshot (None: no
    gateway, or it does not route this deployment). The same as each figure's
    AlertDef.severity_at, inline."""
    lat = stats.latency if stats is not None else None
    judged: list[Judged] = []
    rank = 0  # ok
    level: Level = "ok"
    bound = False
    for i, (figure, severity, critical) in enumerate(_SCALES):
        limit = bounds[i]
        if limit is None:  # most rows of a discovered fleet: no work
            judged.append(_NO_SLO[i])
            continue
        bound = True
        mean = None
        place: Place = "gateway"
        if i < 3:
            value = None
            if gateway is not None:
                value = (
                    gateway.ttft_p95 if i == 0 else gateway.itl_p95 if i == 1 else gateway.e2e_p95
                )
            if value is None:
                place = "engine"
                if lat is not None:
                    pct = lat.ttft_s if i == 0 else lat.itl_s if i == 1 else lat.e2e_s
                    value = pct.p95
                    if value is None:
                        mean = pct.mean
        else:
            value = gateway.error_ratio if gateway is not None else None
            if value is None:
                place = "engine"
                value = stats.error_rate if stats is not None else None
        one: Level
        if value is None:
            one = "unknown"
            judged.append(_new_judged(Judged, (figure, one, limit, None, None, mean)))
        else:
            if value > limit:
                one = "critical" if critical is not None and value > critical * limit else severity
            else:
                one = "ok"
            judged.append(_new_judged(Judged, (figure, one, limit, value, place, None)))
        if (r := _RANK[one]) > rank:
            rank, level = r, one
    return _new_judged(Verdict, (level if bound else "unknown", tuple(judged)))
