"""One refresh's answers are bounded together, not only one by one (issue 27, defect 10).

A refresh asks 14 queries at once and holds every decoded answer (about 8x its JSON)
until it ends, so a cap on one answer bounded a refresh only at 14 caps: 934 MiB
measured under an 8 MiB cap, tens of GiB at the default. `max_refresh_bytes` bounds
them together: each answer reserves its bytes as they arrive, and the one that would
pass the budget is refused, by name.

A real Prometheus scrapes a real exporter (tests/hostile_exporter.py) whose series make
six queries answer about 8.5 MiB each, each series with an 8 KiB label (a real
Prometheus makes large answers cheaply this way: 6,000 series). The console runs in its own
process (tests/prometheus_budget_probe.py), which measures its heap's peak over each
refresh with tracemalloc, and its peak RSS.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostile_exporter import Exporter, series
from tests.prometheus_proc import PrometheusProc, start_prometheus, stop_prometheus

pytestmark = pytest.mark.engines

MIB = 2**20
PAD = "p" * 8192
PER_FAMILY = 1000  # series; about 8.5 MiB of answer each
# The queries whose answers carry PAD: the agent's series keep every label; the others
# carry it in a label they group by (a UUID, a GPU label, a model name).
BULKY = {"agent_gpu", "agent_model", "agent_engine", "gpu_id", "gpu", "vllm gauges"}


def bulky_page(scrape: int) -> str:
    lines = []
    for i in range(PER_FAMILY):
        gpu = {"node": "bulk", "gpu": str(i), "pad": PAD}
        lines.append(series("engineroom_gpu_temperature_celsius", gpu, "50"))
        engine = {"node": "bulk", "engine": f"vllm-{i}", "kind": "vllm", "pad": PAD}
        lines.append(series("engineroom_engine_state", {**engine, "state": "ready"}, "1"))
        lines.append(series("engineroom_model_requests_running", {**engine, "model": "m"}, "1"))
        lines.append(
            series("DCGM_FI_DEV_GPU_TEMP", {"Hostname": "b2", "gpu": str(i), "UUID": PAD}, "41")
        )
        lines.append(series("DCGM_FI_DEV_POWER_USAGE", {"Hostname": "b3", "gpu": f"{i}{PAD}"}, "9"))
        lines.append(
            series("vllm:num_requests_running", {"Hostname": "b4", "model_name": f"{i}{PAD}"}, "1")
        )
    return "".join(lines)


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusProc]:
    work = tmp_path_factory.mktemp("budget")
    with Exporter(bulky_page) as exporter:
        # A scrape every 10 s, not every second: each reads 50 MiB.
        job = exporter.job("bulky", scrape_interval="10s", scrape_timeout="10s")
        prom = start_prometheus(work / "prometheus", [job])
        try:
            prom.wait_targets_up(1, timeout=60)
            prom.wait_query("count(engineroom_engine_state)", timeout=60)
            yield prom
        finally:
            stop_prometheus(prom)


def refreshes(prom: PrometheusProc, *budgets: int) -> list[dict]:
    probe = subprocess.run(
        [sys.executable, "-m", "tests.prometheus_budget_probe", prom.url, *map(str, budgets)],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    return [json.loads(line) for line in probe.stdout.splitlines()]


def test_a_refresh_past_its_budget_refuses_the_query_that_crosses_it_by_name(prom):
    budget = 10 * MIB  # one of the six large answers fits; any second one would cross
    first, again, small, unbounded = refreshes(prom, budget, budget, 5 * MIB, 1024 * MIB)
    for bounded in (first, again):
        # Prometheus answers; five of the six large queries are refused, each named.
        assert bounded["ok"] is True and bounded["failed"] == 5, bounded
        error = bounded["error"]
        said = "query: refused: the refresh's answers would pass 10 MiB (max_refresh_bytes; "
        assert any(error.startswith(f"{name} {said}") for name in BULKY), error
        also = error.partition("; also failed: ")[2].split(", ")
        assert len(also) == 4 and set(also) < BULKY, error
        # What the refresh held: the answers it took (at most the budget, and decoded
        # here about as large, the long labels being most of it) and the answers being
        # read, which share the same budget until refused.
        assert bounded["heap_peak"] < 3 * budget, bounded
    assert again["refreshes"] == 2  # the next refresh ran, and was bounded again
    # Under a budget smaller than any large answer, each is refused, and what it read
    # is let go at once (before, the error's traceback held it to the refresh's end:
    # 29 MiB under a 5 MiB budget).
    assert small["failed"] == 6 and small["heap_peak"] < 2 * 5 * MIB, small
    # Given room, the same refresh reads every answer: what the bound saved.
    assert unbounded["ok"] is True and unbounded["failed"] == 0, unbounded
    assert unbounded["heap_peak"] > 2 * first["heap_peak"], (first, unbounded)
    print(
        f"heap peak {first['heap_peak'] / MIB:.1f} MiB under a {budget // MIB} MiB budget, "
        f"{unbounded['heap_peak'] / MIB:.1f} MiB unbounded; peak RSS "
        f"{first['maxrss_kib'] / 1024:.0f} / {unbounded['maxrss_kib'] / 1024:.0f} MiB"
    )


def test_the_budget_is_a_setting_in_the_prometheus_section():
    from console.core.config.load import ConfigError, parse_fleet

    base = '[fleet]\nname = "t"\n[prometheus]\nurl = "http://p:9090"\n'
    section = parse_fleet(base).prometheus
    assert section is not None and section.max_refresh_bytes == 256 * MIB
    section = parse_fleet(base + "max_refresh_bytes = 65536\n").prometheus
    assert section is not None and section.max_refresh_bytes == 65536
    with pytest.raises(ConfigError) as exc:
        parse_fleet(base + "max_refresh_bytes = 10\n")
    assert "fleet.toml:5: prometheus.max_refresh_bytes: " in str(exc.value)
