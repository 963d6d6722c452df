"""A rebuild drill's report, from its job record: JSON for tools, Markdown for people.

The agent persists the job (steps, timings, gates, the validate and benchmark figures) in
its SQLite store; the report is derived from that record, so the agent's
`GET /v1/jobs/{id}/report` and `engineroom drill show ID --markdown` agree.
"""

from __future__ import annotations

import textwrap
import time
from typing import Any

from console.core import snapshot, wire
from console.core.safetext import for_markdown_cell as cell
from console.core.safetext import markdown_block, markdown_code
from console.core.units import ms_from_seconds

Job = wire.Job | snapshot.Job

FINAL = ("succeeded", "failed", "cancelled")
VERSION_NAMES = (
    ("driver", "driver"),
    ("cuda", "CUDA"),
    ("tensorrt", "TensorRT"),
    ("tensorrt_llm", "TensorRT-LLM"),
    ("gpu", "GPU"),
    ("compute_capability", "compute capability"),
)


def report(job: Job, node: str | None = None) -> dict[str, Any]:
    r = job.result
    runs = r.get("step_runs") or {}
    steps = []
    for step in job.steps:
        run = runs.get(step.name, {})
        duration = (
            round(step.ended - step.started, 3)
            if step.started is not None and step.ended is not None
            else None
        )
        steps.append(
            {
                "name": step.name,
                "state": step.state,
                "duration_s": duration,
                "exit_code": run.get("exit_code"),
                "spawn_to_first_output_s": run.get("spawn_to_first_output_s"),
                "exit_to_recorded_s": run.get("exit_to_recorded_s"),
                "detail": step.detail,
            }
        )
    ended = job.updated if job.state in FINAL else None
    return {
        "drill": r.get("drill") or job.params.get("drill"),
        "job_id": job.id,
        "node": node,
        "model": r.get("model"),
        "deployment": r.get("deployment"),
        "state": job.state,
        "error": job.error,
        "who": job.who,
        "started": job.created,
        "ended": ended,
        "total_s": round(ended - job.created, 3) if ended and job.created else None,
        "time_to_rebuild_s": r.get("time_to_rebuild_s"),
        "build_key": r.get("build_key"),
        "cache": r.get("cache"),
        "versions": r.get("versions") or {},
        "steps": steps,
        "gates": r.get("gates") or [],
        "validate": r.get("validate"),
        "benchmark": r.get("benchmark"),
        "baseline": r.get("baseline"),
        "promoted": r.get("promoted"),
        "manifest": r.get("manifest"),
        "log_tail": r.get("log_tail"),
    }


def _v(value: Any, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def _words(text: str, width: int) -> str:
    """At most `width` characters, cut between words with an ellipsis, never inside one."""
    return textwrap.shorten(text, width, placeholder=" …") or text[: width - 1] + "…"


def _when(t: float | None) -> str:
    return "unknown" if t is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _row(cells: list[str]) -> str:
    """A table row; each value one line, escaped (a value is the agent's, the engine's
    or a tool's output: outside text)."""
    return "| " + " | ".join(map(cell, cells)) + " |"


def markdown(rep: dict[str, Any]) -> str:
    """Every value from the record is outside text: made safe for the Markdown it goes
    in (console.core.safetext), so none can end a cell, open a link or HTML, or carry a
    terminal sequence to whoever reads the file on a terminal."""
    out = [f"# Drill {cell(rep['drill'])}: {cell(str(rep['state']).upper())}", ""]
    out += [
        f"- job {markdown_code(rep['job_id'])} on node {cell(rep['node'] or 'unknown')}, "
        f"by {cell(rep['who'] or 'unknown')}",
        f"- rebuilds deployment {markdown_code(rep['deployment'])} of model "
        f"{markdown_code(rep['model'])}",
        f"- started {_when(rep['started'])}, ended {_when(rep['ended'])}",
        f"- time to rebuild: {cell(_v(rep['time_to_rebuild_s'], ' s'))}"
        + ("" if rep["time_to_rebuild_s"] is not None else " (the drill did not promote)"),
        f"- build key {markdown_code(rep['build_key'] or 'unknown')} "
        f"({cell(rep['cache'] or 'not reached')})",
    ]
    if rep["error"]:
        out += ["", f"**Stopped:** {cell(rep['error'])}"]
    if rep["versions"]:
        out += ["", "## Versions on the node", "", _row(["", "version"]), _row(["---", "---"])]
        out += [_row([name, _v(rep["versions"].get(key))]) for key, name in VERSION_NAMES]
    out += ["", "## Steps", ""]
    out.append(
        _row(["step", "state", "time", "exit", "spawn → output", "exit → recorded", "detail"])
    )
    out.append(_row(["---"] * 7))
    for s in rep["steps"]:
        out.append(
            _row(
                [
                    s["name"],
                    s["state"],
                    _v(s["duration_s"], " s"),
                    "" if s["exit_code"] is None else str(s["exit_code"]),
                    ms_from_seconds(s["spawn_to_first_output_s"], unknown=""),
                    ms_from_seconds(s["exit_to_recorded_s"], unknown=""),
                    s["detail"] or "",  # whole: a postmortem quotes it, a cut misleads
                ]
            )
        )
    if rep["gates"]:
        out += ["", "## Gates", "", _row(["gate", "result", "detail"]), _row(["---"] * 3)]
        out += [_row([g["gate"], "pass" if g["ok"] else "FAIL", g["detail"]]) for g in rep["gates"]]
    val = rep["validate"]
    if val:
        out += [
            "",
            "## Validate",
            "",
            f"Against {markdown_code((rep['baseline'] or {}).get('deployment', 'the baseline'))}"
            f", greedy, {cell(val['prompts'])} prompts: exact match "
            f"{cell(_pct(val['exact_match']))}, first {cell(val['first_n'])} {cell(val['unit'])}"
            f" agree {cell(_pct(val['first_n_agreement']))}.",
            "",
            _row(["prompt", "exact", f"{val['unit']} in common"]),
            _row(["---"] * 3),
        ]
        out += [
            _row([_words(r["prompt"], 60), "yes" if r["exact"] else "no", str(r["agree_tokens"])])
            for r in val["rows"]
        ]
    bench = rep["benchmark"]
    if bench:
        cold = bench.get("cold_start_s") or {}
        base = cold.get("baseline") or {}
        out += [
            "",
            "## Benchmark",
            "",
            f"Cold start: candidate {cell(_v(cold.get('candidate'), ' s'))}, vLLM baseline "
            f"{cell(_v(base.get('total_s'), ' s'))}"
            + (
                f" (job {cell(base['job_id'])})"
                if base.get("job_id")
                else " (no vLLM start recorded)"
            ),
            "",
            _row(
                [
                    "concurrency",
                    "TTFT p95 cand.",
                    "TTFT p95 vLLM",
                    "ITL p95 cand.",
                    "ITL p95 vLLM",
                    "tok/s cand.",
                    "tok/s vLLM",
                    "errors cand./vLLM",
                ]
            ),
            _row(["---"] * 8),
        ]
        for level in bench.get("levels") or []:
            c, b = level.get("candidate") or {}, level.get("baseline") or {}
            out.append(
                _row(
                    [
                        str(level["concurrency"]),
                        _v(c.get("ttft_p95_ms"), " ms"),
                        _v(b.get("ttft_p95_ms"), " ms"),
                        _v(c.get("itl_p95_ms"), " ms"),
                        _v(b.get("itl_p95_ms"), " ms"),
                        _v(c.get("tokens_per_s")),
                        _v(b.get("tokens_per_s")),
                        f"{c.get('errors', '?')}/{b.get('errors', '?')}",
                    ]
                )
            )
    if rep["promoted"]:
        out += [
            "",
            "## Promoted",
            "",
            f"- {cell(rep['promoted']['path'])}",
            f"- {cell(rep['promoted']['link'])}",
        ]
    if rep["log_tail"]:
        out += ["", "## Last lines of the failing step", "", *markdown_block(rep["log_tail"])]
    return "\n".join(out) + "\n"


def _pct(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.0%}"
