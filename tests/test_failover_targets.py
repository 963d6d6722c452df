"""The failover's target is the healthiest deployment, and the plan says why
(console.collect.moves.failover_targets, used by the console's failover screen and
`engineroom failover --plan`). Issue 28, defect 11: on llama-3.1-70b the sickest row (TTFT
p95 20 s, queue 90, KV 88 %) was preselected because it came first in fleet.toml."""

from __future__ import annotations

from dataclasses import dataclass

from console.collect.moves.failover_targets import preselected, rank
from console.collect.views.gateway_view import parse
from console.core.config.load import parse_fleet
from console.core.snapshot import Latency, ModelStats, Percentiles
from tests.support.fleet import deployment, fleet_model, fleet_toml

FLEET = fleet_toml(
    fleet={"name": "t"},
    nodes=[{"name": "n", "agent": "http://127.0.0.1:9"}],
    models=[fleet_model(
        "llama-3.1-70b-instruct",
        *(deployment(d, "n", "vllm", 9000 + i)
          for i, d in enumerate(["a1", "a2-sick", "b1", "b2-unread", "b3-down"])),
        slo={"ttft_p95_ms": 1500, "itl_p95_ms": 80},
    )],
)  # fmt: skip


@dataclass
class Row:
    """A deployment's row as the fleet view has it (the fields the ranking reads)."""

    id: str
    state: str
    stats: ModelStats | None
    slo_ok: bool | None


def stats(queue: float, kv: float, ttft_p95: float | None, source: str = "histogram") -> ModelStats:
    ttft = Percentiles(p95=None if source == "mean" else ttft_p95, mean=ttft_p95, source=source)  # type: ignore[arg-type]
    return ModelStats(
        name="m", requests_waiting=queue, kv_cache_usage=kv, latency=Latency(ttft_s=ttft)
    )


MODEL = parse_fleet(FLEET).models[0]
ROWS = [
    Row("a1", "ready", stats(2, 0.40, 0.9), True),
    Row("a2-sick", "ready", stats(90, 0.88, 20.0), False),
    Row("b1", "ready", stats(0, 0.23, 0.7), True),
    Row("b2-unread", "ready", None, None),
    Row("b3-down", "down", None, None),
]


def test_the_healthiest_comes_first_and_the_sickest_after_every_healthy_one():
    ranked = rank(MODEL, ROWS, None, exclude=["a1"])  # failing over from a1
    assert [c.id for c in ranked] == ["b1", "b2-unread", "a2-sick", "b3-down"]
    assert preselected(ranked) == (
        "preselected b1: ready, p95 within SLO, KV 23%, queue 0, TTFT p95 700 ms (engine)"
    )
    sick = next(c for c in ranked if c.id == "a2-sick")
    assert sick.why == "ready, over its SLO, KV 88%, queue 90, TTFT p95 20000 ms (engine)"
    unread = next(c for c in ranked if c.id == "b2-unread")
    assert unread.why == "ready, SLO unknown, KV ?, queue ?"  # unknown, never 0


def test_a_queue_ranks_below_no_queue_and_kv_and_p95_break_ties():
    rows = [
        Row("a1", "ready", stats(3, 0.10, 0.2), True),
        Row("a2-sick", "ready", stats(0, 0.61, 0.9), True),
        Row("b1", "ready", stats(0, 0.32, 0.9), True),
    ]
    assert [c.id for c in rank(MODEL, rows, None)] == ["b1", "a2-sick", "a1", "b2-unread",
                                                      "b3-down"]  # fmt: skip


def test_what_clients_feel_at_the_gateway_ranks_before_the_engines_own_figures():
    gateway = {
        "b1": {"up": True, "ttft_s": {"p95": 1.2}},  # clients feel 1.2 s through the gateway
        "a1": {"up": False, "ttft_s": {"p95": None}},  # the gateway marks it down
    }
    rows = [Row("a1", "ready", stats(0, 0.2, 0.3), True), Row("b1", "ready", stats(0, 0.2, 0.3),
                                                                True)]  # fmt: skip
    view = parse({"models": {MODEL.name: gateway}})
    ranked = rank(MODEL, rows, view.routes(MODEL.name) if view else None)
    assert ranked[0].id == "b1" and "TTFT p95 1200 ms (gateway)" in ranked[0].why
    a1 = next(c for c in ranked if c.id == "a1")
    assert not a1.ready and a1.why.startswith("engine ready, down at the gateway")


def test_a_mean_is_not_a_p95_and_nothing_ready_is_said():
    rows = [Row("a1", "ready", stats(0, 0.2, 0.05, source="mean"), None)]
    (first, *_) = rank(MODEL, rows, None)
    assert first.ttft_p95_s is None and "TTFT" not in first.why
    assert preselected(rank(MODEL, [Row("a1", "down", None, None)], None, ["b1"])).startswith(
        "no deployment is ready; first listed a1"
    )
