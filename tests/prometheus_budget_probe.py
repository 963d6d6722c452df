"""Run by tests/test_prometheus_budget.py in its own process, so that what it measures is
the console's alone: refreshes of a real PromSource against a real Prometheus, each with
the Python heap's peak over it (tracemalloc) and the process's peak RSS after it.

    python -m tests.prometheus_budget_probe URL BUDGET_BYTES ...

One refresh per BUDGET_BYTES, in order; one JSON line each on stdout.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import tracemalloc

from console.collect.prometheus.source import PromSource
from console.core.config.load import parse_fleet


async def main(url: str, budgets: list[int]) -> None:
    fleet = parse_fleet(f'[fleet]\nname = "b"\n[prometheus]\nurl = "{url}"\ntimeout_s = 30\n')
    tracemalloc.start()
    async with PromSource(fleet) as source:
        for budget in budgets:
            source.refresh_bytes = budget
            before, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            await source.refresh()
            _, peak = tracemalloc.get_traced_memory()
            health = source.health
            line = {
                "budget": budget,
                "heap_peak": peak - before,
                "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "ok": health.ok,
                "failed": health.failed,
                "error": health.error,
                "refreshes": health.refreshes,
                "samples": health.samples,
            }
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], [int(b) for b in sys.argv[2:]]))
