"""`engineroom rules`: Prometheus alerting rules that fire exactly where the console alerts.

Each case is one node's snapshot. The console's alerts come from it (view.build, as the
TUI and `check` do); the same snapshot, rendered by the agent's /metrics code, is the input
of `promtool test rules` over the file `engineroom rules` wrote. Both must raise the
case's alerts and nothing else: the rules and the console cannot disagree. The cases
include values just under each threshold, which must stay quiet in both, a mean (never a
p95: unknown, quiet), and a breach far over its SLO (critical, not a warning). Further
down: a rule fires only after its `for:` and keeps firing its `keep_firing_for:` (the
console's holds), a Triton `ensemble` fires its own deployment's rule only, and where the
gateway measured a deployment its p95 decides (issue 28, #13).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from console.agent.api.exposition import render as render_metrics
from console.collect.promrules.alerts import render as render_rules
from console.collect.promrules.diagnoses import alert_name
from console.collect.sources.collector import NodeState
from console.collect.views.gateway_view import parse
from console.collect.views.view import build
from console.core import alertrules, diagnosis
from console.core.config.load import parse_fleet
from console.core.snapshot import decode_snapshot
from console.core.wire import (
    Engine,
    Gpu,
    Host,
    Latency,
    ModelStats,
    NodeInfo,
    Percentiles,
    Snapshot,
    TrtEngine,
    XidEvent,
)
from tests.conftest import run_cli
from tests.prometheus_proc import promtool
from tests.support.fleet import deployment, fleet_model, fleet_toml
from tests.support.rules import (
    NODE_A,
    TINY_DEPLOYMENTS,
    rules_written,
    snapshot,
    standby,
    triton,
    vllm,
)

FLEET_TEXT = fleet_toml(
    fleet={"name": "rules", "refresh_s": 1.0},
    agent={"window_s": 60},
    thresholds={
        "gpu_temp_warn_c": 80,
        "gpu_temp_crit_c": 90,
        "kv_cache_warn": 0.95,
        "error_rate": 0.05,
    },
    nodes=[NODE_A],
    models=[
        {
            "name": "tiny",
            "slo": {"ttft_p95_ms": 500, "itl_p95_ms": 50, "e2e_p95_ms": 2000, "error_rate": 0.02},
            "deployments": TINY_DEPLOYMENTS,
        }
    ],
)
FLEET = parse_fleet(FLEET_TEXT)
RULE_NAMES = [d.alert for d in alertrules.ALL if d.in_rules]


def latency(ttft_p95=None, itl_p95=None, itl_mean=None, e2e_p95=None) -> Latency:
    return Latency(
        ttft_s=Percentiles(p95=ttft_p95, mean=ttft_p95),
        itl_s=Percentiles(p95=itl_p95, mean=itl_mean),
        e2e_s=Percentiles(p95=e2e_p95),
    )


@dataclass
class Case:
    """A node's state, and the alerts it must raise: (alert, its labels, its value)."""

    gpus: list[Gpu] = field(default_factory=lambda: [Gpu(index=0, temperature_c=60)])
    engines: list[Engine] = field(default_factory=lambda: [vllm(), standby(), triton()])
    trt: list[TrtEngine] = field(default_factory=list)
    fires: list[tuple[str, dict[str, str], float]] = field(default_factory=list)


GPU0 = {"node": "a", "gpu": "0"}
VLLM = {"node": "a", "engine": "vllm-8001", "kind": "vllm", "model": "tiny"}
TRT = {"node": "a", "engine": "triton-8000", "kind": "triton", "model": "ens.v1"}
# An SLO figure of the vLLM deployment, judged at its engine (no gateway here).
VLLM_SLO = {**VLLM, "deployment": "tiny-vllm", "measured_at": "engine", "fleet_model": "tiny"}

CASES = {
    "all under their thresholds: quiet": Case(
        gpus=[
            Gpu(
                index=0,
                temperature_c=79.9,
                ecc_uncorrected=0,
                remapped_rows={"failure": False, "pending": True},
            )
        ],
        engines=[
            vllm(kv_cache_usage=0.94, error_rate=0.02, latency=latency(0.5, 0.05, e2e_p95=2.0)),
            standby("down"),  # a standby nobody started is not an outage
            triton(error_rate=0.0, latency=latency(itl_mean=0.049)),
        ],
        trt=[TrtEngine(deployment="tiny-trt", model="tiny", state="current")],
    ),
    "a GPU at the critical temperature": Case(
        gpus=[Gpu(index=0, temperature_c=90)],
        fires=[("EngineroomGpuTemperatureCritical", GPU0, 90)],
    ),
    "a GPU over the warning temperature": Case(
        gpus=[Gpu(index=0, temperature_c=85)],
        fires=[("EngineroomGpuTemperatureWarning", GPU0, 85)],
    ),
    "uncorrected ECC errors": Case(
        gpus=[Gpu(index=0, ecc_uncorrected=2)],
        fires=[("EngineroomGpuEccUncorrected", GPU0, 2)],
    ),
    "an XID event": Case(
        gpus=[Gpu(index=0, xid_events=[XidEvent(time=1.0, xid=79)])],
        fires=[("EngineroomGpuXid", GPU0, 79)],
    ),
    "a row remapping failure": Case(
        gpus=[Gpu(index=0, remapped_rows={"failure": True, "pending": False})],
        fires=[("EngineroomGpuRowRemapFailure", GPU0, 1)],
    ),
    "REBUILD REQUIRED": Case(
        trt=[TrtEngine(deployment="tiny-trt", model="tiny", state="stale", reasons=["driver"])],
        fires=[
            (
                "EngineroomRebuildRequired",
                {"node": "a", "deployment": "tiny-trt", "model": "tiny"},
                1,
            )
        ],
    ),
    "an engine down": Case(
        engines=[vllm("down"), standby(), triton()],
        fires=[
            (
                "EngineroomEngineDown",
                {
                    "node": "a",
                    "deployment": "tiny-vllm",
                    "engine": "vllm-8001",
                    "kind": "vllm",
                    "state": "down",
                },
                1,
            )
        ],
    ),
    "an engine unhealthy": Case(
        engines=[vllm(), standby(), triton("unhealthy")],
        fires=[
            (
                "EngineroomEngineUnhealthy",
                {
                    "node": "a",
                    "deployment": "tiny-trt",
                    "engine": "triton-8000",
                    "kind": "triton",
                    "state": "unhealthy",
                },
                1,
            )
        ],
    ),
    "p95 TTFT over the SLO": Case(
        engines=[vllm(latency=latency(0.6, 0.01)), standby(), triton()],
        fires=[("EngineroomSloTtftP95", {**VLLM_SLO, "stat": "p95"}, 0.6)],
    ),
    "88 times the TTFT SLO is critical, not a warning": Case(
        engines=[vllm(latency=latency(44.0, 0.01)), standby(), triton()],
        fires=[("EngineroomSloTtftP95", {**VLLM_SLO, "stat": "p95", "severity": "critical"}, 44)],
    ),
    "p95 ITL over the SLO": Case(
        engines=[vllm(latency=latency(0.2, 0.08)), standby(), triton()],
        fires=[("EngineroomSloItlP95", {**VLLM_SLO, "stat": "p95"}, 0.08)],
    ),
    "an ITL mean over the SLO is not a p95: unknown, quiet": Case(
        engines=[vllm(), standby(), triton(latency=latency(itl_mean=0.08))],
    ),
    "p95 request latency over the SLO": Case(
        engines=[vllm(latency=latency(e2e_p95=2.5)), standby(), triton()],
        fires=[("EngineroomSloE2eP95", {**VLLM_SLO, "stat": "p95"}, 2.5)],
    ),
    "an error rate over the model's SLO": Case(
        engines=[vllm(error_rate=0.03), standby(), triton()],
        fires=[("EngineroomErrorRate", VLLM_SLO, 0.03)],
    ),
    "an error rate five times the model's SLO is critical": Case(
        engines=[vllm(error_rate=0.1), standby(), triton()],
        fires=[("EngineroomErrorRate", {**VLLM_SLO, "severity": "critical"}, 0.1)],
    ),
    "a KV cache nearly full": Case(
        engines=[vllm(kv_cache_usage=0.96), standby(), triton()],
        fires=[("EngineroomKvCacheNearlyFull", VLLM, 0.96)],
    ),
}


def console_alerts(snap: Snapshot) -> set[str]:
    """The console's alerts on this snapshot, by their rule's name."""
    now = time.monotonic()
    # The agent's snapshot as the console reads it: its JSON, decoded as the collector does.
    console_snap = decode_snapshot(snap.model_dump_json())
    states = {"a": NodeState("a", "agent", snapshot=console_snap, last_ok=now)}
    view = build(FLEET, states, 1.0, now=now)
    return {alert.rule.alert for alert in view.alerts if alert.rule is not None}


def input_series(snap: Snapshot) -> list[dict[str, str]]:
    """The agent's /metrics for `snap`, as promtool's input series (steady for 3 minutes)."""
    out = []
    for line in render_metrics(snap).splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            out.append({"series": series, "values": f"{value}x3"})
    return out


def go_number(value: float) -> str:
    """A float the way Go's templates print {{ $value }}."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def rules_by_name(rules_text: str) -> dict[str, dict[str, str]]:
    """alert name -> its labels, summary and description, read back from the YAML. Where
    two rules share a name (a model's error rate, then the default for the others), the
    first: the cases' models are all in the fleet."""
    rules: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in rules_text.splitlines():
        if m := re.match(r"\s+- alert: (\w+)$", line):
            current = rules.setdefault(m.group(1), {}) if m.group(1) not in rules else {}
        elif m := re.match(r"\s+(\w+): (\".*\")$", line):
            current[m.group(1)] = json.loads(m.group(2))
    return rules


def expected_alert(rule: dict[str, str], labels: dict[str, str], value: float) -> dict:
    """The alert as promtool reports it: the series' labels, the rule's, and the
    annotations with their templates filled in."""

    def fill(template: str) -> str:
        template = template.replace("{{ $value }}", go_number(value))
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)

    rule_labels = {k: rule[k] for k in ("severity", "fleet") if k in rule}
    return {
        "exp_labels": {**rule_labels, **labels},  # a case's severity: a breach's band
        "exp_annotations": {
            "summary": fill(rule["summary"]),
            "description": rule["description"],
        },
    }


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`engineroom rules --fleet F --out FILE`, the real command."""
    out, result = rules_written(tmp_path_factory.mktemp("rules"), FLEET_TEXT)
    assert "rules)" in result.stderr  # how many it wrote
    return out


def test_every_rule_has_a_case_that_fires_it():
    fired = {alert for case in CASES.values() for alert, _, _ in case.fires}
    assert fired == set(RULE_NAMES)


def test_promtool_accepts_the_rules_and_every_family_is_in_them(rules_file):
    result = promtool("check", "rules", str(rules_file))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    # With the diagnoses' rules, which tests/test_rules_diagnoses.py fires.
    diagnoses = {alert_name(c) for c in diagnosis.ALL if c.in_rules}
    assert set(rules_by_name(rules_file.read_text())) == set(RULE_NAMES) | diagnoses


@pytest.mark.parametrize("name", list(CASES))
def test_the_rules_fire_where_the_console_alerts_and_stay_quiet_where_it_does_not(
    name, rules_file, tmp_path
):
    case = CASES[name]
    snap = snapshot(case)
    expected = {alert for alert, _, _ in case.fires}
    assert console_alerts(snap) == expected

    rules = rules_by_name(rules_file.read_text())
    tests = [
        {
            "eval_time": "2m",
            "alertname": alert,
            "exp_alerts": [
                expected_alert(rules[alert], labels, value)
                for fired, labels, value in case.fires
                if fired == alert
            ],
        }
        for alert in RULE_NAMES
    ]
    promtool_case(rules_file, tmp_path, input_series(snap), tests)


def promtool_case(
    rules_file: Path,
    workdir: Path,
    series: list[dict[str, str]],
    tests: list,
    interval: str = "1m",
) -> None:
    """promtool's unit test of the rules: `series` sampled every `interval` (the rules
    evaluated as often), and `tests`, the alerts expected when; it must pass."""
    unit = workdir / "test.yml"
    unit.write_text(
        json.dumps(
            {
                "rule_files": [str(rules_file)],
                "evaluation_interval": interval,
                "tests": [{"interval": interval, "input_series": series, "alert_rule_test": tests}],
            },
            indent=1,
        )
    )
    result = promtool("test", "rules", str(unit))
    assert result.returncode == 0, result.stdout + result.stderr


def test_dcgm_exporter_and_vllm_histograms_fire_the_same_rules_without_an_agent(
    rules_file, tmp_path
):
    """A fleet that has dcgm-exporter and vLLM's own /metrics but no agent: the GPU
    temperature and SLO rules read those series too; under the thresholds, quiet."""
    rules = rules_by_name(rules_file.read_text())
    hot = {"gpu": "0", "UUID": "GPU-0", "Hostname": "a"}
    cool = {"gpu": "1", "UUID": "GPU-1", "Hostname": "a"}

    def labels(d: dict[str, str]) -> str:
        return ",".join(f'{k}="{v}"' for k, v in d.items())

    bucket = "vllm:time_to_first_token_seconds_bucket"
    series = [
        {"series": f"DCGM_FI_DEV_GPU_TEMP{{{labels(hot)}}}", "values": "95x3"},
        {"series": f"DCGM_FI_DEV_GPU_TEMP{{{labels(cool)}}}", "values": "70x3"},
        # "tiny" on its deployment's endpoint: every request between 0.5 and 1 s (p95
        # 0.975 s, over its 500 ms SLO); the same name on a vLLM no deployment of the
        # fleet names (another team's, say): as slow, and none of this fleet's business.
        *(
            {"series": f'{bucket}{{model_name="tiny",instance="{at}",le="{le}"}}', "values": v}
            for at in ("127.0.0.1:8001", "10.0.0.9:8001")
            for le, v in (("0.1", "0x3"), ("0.5", "0x3"), ("1", "0+10x3"), ("+Inf", "0+10x3"))
        ),
    ]
    tests = [
        {
            "eval_time": "2m",
            "alertname": "EngineroomGpuTemperatureCritical",
            "exp_alerts": [expected_alert(rules["EngineroomGpuTemperatureCritical"], hot, 95)],
        },
        {"eval_time": "2m", "alertname": "EngineroomGpuTemperatureWarning", "exp_alerts": []},
        {
            "eval_time": "2m",
            "alertname": "EngineroomSloTtftP95",
            "exp_alerts": [
                expected_alert(
                    rules["EngineroomSloTtftP95"],
                    {
                        "model_name": "tiny",
                        "instance": "127.0.0.1:8001",
                        "measured_at": "engine",
                        "fleet_model": "tiny",
                    },
                    0.975,
                )
            ],
        },
    ]
    promtool_case(rules_file, tmp_path, series, tests)


def test_rules_that_cannot_be_written_say_where_and_leave_no_file(tmp_path):
    (tmp_path / "fleet.toml").write_text(FLEET_TEXT)
    out = tmp_path / "missing-dir" / "rules.yml"
    result = run_cli("rules", "--fleet", str(tmp_path / "fleet.toml"), "--out", str(out))
    assert result.returncode == 1
    assert f"cannot write {out}" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_a_bad_fleet_file_gets_its_line_and_no_rules(tmp_path):
    (tmp_path / "fleet.toml").write_text(
        FLEET_TEXT.replace("kv_cache_warn = 0.95", "kv_cache_warn = 2")
    )
    result = run_cli("rules", "--fleet", str(tmp_path / "fleet.toml"))
    assert result.returncode == 3
    assert "fleet.toml:" in result.stderr and "kv_cache_warn" in result.stderr
    assert result.stdout == ""


# A name the fleet loader refuses (tests/test_config.py), given to the renderer anyway: it
# closes a PromQL string and a matcher, starts a template and a YAML line.
HOSTILE = 'x"} or vector(1) # {{ .Evil }} \\ \n- alert: Fake\r$1 ${HOME}\u2028é.*'


def test_hostile_names_break_no_rule_and_match_exactly_their_own_series(tmp_path):
    model = FLEET.models[0]
    deps = [d.model_copy(update={"id": HOSTILE + d.id}) for d in model.deployments]
    fleet = FLEET.model_copy(
        update={
            "models": [model.model_copy(update={"name": HOSTILE, "deployments": deps})],
            "fleet": FLEET.fleet.model_copy(update={"name": "fleet {{ x }}\n"}),
        }
    )
    text = render_rules(fleet)
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(text)
    result = promtool("check", "rules", str(rules_file))
    assert result.returncode == 0, result.stdout + result.stderr
    assert text.count("\n") == render_rules(FLEET).count("\n")  # no line added
    assert "\u2028" not in text and "\r" not in text
    # The hostile model's deployment fires its model's error-rate rule, with the names as
    # they are; an engine of no deployment fires the fleet's default, and so does one
    # whose model the hostile name would match as a regex.
    lookalike = HOSTILE.replace(".*", "xy")
    deployment = HOSTILE + "tiny-vllm"

    def engine(name: str, model: str) -> dict[str, str]:
        return {"node": "a", "engine": name, "model": model}

    def sample(metric: str, labels: dict[str, str], value: str) -> dict[str, str]:
        shown = ",".join(f"{k}={json.dumps(v)}" for k, v in labels.items())
        return {"series": f"{metric}{{{shown}}}", "values": f"{value}x3"}

    series = [
        sample(
            "engineroom_deployment_state",
            {"node": "a", "engine": "e1", "deployment": deployment, "state": "ready"},
            "1",
        ),
        sample("engineroom_model_error_ratio", engine("e1", HOSTILE), "0.03"),
        sample("engineroom_model_error_ratio", engine("e2", "other"), "0.5"),
        sample("engineroom_model_error_ratio", engine("e3", lookalike), "0.5"),
    ]

    def alert(labels: dict[str, str], severity: str, summary: str) -> dict:
        return {
            "exp_labels": {**labels, "severity": severity, "fleet": "fleet {{ x }}\n"},
            "exp_annotations": {
                "summary": summary,
                "description": alertrules.ERROR_RATE.description,
            },
        }

    mine = {
        **engine("e1", HOSTILE),
        "deployment": deployment,
        "measured_at": "engine",
        "fleet_model": HOSTILE,
    }
    tests = [
        {
            "eval_time": "2m",
            "alertname": "EngineroomErrorRate",
            "exp_alerts": [
                alert(mine, "warning", f"{deployment}: error rate: 0.03 at the engine (over 0.02)"),
                *(
                    alert(engine(e, m), "critical", f"a {e} {m}: error rate: 0.5 (over 0.05)")
                    for e, m in (("e2", "other"), ("e3", lookalike))
                ),
            ],
        }
    ]
    promtool_case(rules_file, tmp_path, series, tests)


def test_rules_written_through_a_symlink_keep_the_link(tmp_path):
    """A rules file that is a link (into a configuration repository) stays one; its target
    gets the rules, with its mode."""
    (tmp_path / "fleet.toml").write_text(FLEET_TEXT)
    (tmp_path / "repo").mkdir()
    target = tmp_path / "repo" / "engineroom.rules.yml"
    target.write_text("groups: []\n")
    target.chmod(0o640)
    link = tmp_path / "rules.yml"
    link.symlink_to(target)
    result = run_cli("rules", "--fleet", str(tmp_path / "fleet.toml"), "--out", str(link))
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and link.resolve() == target
    assert "- alert: EngineroomErrorRate" in target.read_text()
    assert target.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.toml", "repo", "rules.yml"]


def test_a_rule_fires_only_after_its_for_and_keeps_firing_its_keep_firing_for(rules_file, tmp_path):
    """The console's holds are the rules' (console/core/alertrules.py): a TTFT over its SLO
    for 20 s raises nothing, for 30 s it does; gone, it still fires a minute on."""
    over = snapshot(Case(engines=[vllm(latency=latency(0.6, 0.01)), standby(), triton()]))
    under = snapshot(Case(engines=[vllm(latency=latency(0.3, 0.01)), standby(), triton()]))
    hold, clear = alertrules.SLO_TTFT.raise_after_s, alertrules.SLO_TTFT.clear_after_s
    assert (hold, clear) == (30, 60)
    rules = rules_by_name(rules_file.read_text())
    firing = [expected_alert(rules["EngineroomSloTtftP95"], {**VLLM_SLO, "stat": "p95"}, 0.6)]
    # Every 10 s: over from 0 to 60 s, under from 70 s on.
    low = {s["series"]: s["values"].removesuffix("x3") for s in input_series(under)}
    series = [
        {"series": s["series"], "values": f"{high}x6 {low.get(s['series'], high)}x12"}
        for s in input_series(over)
        if (high := s["values"].removesuffix("x3"))
    ]
    tests = [
        {"eval_time": f"{t}s", "alertname": "EngineroomSloTtftP95", "exp_alerts": alerts}
        for t, alerts in ((20, []), (30, firing), (110, firing), (130, []))
    ]
    promtool_case(rules_file, tmp_path, series, tests, interval="10s")


TWO_TRITONS = fleet_toml(
    fleet={"name": "tritons"},
    nodes=[NODE_A, {"name": "b", "agent": "http://127.0.0.1:2"}],
    models=[
        fleet_model(name, deployment(f"{name}-trt", node, "triton", port,
                                     engine_model="ensemble"), slo={"ttft_p95_ms": ttft})
        for name, node, port, ttft in [("small", "a", 8000, 500), ("big", "b", 9000, 5000)]
    ],
)  # fmt: skip


def test_a_triton_ensemble_fires_the_rule_of_its_own_deployment_only(tmp_path):
    """Two models served by Triton as `ensemble`, on two nodes: the big one's TTFT of 1 s
    is within its 5 s SLO and must not fire the small one's 500 ms rule, which matched
    every series named `ensemble`; the small one's 600 ms fires its own, named by its
    deployment. The console says the same."""
    fleet = parse_fleet(TWO_TRITONS)
    (tmp_path / "fleet.toml").write_text(TWO_TRITONS)
    rules_file = tmp_path / "rules.yml"
    result = run_cli("rules", "--fleet", str(tmp_path / "fleet.toml"), "--out", str(rules_file))
    assert result.returncode == 0, result.stderr

    def node(name: str, deployment: str, ttft: float) -> Snapshot:
        engine = Engine(
            id="triton-8000",
            kind="triton",
            endpoint="http://127.0.0.1:8000",
            state="ready",
            deployment_ids=[deployment],
            models=[ModelStats(name="ensemble", latency=latency(ttft))],
        )
        return Snapshot(
            node=NodeInfo(name=name, agent_version="0", time=0.0),
            host=Host(),
            gpu_status="ok",
            engines=[engine],
        )

    snaps = {"a": node("a", "small-trt", 0.6), "b": node("b", "big-trt", 1.0)}
    now = time.monotonic()
    states = {
        n: NodeState(n, "agent", snapshot=decode_snapshot(s.model_dump_json()), last_ok=now)
        for n, s in snaps.items()
    }
    view = build(fleet, states, 1.0, now=now)
    assert [(a.subject, a.title) for a in view.alerts] == [("small-trt", "SLO TTFT p95")]
    rules = rules_by_name(rules_file.read_text())
    labels = {
        "node": "a",
        "engine": "triton-8000",
        "kind": "triton",
        "model": "ensemble",
        "stat": "p95",
        "deployment": "small-trt",
        "measured_at": "engine",
        "fleet_model": "small",
    }
    tests = [
        {
            "eval_time": "2m",
            "alertname": "EngineroomSloTtftP95",
            "exp_alerts": [expected_alert(rules["EngineroomSloTtftP95"], labels, 0.6)],
        }
    ]
    series = [s for snap in snaps.values() for s in input_series(snap)]
    promtool_case(rules_file, tmp_path, series, tests)


def gateway_series(deployment: str, slow: bool) -> list[dict[str, str]]:
    """The gateway's TTFT histogram for a deployment of `tiny` (console/gateway/http/admin.py):
    10 requests a minute, all between 0.5 and 1 s when `slow`, else under 0.5 s."""
    labels = f'model="tiny",deployment="{deployment}",engine="vllm"'
    return [
        {
            "series": f'engineroom_gateway_ttft_seconds_bucket{{{labels},le="{le}"}}',
            "values": "0x3" if slow and le == "0.5" else "0+10x3",
        }
        for le in ("0.5", "1", "+Inf")
    ]


@pytest.mark.parametrize(
    ("engine_ttft", "gateway_slow", "fires"),
    [(0.3, True, "gateway"), (0.6, False, None)],
    ids=["clients wait 640 ms, the engine 300 ms", "the engine 600 ms, clients under 500"],
)
def test_where_the_gateway_measured_a_deployment_its_p95_decides(
    rules_file, tmp_path, engine_ttft, gateway_slow, fires
):
    """`check` judged a deployment ok at 640 ms through the gateway against a 500 ms SLO,
    from the engine's figure. What clients feel decides, in the console and in the rules;
    the engine's p95 only where the gateway has none."""
    snap = snapshot(Case(engines=[vllm(latency=latency(engine_ttft, 0.01)), standby(), triton()]))
    measure = {"up": True, "weight": 100, "requests": 40, "error_rate": 0.0}
    measure["ttft_s"] = {"p95": 0.64 if gateway_slow else 0.3, "count": 40}
    gateway = {"models": {"tiny": {"tiny-vllm": measure}}}
    now = time.monotonic()
    console_snap = decode_snapshot(snap.model_dump_json())
    states = {"a": NodeState("a", "agent", snapshot=console_snap, last_ok=now)}
    view = build(FLEET, states, 1.0, now=now, gateway=parse(gateway))
    slo = [a.message for a in view.alerts if a.title == "SLO TTFT p95"]
    row = next(r for r in view.models["tiny"] if r.id == "tiny-vllm")
    judged = row.verdict.of("ttft")
    assert judged.measured_at == "gateway" and judged.value == measure["ttft_s"]["p95"]
    if fires:
        assert slo == ["SLO TTFT p95: 640 ms at the gateway, 1.28x the 500 ms SLO"]
        assert row.slo_ok is False and row.verdict.level == "warning"
    else:
        assert slo == [] and row.verdict.of("ttft").level == "ok"

    rules = rules_by_name(rules_file.read_text())
    labels = {"model": "tiny", "deployment": "tiny-vllm", "measured_at": "gateway"}
    expected = [
        expected_alert(rules["EngineroomSloTtftP95"], {**labels, "fleet_model": "tiny"}, 0.975)
    ]
    tests = [
        {
            "eval_time": "2m",
            "alertname": "EngineroomSloTtftP95",
            "exp_alerts": expected if fires else [],
        }
    ]
    series = [*input_series(snap), *gateway_series("tiny-vllm", gateway_slow)]
    promtool_case(rules_file, tmp_path, series, tests)
