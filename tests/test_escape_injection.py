"""Outside text cannot write terminal sequences or Markdown structure (issue 27, defect 6).

ESC, OSC (a window title, a hyperlink), CSI (clear, colour), their 8-bit forms, CR, bidi
overrides and zero-width characters, fed through the real paths: a real agent probing a
vLLM server whose version and model names carry them, a compromised node's agent, a
gateway answering with them, a real Prometheus scraping an exporter whose label values
carry them, and a recording holding them. Before the fix, every command below printed
them raw. The TUI, in a real terminal, and the web view are in
tests/test_escape_injection_tui.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from console.collect.sources.collector import NodeState
from console.collect.views.check import to_prometheus
from console.collect.views.view import build
from console.core.config.load import parse_fleet
from tests.conftest import VIEWER, agent_env, run_cli, start_agent
from tests.engines.servers import free_port, stop
from tests.hostile_answers import (
    EVERY,
    MARKERS,
    PAYLOADS,
    Answers,
    compromised_agent,
    hostile_gateway,
    hostile_vllm,
    unsafe,
)
from tests.hostile_exporter import Exporter, series
from tests.prometheus_proc import start_prometheus, stop_prometheus
from tests.support.fleet import deployment, fleet_toml, vllm_profile


def fleet_text(real: str, bad: str, gateway: str, vllm: str, state: Path) -> str:
    """Node "real" (a real agent probing `vllm`), node "bad" (a compromised agent), a gateway."""
    nodes = [
        {"name": n, "agent": url, "token_env": "T_ESC"} for n, url in [("real", real), ("bad", bad)]
    ]
    return fleet_toml(
        fleet={"name": "esc", "refresh_s": 0.5},
        agent={"state_dir": state, "scrape_interval_s": 0.5, "probe_timeout_s": 2,
               "discover": False},
        gateway={"url": gateway, "token_env": "T_ESC_GW"},
        nodes=nodes,
        models=[{"name": "m", "deployments": [
            {"id": "m-real", "node": "real", "engine": "vllm", "endpoint": vllm},
            deployment("m-bad", "bad", "vllm", 8000),
        ]}],
        profiles={"p": vllm_profile("bad", "/models/m", 8000, None, served="m", args=None)},
    )  # fmt: skip


@dataclass
class Hostile:
    fleet: Path
    text: str
    env: dict[str, str]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    """A real agent (node "real") probing a vLLM server with hostile answers; a
    compromised agent (node "bad"); a hostile gateway. The console's fleet file names them."""
    root = tmp_path_factory.mktemp("escapes")
    with (
        Answers(hostile_vllm) as vllm,
        Answers(compromised_agent("bad")) as bad,
        Answers(hostile_gateway) as gateway,
    ):
        port = free_port()
        text = fleet_text(
            real=f"http://127.0.0.1:{port}",
            bad=bad.url,
            gateway=gateway.url,
            vllm=vllm.url,
            state=root / "state",
        )
        workdir = root / "agent"
        workdir.mkdir()
        agent = start_agent(workdir, text, "real", port)
        fleet = root / "fleet.toml"
        fleet.write_text(text)
        try:
            yield Hostile(fleet, text, agent_env(T_ESC=VIEWER, T_ESC_GW="gw-token-0123456789"))
        finally:
            stop(agent.process, grace=5)


def cli(hostile: Hostile, *args: str) -> tuple[str, str]:
    done = run_cli(*args, "--fleet", str(hostile.fleet), env=hostile.env, timeout=90)
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout, done.stderr


def assert_neutralized(text: str, *markers: str) -> None:
    assert unsafe(text) == [], f"raw {unsafe(text)!r} in:\n{text!r}"
    for marker in markers:
        assert marker in text, f"{marker!r} not in:\n{text}"


def test_check_shows_hostile_engine_answers_as_escapes(hostile):
    # The real agent's engine: its version; the compromised agent: its engines, alerts.
    out, err = cli(hostile, "check")
    assert "real " in out and "bad " in out
    assert_neutralized(out, *MARKERS)
    assert_neutralized(err)
    # Still one line per node: a CR or newline in a value starts none.
    assert len([line for line in out.splitlines() if line.startswith(("real ", "bad "))]) == 2


def test_agent_once_prints_its_engines_answers_as_escapes(hostile):
    done = run_cli(
        "agent", "--once", "--fleet", str(hostile.fleet), "--node", "real", env=hostile.env
    )
    assert done.returncode == 0, done.stderr
    assert_neutralized(done.stdout, r"\x1b]0;PWNED-TITLE\x07", r"ok\rFAIL")


def test_jobs_and_the_vllm_commands_print_an_agents_text_as_escapes(hostile):
    out, err = cli(hostile, "jobs")
    assert "j-run" in out and "j-drill" in out
    assert_neutralized(out + err, r"\x1b]0;PWNED-TITLE\x07")
    # A start the agent takes and fails: its steps, error and log tail.
    out, err = cli(hostile, "vllm", "start", "--node", "bad", "--profile", "p", "--wait")
    assert "j-new" in out
    assert_neutralized(out + err, *MARKERS)
    # A stop the agent refuses: its error and its checks.
    out, err = cli(hostile, "vllm", "stop", "--node", "bad", "--engine", "vllm-8000")
    assert "refused" in err
    assert_neutralized(out + err, *MARKERS)


def test_the_drill_commands_print_an_agents_text_as_escapes(hostile):
    out, err = cli(hostile, "drill", "list")
    assert "j-drill" in out
    assert_neutralized(out + err, r"\x1b[2JCLEARED", r"ok\rFAIL")
    out, err = cli(hostile, "drill", "what-if", "--driver", "580")
    assert "REBUILD" in out
    assert_neutralized(out + err, *MARKERS)


def test_a_drill_report_in_markdown_keeps_its_structure(hostile):
    out, err = cli(hostile, "drill", "show", "j-drill")
    assert out.startswith("# Drill d")
    assert_neutralized(out + err)
    lines = out.splitlines()
    assert lines[0] == "# Drill d\\\\x1b\\[2JCLEARED: FAILED"
    # Every table row has exactly its columns: no value ends a cell or a row.
    for row in (line for line in lines if line.startswith("| ")):
        cells = len(re.findall(r"(?<!\\)\|", row.replace("\\\\", "")))
        assert cells == len(re.findall(r"(?<!\\)\|", _header_of(lines, row))), row
    # The log tail's fence is longer than any run of backticks in it: "```" stays inside.
    fence = lines.index("## Last lines of the failing step") + 2
    assert lines[fence] == "````" and lines[-1] == "````" and "```" in lines[fence + 1 : -1]


def _header_of(lines: list[str], row: str) -> str:
    """The header row of the table `row` is in."""
    i = lines.index(row)
    while i > 0 and lines[i - 1].startswith("| "):
        i -= 1
    return lines[i]


def test_failover_prints_a_gateways_text_as_escapes(hostile):
    out, err = cli(hostile, "failover", "m", "--to", "m-real", "--wait")
    assert "fo-1" in out
    assert_neutralized(out + err, *MARKERS)
    out, err = cli(hostile, "failover", "m", "--to", "refused")
    assert "failover refused" in err
    assert_neutralized(out + err, r"\x1b]0;PWNED-TITLE\x07", r"ok\rFAIL")


def test_check_as_prometheus_text_neutralizes_a_node_name():
    """A node name reaches `check --prometheus` raw only through a fleet file or a source
    that lets it through; the labels are escaped anyway, as every output."""
    fleet = parse_fleet('[fleet]\nname = "f"\n')
    name = "n" + EVERY
    view = build(fleet, {name: NodeState(name, "agent")}, 1.0)
    text = to_prometheus(fleet, view, {name: NodeState(name, "agent")})
    assert_neutralized(text, r"\\x1b]0;PWNED-TITLE\\x07")


# -- a real Prometheus scraping an exporter whose label values are hostile -----------------


def exporter_page(scrape: int) -> str:
    """The agent's series of one node, every label value but the node's hostile."""
    text = ""
    for i, (name, payload) in enumerate(PAYLOADS.items()):
        engine = {"node": "pnode", "engine": f"e{i}-{payload}", "kind": "vllm"}
        state = {**engine, "version": "0.1" + payload, "state": "ready"}
        text += series("engineroom_engine_state", state, "1")
        model = {**engine, "model": f"m-{name}-{payload}"}
        text += series("engineroom_model_requests_running", model, "1")
    return text + series("engineroom_gpu_temperature_celsius", {"node": "pnode", "gpu": "0"}, "40")


def test_check_reading_prometheus_shows_hostile_labels_as_escapes(tmp_path):
    with Exporter(exporter_page) as exporter:
        prom = start_prometheus(tmp_path / "prometheus", [exporter.job("hostile")])
        try:
            prom.wait_targets_up(1, timeout=60)
            prom.wait_query('engineroom_model_requests_running{node="pnode"}')
            fleet = tmp_path / "fleet.toml"
            fleet.write_text(f'[fleet]\nname = "p"\n[prometheus]\nurl = "{prom.url}"\n')
            done = run_cli("check", "--fleet", str(fleet), timeout=90)
        finally:
            stop_prometheus(prom)
    assert "Traceback" not in done.stderr, done.stderr
    assert "pnode" in done.stdout, done.stdout
    assert_neutralized(done.stdout + done.stderr, *MARKERS)


# -- a recording holding them --------------------------------------------------------------


def test_the_timeline_markdown_keeps_one_escaped_line_per_entry(tmp_path):
    from console.collect.recordings.writer import RecordingWriter
    from tests.test_replay import CPU, T0

    cpu = json.loads(CPU.read_text())
    engines = [dict(e) for e in cpu["engines"]]
    engines[0]["id"] = "e" + PAYLOADS["osc-title"]
    engines[0]["models"] = [{"name": "m" + PAYLOADS["cr"]}]
    path = tmp_path / "hostile.rec"
    writer = RecordingWriter(path, fleet_text="", fleet_source="fleet`" + EVERY, keyframe_s=5)
    for second in range(10):
        state = [dict(e, state="down" if 3 <= second < 6 and i == 0 else e["state"])
                 for i, e in enumerate(engines)]  # fmt: skip
        down = second >= 8
        writer.node("n" + PAYLOADS["bidi"], None if down else {**cpu, "engines": state},
                    "down" if down else "up", ("gone " + EVERY) if down else None,
                    t=T0 + second)  # fmt: skip
    writer.event(
        {"t": T0 + 4, "kind": "action", "severity": "info", "subject": "s|" + EVERY,
         "message": "msg\n| fake | row |" + EVERY, "who": "w`" + EVERY, "why": "y<b>" + EVERY}
    )  # fmt: skip
    writer.close()
    done = run_cli("timeline", str(path))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert_neutralized(out, r"\\x1b\]0;PWNED-TITLE\\x07", r"ok\\rFAIL", r"msg\\n\| fake \| row \|")
    rows = [line for line in out.splitlines() if line.startswith("| 00:")]
    assert len(rows) == 4, out  # engine down, the action, engine up, node down: no more
    for row in rows:  # 8 pipes that are not escaped: 7 cells
        assert len(re.findall(r"(?<!\\)\|", row.replace("\\\\", ""))) == 8, row
    assert "<b>" not in out and "\\<b\\>" in out
