"""`engineroom drill show` reads a report from an agent that may be compromised: the JSON
is typed before the console renders it (console/core/drills/report_check.py), and what is
not a report is one line naming the node, never a traceback (issue 27, the drill-report
sibling of defect 7).

The agent here is a real HTTP server on loopback answering as a compromised agent would
(tests/hostile_answers.py); the console is the real CLI."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import agent_env, run_cli
from tests.hostile_answers import Answers

FLEET = """\
[fleet]
name = "drills"

[[nodes]]
name = "bad"
agent = "{url}"
token_env = "T_DRILL_REPORT"
"""
GOOD = {"job_id": "j1", "drill": "rebuild", "state": "succeeded", "steps": []}

ANSWERS: dict[str, bytes] = {
    "a list": b"[]",
    "a string": b'"report"',
    "no job": json.dumps({**GOOD, "job_id": None}).encode(),
    "steps a string": json.dumps({**GOOD, "steps": "all of them"}).encode(),
    "a step's detail a number": json.dumps({**GOOD, "steps": [{"detail": 7}]}).encode(),
    "a step's time a string": json.dumps(
        {**GOOD, "steps": [{"spawn_to_first_output_s": "fast"}]}
    ).encode(),
    "started in the year 10^292": json.dumps({**GOOD, "started": 1e300}).encode(),
    "started a string": json.dumps({**GOOD, "started": "yesterday"}).encode(),
    "versions a list": json.dumps({**GOOD, "versions": ["12.4"]}).encode(),
    "gates of strings": json.dumps({**GOOD, "gates": ["ok"]}).encode(),
    "a validate row's prompt a number": json.dumps(
        {**GOOD, "validate": {"rows": [{"prompt": 5}]}}
    ).encode(),
    "exact match a string": json.dumps({**GOOD, "validate": {"exact_match": "all"}}).encode(),
    "benchmark levels a string": json.dumps({**GOOD, "benchmark": {"levels": "x"}}).encode(),
    "cold start a list": json.dumps({**GOOD, "benchmark": {"cold_start_s": [1]}}).encode(),
    "promoted a string": json.dumps({**GOOD, "promoted": "yes"}).encode(),
    "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
}


def _agent(answer: bytes) -> Any:
    def route(method: str, path: str, body: bytes) -> tuple[int, bytes, str] | None:
        if path.split("?")[0] == "/v1/jobs/j1/report":
            return 200, answer, "application/json"
        return None

    return route


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_a_report_that_is_not_one_is_one_line_naming_the_node(tmp_path, name):
    """Before: TypeError, KeyError, OverflowError or RecursionError tracebacks (and
    --json printed what Markdown could not read). Half the cases each way."""
    shape = "--json" if sorted(ANSWERS).index(name) % 2 else "--markdown"
    with Answers(_agent(ANSWERS[name])) as agent:
        fleet = tmp_path / "fleet.toml"
        fleet.write_text(FLEET.format(url=agent.url))
        env = agent_env(T_DRILL_REPORT="drill-report-token-0123")
        done = run_cli("drill", "show", "j1", shape, "--fleet", str(fleet), env=env)
    said = f"exit {done.returncode}, stdout {done.stdout[:300]!r}, stderr {done.stderr[-800:]!r}"
    assert done.returncode == 1, said
    assert "Traceback" not in done.stderr, said
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("engineroom: bad: drill job 'j1': "), said
    assert "not a drill report" in lines[0] and done.stdout == "", said


def test_a_report_the_agent_made_reads(tmp_path):
    """The typing takes what the agent's own drillreport.report gives, every part of it."""
    report = {
        **GOOD, "node": "bad", "model": "m", "deployment": "m-trt", "who": "alice", "error": None,
        "started": 1_796_083_200.0, "ended": 1_796_083_500.0, "total_s": 300.0,
        "time_to_rebuild_s": 280.0, "build_key": "abc", "cache": "miss",
        "versions": {"driver": "560.35", "cuda": "12.6"},
        "steps": [{"name": "build", "state": "succeeded", "duration_s": 200.0, "exit_code": 0,
                   "spawn_to_first_output_s": 0.2, "exit_to_recorded_s": 0.01, "detail": None}],
        "gates": [{"gate": "exact match", "ok": True, "detail": "10/10"}],
        "validate": {"prompts": 10, "exact_match": 1.0, "first_n": 32, "unit": "tokens",
                     "first_n_agreement": 1.0,
                     "rows": [{"prompt": "hi", "exact": True, "agree_tokens": 32}]},
        "benchmark": {"cold_start_s": {"candidate": 40.0, "baseline": {"total_s": 90.0,
                                                                       "job_id": "j0"}},
                      "levels": [{"concurrency": 4, "candidate": {"ttft_p95_ms": 80.0},
                                  "baseline": {"ttft_p95_ms": 90.0}}]},
        "baseline": {"deployment": "m-vllm"}, "promoted": {"path": "/e", "link": "/l"},
        "manifest": {"any": ["thing"]}, "log_tail": ["line 1", "line 2"],
    }  # fmt: skip
    with Answers(_agent(json.dumps(report).encode())) as agent:
        fleet = tmp_path / "fleet.toml"
        fleet.write_text(FLEET.format(url=agent.url))
        env = agent_env(T_DRILL_REPORT="drill-report-token-0123")
        done = run_cli("drill", "show", "j1", "--fleet", str(fleet), env=env)
        as_json = run_cli("drill", "show", "j1", "--json", "--fleet", str(fleet), env=env)
    assert done.returncode == 0, done.stderr
    assert "# Drill rebuild: SUCCEEDED" in done.stdout and "| build | succeeded |" in done.stdout
    assert "## Benchmark" in done.stdout and "line 2" in done.stdout
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == report
