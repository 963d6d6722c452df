"""Where a latency was measured, and the gap between two places that measured it.

The engine's own histograms (vLLM's `time_to_first_token_seconds`) start the clock when
the engine gets the request, after its API server has parsed and tokenized it. The
gateway's clock runs from the request arriving at the gateway to the first byte of the
answer going back, as a client sees it. A client can never see a lower TTFT than the
engine; the gap between the two is the API server, the network and the gateway. A large
gap during an incident means the time is lost before the engine, not in it.

The Models screen, `check` and its JSON label every latency with one of these places.
"""

from __future__ import annotations

from typing import Any, Literal

from console.core.snapshot import Percentiles

Place = Literal["engine", "gateway"]
ENGINE: Place = "engine"
GATEWAY: Place = "gateway"


def gateway_measure(snapshot: dict[str, Any] | None, model: str, deployment: str) -> dict | None:
    """This deployment in the gateway's admin snapshot (weight, up, its TTFT), or None."""
    if not snapshot or not deployment:
        return None
    found = (snapshot.get("models") or {}).get(model, {}).get(deployment)
    return found if isinstance(found, dict) else None


def gateway_ttft_p95(measure: dict[str, Any] | None) -> float | None:
    if measure is None:
        return None
    p95 = (measure.get("ttft_s") or {}).get("p95")
    return float(p95) if isinstance(p95, int | float) else None


def ttft_gap_s(engine: Percentiles | None, measure: dict[str, Any] | None) -> float | None:
    """Gateway TTFT p95 minus the engine's, where both are percentiles (a windowed mean,
    Triton's only figure, is not compared with a p95)."""
    gateway = gateway_ttft_p95(measure)
    if engine is None or engine.p95 is None or gateway is None:
        return None
    return gateway - engine.p95
