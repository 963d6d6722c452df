"""What the job screens share, Jobs, Drills and the failover plan: a job's state in
colour, its one-cell note, how long it took, a drill's step bars and benchmark table.
"""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text

from console.core.snapshot import Job, JobStep
from console.core.units import seconds_from_ms
from console.tui import format as fmt

BAR = "█"

STATE_STYLE = {
    "queued": "cyan",
    "running": "bold cyan",
    "succeeded": "green",
    "failed": "bold red",
    "cancelled": "yellow",
    "skipped": "dim",
    "pending": "dim",
}


def bench_table(bench: dict[str, Any] | None) -> Text:
    """A drill's benchmark, candidate against the vLLM baseline, level by level."""
    t = Text()
    if not bench:
        return t
    cold = bench.get("cold_start_s") or {}
    base = (cold.get("baseline") or {}).get("total_s")
    t.append("cold start ", style="bold")
    t.append(f"candidate {fmt.seconds(cold.get('candidate'))}  vLLM {fmt.seconds(base)}\n")
    t.append(
        f"{'conc':>5}  {'TTFT p95 cand / vLLM':>22}  {'ITL p95 cand / vLLM':>20}  "
        f"{'tok/s cand / vLLM':>18}\n",
        style="bold",
    )
    for level in bench.get("levels") or []:
        both = (level.get("candidate") or {}, level.get("baseline") or {})
        ttft = " / ".join(fmt.seconds(seconds_from_ms(x.get("ttft_p95_ms"))) for x in both)
        itl = " / ".join(fmt.seconds(seconds_from_ms(x.get("itl_p95_ms"))) for x in both)
        rate = " / ".join(
            f"{x['tokens_per_s']:.0f}" if x.get("tokens_per_s") else "?" for x in both
        )
        t.append(f"{level['concurrency']:>5}  {ttft:>22}  {itl:>20}  {rate:>18}\n")
    return t


def job_note(job: Job) -> Text:
    """A job in one cell: its error, else the step running, else what it achieved."""
    current = next((s for s in job.steps if s.state == "running"), None)
    if job.error:
        return Text(job.error, style="red")
    if current is not None:
        return Text(f"{current.name}: {current.detail}" if current.detail else current.name)
    rebuilt = job.result.get("time_to_rebuild_s")
    if rebuilt:
        return Text(f"time to rebuild {fmt.seconds(rebuilt)}")
    cold = job.result.get("cold_start", {}).get("total_s")
    if cold:
        return Text(f"cold start {cold:.1f} s")
    after = job.result.get("after")  # a failover's weights once it ended
    if isinstance(after, dict) and after:
        return Text("now " + weights_text({d: w for d, w in after.items() if w}))
    return Text("")


def weights_text(weights: dict[str, Any]) -> str:
    """A model's routes as the job screens write them: `deployment=weight ...`."""
    return " ".join(f"{d}={w}" for d, w in weights.items())


def took(job: Job) -> str:
    if job.created is None:
        return "?"
    end = time.time() if job.state in ("queued", "running") else (job.updated or time.time())
    return fmt.seconds(max(0.0, end - job.created))


def step_bars(steps: list[JobStep], width: int = 36, now: float | None = None) -> Text:
    """Each step's duration as a bar, scaled to the longest; a running step grows live."""
    now = time.time() if now is None else now
    spans = {
        s.name: (s.ended or now) - s.started
        for s in steps
        if s.started is not None and s.state != "skipped"
    }
    longest = max(spans.values(), default=0.0) or 1.0
    text = Text()
    for step in steps:
        span = spans.get(step.name)
        style = STATE_STYLE.get(step.state, "")
        text.append(f"{step.name:<10} ", style="bold")
        if span is None:
            text.append(" " * width)
            text.append(f"  {'':>7}  ")
        else:
            n = max(1, round(width * span / longest))
            text.append((BAR * n).ljust(width), style=style or "white")
            text.append(f"  {fmt.seconds(span):>7}  ")
        text.append(step.state, style=style)
        if step.state == "skipped" and step.detail:
            text.append(f"  {step.detail.partition(' /')[0][:60]}", style="dim")
        text.append("\n")
    return text
