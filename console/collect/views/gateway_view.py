"""The gateway's view of the fleet, typed: what `engineroom gateway` answers at
/admin/snapshot (console.gateway.http.admin), parsed once where it arrives (`parse`).

Per model, each deployment it routes: the live weight its data plane has, whether its
health checks pass, and what clients felt through it over the gateway's window (TTFT,
inter-chunk and end-to-end percentiles, requests and failures). The console, `check`,
the recorder's diagnoses and the failover plan read these fields; none of them looks
into the JSON. The JSON is outside input: a figure that is not a finite number not under
0 (a string, a bool, NaN, -1), or a key that is missing, reads as unknown (None), never
as 0.

A deployment row of the fleet view is joined to its figures here, by `at`: the row's
model and deployment id.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class GatewayPercentiles:
    """One latency over the gateway's window, in seconds; None where no request came."""

    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    count: int | None = None


_NONE = GatewayPercentiles()


@dataclass(frozen=True, slots=True)
class GatewayDeployment:
    """One deployment as the gateway routes and measured it."""

    model: str
    id: str
    weight: int | None = None  # the data plane's live weight
    up: bool | None = None  # its health checks pass (None: the gateway did not say)
    inflight: int | None = None  # requests it is answering now
    requests: int | None = None  # finished over the window, ok or failed
    failures: int | None = None
    error_rate: float | None = None  # failures / requests; None without a request
    ttft_s: GatewayPercentiles = _NONE  # request in to first byte out, as clients feel it
    itl_s: GatewayPercentiles = _NONE  # between chunks of the answer
    e2e_s: GatewayPercentiles = _NONE  # request in to the answer's end

    @property
    def down(self) -> bool:
        """The gateway marks it down (an unknown `up` is not down)."""
        return self.up is False

    @property
    def ttft_p95(self) -> float | None:
        return self.ttft_s.p95

    @property
    def itl_p95(self) -> float | None:
        return self.itl_s.p95

    @property
    def e2e_p95(self) -> float | None:
        return self.e2e_s.p95

    @property
    def error_ratio(self) -> float | None:
        """The error rate the SLO judges: None where the gateway passed no request."""
        return self.error_rate if self.requests else None


@dataclass(frozen=True, slots=True)
class GatewayView:
    """The gateway's snapshot: {model: {deployment id: its figures}}."""

    models: Mapping[str, Mapping[str, GatewayDeployment]]

    def routes(self, model: str) -> Mapping[str, GatewayDeployment] | None:
        """The deployments the gateway routes for `model`; None when it routes none."""
        return self.models.get(model)

    def at(self, model: str, deployment: str) -> GatewayDeployment | None:
        """A deployment row's figures at the gateway (the join of the fleet view's rows
        to this view); None for an undeclared row ("" id) or one it does not route."""
        found = self.models.get(model)
        return found.get(deployment) if found is not None and deployment else None

    def weights(self, model: str) -> dict[str, int] | None:
        """The live weights of `model`'s deployments (those whose weight is known); None
        when the gateway does not route the model."""
        found = self.models.get(model)
        if found is None:
            return None
        return {d.id: d.weight for d in found.values() if d.weight is not None}


class GatewaySnapshot:
    """An attribute that holds the gateway's snapshot as it came (the console records
    that): setting it to a new one parses it, once, into its owner's `gateway`."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = f"_{name}"

    def __get__(self, owner: object, kind: type | None = None) -> dict[str, Any] | None:
        return getattr(owner, self._slot, None)

    def __set__(self, owner: object, raw: dict[str, Any] | None) -> None:
        if raw is not getattr(owner, self._slot, None):
            setattr(owner, self._slot, raw)
            owner.gateway = parse(raw)  # type: ignore[attr-defined]


def parse(raw: dict[str, Any] | None) -> GatewayView | None:
    """The gateway's /admin/snapshot JSON, typed; None where there is none."""
    if raw is None:
        return None
    models: dict[str, dict[str, GatewayDeployment]] = {}
    found = raw.get("models")
    for model, deployments in found.items() if isinstance(found, dict) else ():
        if not isinstance(deployments, dict):
            continue
        models[str(model)] = {
            str(dep): _deployment(str(model), str(dep), figures)
            for dep, figures in deployments.items()
            if isinstance(figures, dict)
        }
    return GatewayView(models)


def _deployment(model: str, dep: str, figures: dict[str, Any]) -> GatewayDeployment:
    up = figures.get("up")
    return GatewayDeployment(
        model,
        dep,
        weight=_count(figures.get("weight")),
        up=up if isinstance(up, bool) else None,
        inflight=_count(figures.get("inflight")),
        requests=_count(figures.get("requests")),
        failures=_count(figures.get("failures")),
        error_rate=number(figures.get("error_rate")),
        ttft_s=_percentiles(figures.get("ttft_s")),
        itl_s=_percentiles(figures.get("itl_s")),
        e2e_s=_percentiles(figures.get("e2e_s")),
    )


def _percentiles(found: Any) -> GatewayPercentiles:
    if not isinstance(found, dict):
        return _NONE
    return GatewayPercentiles(
        number(found.get("p50")),
        number(found.get("p95")),
        number(found.get("p99")),
        _count(found.get("count")),
    )


def number(value: Any) -> float | None:
    """A figure from the JSON: a finite number not under 0, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


def _count(value: Any) -> int | None:
    """A whole count or weight from the JSON: an int not under 0, else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value >= 0 else None
