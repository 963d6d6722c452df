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

from console.collect.views.gateway_view import GatewayDeployment
from console.core.snapshot import Percentiles

Place = Literal["engine", "gateway"]
ENGINE: Place = "engine"
GATEWAY: Place = "gateway"


# A gateway p95 under the engine's by no more than this share of the engine's is the two
# measurements' own error: the engine's p95 is interpolated inside a histogram bucket
# (vLLM's are 100-250 ms wide around typical TTFTs), the gateway's is exact over fewer
# requests (only those it passed, in its window).
GAP_NOISE = 0.25
GapReading = Literal["slower", "same", "disagree"]


def gap_reading(gap: float, engine_p95: float) -> GapReading:
    """How a TTFT gap reads. "slower": clients wait longer than the engine, as they must;
    "same": the gateway reads faster, but within the measurements' error (shown "~0");
    "disagree": faster by more, which no client can be: the two windows do not cover the
    same requests yet (shown "?", never as a negative gap)."""
    if gap >= 0:
        return "slower"
    return "same" if -gap <= GAP_NOISE * engine_p95 else "disagree"


def gap_text(gap: float | None, engine_p95: float | None, seconds: Any) -> str:
    """The gap as the Models screen and `check` print it; `seconds` formats a duration."""
    if gap is None or engine_p95 is None:
        return "-"
    reading = gap_reading(gap, engine_p95)
    return {"slower": "+" + seconds(gap), "same": "~0", "disagree": "?"}[reading]


def ttft_gap_s(engine: Percentiles | None, at_gateway: GatewayDeployment | None) -> float | None:
    """Gateway TTFT p95 minus the engine's, where both are percentiles (a windowed mean,
    Triton's only figure, is not compared with a p95)."""
    gateway = at_gateway.ttft_p95 if at_gateway is not None else None
    if engine is None or engine.p95 is None or gateway is None:
        return None
    return gateway - engine.p95
