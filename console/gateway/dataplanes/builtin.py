"""The built-in data plane: `engineroom gateway` itself, over its route table.

The default for every model that names no other data plane: the demo, small fleets, and
Triton's OpenAI translation. Weights are the route table's (stored and audited before they
take effect); in-flight counts and the verification figures are the gateway's own, from
every request it relays (console.gateway.routing.measure).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from console.gateway.dataplanes.base import (
    BUILTIN,
    Backend,
    DataPlane,
    DrainTimeout,
    Figures,
    Health,
)
from console.gateway.routing.routetable import RouteTable
from console.gateway.routing.upstream import Upstream

FIGURES_FROM = "the gateway's own measures of every request it relays"


class BuiltinPlane(DataPlane):
    kind = BUILTIN
    name = BUILTIN
    counts_canaries = True  # a failover's canaries go into the target's measures

    def __init__(self, table: RouteTable) -> None:
        self.table = table

    def _upstream(self, model: str, deployment: str) -> Upstream:
        found = self.table.upstream(model, deployment)
        assert found is not None, f"{model}/{deployment} is not in the route table"
        return found

    def describe(self) -> str:
        return "the built-in gateway (engineroom gateway, in the traffic's path)"

    def figures_from(self, model: str) -> str:
        return FIGURES_FROM

    async def health(self) -> Health:
        return Health(True, "the built-in gateway: this process")

    async def weights(self, model: str) -> dict[str, int]:
        return dict(self.table.weights[model])

    async def set_weights(self, model: str, weights: dict[str, int], who: str, why: str) -> None:
        # One assignment: the pick never sees a half-made change, so no order is needed.
        self.table.set_weights(model, weights, who, why)

    async def drain(self, model: str, deployment: str, timeout_s: float) -> None:
        up = self._upstream(model, deployment)
        if self.table.weights[model].get(deployment, 0) > 0:
            self.table.set_weights(model, {deployment: 0}, "gateway", f"drain {deployment}")
        deadline = time.monotonic() + timeout_s
        while up.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if up.inflight:
            raise DrainTimeout(
                f"{deployment}: {up.inflight} still in flight after {timeout_s:g} s",
                {deployment: up.inflight},
            )

    async def backends(self, model: str) -> dict[str, Backend]:
        weights = self.table.weights[model]
        return {
            u.id: Backend(u.id, weights.get(u.id, 0), u.up, None, u.inflight, u.reason)
            for u in self.table.upstreams[model]
        }

    async def snapshot(self, model: str, deployment: str) -> Any:
        return time.monotonic()

    async def figures(self, model: str, deployment: str, since: Any) -> Figures:
        measures = self._upstream(model, deployment).measures
        requests, failures = measures.outcomes.rate(since)
        return Figures(
            requests,
            failures,
            None if requests == 0 else failures / requests,
            _p95(measures.ttft.percentiles(since)),
            _p95(measures.itl.percentiles(since)),
            FIGURES_FROM,
        )

    async def started(self, model: str, deployment: str) -> int | None:
        m = self._upstream(model, deployment).measures
        return m.ttft.n + m.outcomes.ok_total + m.outcomes.failed_total


def _p95(percentiles: dict[str, float | int | None]) -> float | None:
    value = percentiles.get("p95")
    return None if value is None else float(value)
