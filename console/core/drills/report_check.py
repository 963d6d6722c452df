"""What a drill report from an agent must be before the console renders it.

`engineroom drill show` reads the report (console.core.drills.report.report's dict) from an
agent, which may be compromised or of another version: outside JSON. drillreport.markdown
indexes it, slices its strings, formats its numbers and its times; a list where an object
goes, or a start time of 1e300, ended the command with a traceback. The report is typed
here (msgspec, as the console's snapshots are) before anything reads it: a value the
renderer only prints may be anything, what it indexes, slices or computes with is typed.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

# A time the renderer can show as a date: 1970 to 9999.
Time = Annotated[float, msgspec.Meta(ge=0.0, le=253_402_300_799.0)]


class ReportError(ValueError):
    """The agent's answer is not a drill report: says where in it and why."""


class _Step(msgspec.Struct, gc=False):
    name: Any = None
    state: Any = None
    duration_s: Any = None
    exit_code: Any = None
    spawn_to_first_output_s: float | None = None
    exit_to_recorded_s: float | None = None
    detail: str | None = None


class _Gate(msgspec.Struct, gc=False):
    gate: Any = None
    ok: bool = False
    detail: Any = None


class _Compared(msgspec.Struct, gc=False):
    prompt: str = ""
    exact: bool = False
    agree_tokens: Any = None


class _Validate(msgspec.Struct, gc=False):
    prompts: Any = None
    exact_match: float | None = None
    first_n: Any = None
    unit: Any = None
    first_n_agreement: float | None = None
    rows: list[_Compared] = []


class _ColdStart(msgspec.Struct, gc=False):
    candidate: Any = None
    baseline: dict[str, Any] | None = None


class _Level(msgspec.Struct, gc=False):
    concurrency: Any = None
    candidate: dict[str, Any] | None = None
    baseline: dict[str, Any] | None = None


class _Benchmark(msgspec.Struct, gc=False):
    cold_start_s: _ColdStart | None = None
    levels: list[_Level] = []


class _Promoted(msgspec.Struct, gc=False):
    path: Any = None
    link: Any = None


class _Report(msgspec.Struct, gc=False):
    job_id: str  # every report names its job: an answer without one is not a report
    drill: Any = None
    node: Any = None
    model: Any = None
    deployment: Any = None
    state: Any = None
    error: Any = None
    who: Any = None
    started: Time | None = None
    ended: Time | None = None
    total_s: Any = None
    time_to_rebuild_s: Any = None
    build_key: Any = None
    cache: Any = None
    versions: dict[str, Any] = {}
    steps: list[_Step] = []
    gates: list[_Gate] = []
    validate: _Validate | None = None
    benchmark: _Benchmark | None = None
    baseline: dict[str, Any] | None = None
    promoted: _Promoted | None = None
    manifest: Any = None
    log_tail: list[Any] | None = None


def report_from(data: Any) -> dict[str, Any]:
    """The agent's report, typed and back as the dict drillreport.markdown reads (every
    key there); ReportError if it is not one."""
    try:
        report = msgspec.convert(data, _Report)
    except msgspec.ValidationError as exc:
        raise ReportError(f"not a drill report: {exc}") from None
    except RecursionError:
        raise ReportError("not a drill report: nested too deep") from None
    out: dict[str, Any] = msgspec.to_builtins(report)
    return out
