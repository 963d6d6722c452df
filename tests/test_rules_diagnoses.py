"""`engineroom rules` writes the diagnoses PromQL can tell as alerting rules, with the
names, thresholds and holds of console/core/diagnosis.py (issue 30).

Each case is one node's snapshot, and where the gateway measured a deployment, its counts.
The headless finder (console.collect.diagnose.diagnoser, as `diagnose` and `check` run it) reads
them; the same figures, as the agent's and the gateway's /metrics, are the input of
`promtool test rules` over the file `engineroom rules` wrote. Both must name the case's
diagnoses and nothing else, at and just under each threshold, and neither fires on a
figure it does not have (a Triton counts no tokens, an engine that does not say why
requests wait). Further down: a threshold set in fleet.toml, for the fleet or for one
model, moves the rule's; the error burst holds its 30 s; every class PromQL cannot tell
is named in the file with why; a hostile model name breaks no rule.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from console.agent.api.exposition import render as render_metrics
from console.collect.diagnose.diagnoser import diagnose_once
from console.collect.promrules.alerts import render as render_rules
from console.collect.sources.collector import NodeState
from console.collect.views.gateway_view import parse
from console.collect.views.view import build
from console.core import diagnosis as d
from console.core.config.load import Fleet, parse_fleet
from console.core.snapshot import decode_snapshot
from console.core.wire import Engine, Gpu, ModelStats, TrtEngine, XidEvent
from tests.prometheus_proc import promtool
from tests.support.fleet import fleet_toml
from tests.support.rules import NODE_A, TINY_DEPLOYMENTS, rules_written, snapshot
from tests.test_rules import HOSTILE, go_number, standby, triton, vllm

FLEET_TEXT = fleet_toml(
    fleet={"name": "diagnoses"},
    agent={"window_s": 60},
    gateway={"url": "http://127.0.0.1:9400", "window_s": 60},
    diagnoses={"wedged_after_s": 10},
    nodes=[NODE_A],
    models=[
        {
            "name": "tiny",
            "diagnoses": {"kv_pressure_usage": 0.8, "error_burst_rate": 0.2},
            "deployments": TINY_DEPLOYMENTS,
        }
    ],
)
FLEET = parse_fleet(FLEET_TEXT)
# The rule of each class PromQL can tell, named after the class (alertrules' spelling).
RULES = {
    "engine_wedged": "EngineroomDiagnosisEngineWedged",
    "triton_stall": "EngineroomDiagnosisTritonStall",
    "kv_pressure": "EngineroomDiagnosisKvPressure",
    "error_burst": "EngineroomDiagnosisErrorBurst",
    "gpu_fault": "EngineroomDiagnosisGpuFault",
    "stale_trt_engine": "EngineroomDiagnosisStaleTrtEngine",
}


@dataclass
class Case:
    """A node's state and the gateway's counts (deployment of `tiny` -> requests and
    failures each 15 s); the diagnoses it must raise: (class, the alert's labels, its
    value, its summary); the classes the finder cannot tell (no rule fires for them)."""

    engines: list[Engine] = field(default_factory=lambda: [vllm(), standby(), triton()])
    gpus: list[Gpu] = field(default_factory=lambda: [Gpu(index=0, temperature_c=60)])
    trt: list[TrtEngine] = field(default_factory=list)
    gateway: dict[str, tuple[int, int]] = field(default_factory=dict)
    fires: list[tuple[str, dict[str, str], float, str]] = field(default_factory=list)
    cannot_tell: set[str] = field(default_factory=set)


VLLM = {"node": "a", "engine": "vllm-8001", "kind": "vllm", "model": "tiny"}
TINY = {"deployment": "tiny-vllm", "fleet_model": "tiny"}


def wedged(value: float, after: float = 10) -> tuple[str, dict[str, str], float, str]:
    summary = (
        f"a/vllm-8001: engine wedged: tiny generated no token for {go_number(value)} s "
        f"with requests in (wedged_after_s {after:g})"
    )
    return ("engine_wedged", VLLM, value, summary)


def stall(value: float) -> tuple[str, dict[str, str], float, str]:
    summary = (
        f"a/triton-8000: Triton stall: ens.v1 finished no request for {go_number(value)} s "
        "with requests queued (triton_stall_after_s 20)"
    )
    labels = {"node": "a", "engine": "triton-8000", "kind": "triton", "model": "ens.v1"}
    return ("triton_stall", labels, value, summary)


def kv(value: float, at: float = 0.8) -> tuple[str, dict[str, str], float, str]:
    """KV-cache pressure on tiny's vLLM; at the model's own 0.8 the rule is the model's."""
    summary = (
        f"a/vllm-8001: KV-cache pressure: tiny uses {go_number(value)} of its KV cache with "
        f"requests preempted or waiting for capacity (kv_pressure_usage {at:g})"
    )
    labels = {**VLLM, "fleet_model": "tiny"} if at == 0.8 else VLLM
    return ("kv_pressure", labels, value, summary)


def storm(value: float) -> tuple[str, dict[str, str], float, str]:
    """A preemption storm on tiny's vLLM, at the fleet's kv_preemption_storm_rate."""
    summary = (
        f"a/vllm-8001: KV-cache pressure: tiny preempts {go_number(value)} requests a "
        "second (kv_preemption_storm_rate 0.5)"
    )
    return ("kv_pressure", {**VLLM, "signal": "preemption_storm"}, value, summary)


def burst(value: float, where: str) -> tuple[str, dict[str, str], float, str]:
    labels = {**TINY, "measured_at": where, "fleet_model": "tiny"}
    labels |= VLLM if where == "engine" else {"model": "tiny"}
    summary = (
        f"tiny-vllm: error burst: {go_number(value)} of requests failed at the {where} "
        "(error_burst_rate 0.2)"
    )
    return ("error_burst", labels, value, summary)


def fault(what: str, value: float) -> tuple[str, dict[str, str], float, str]:
    labels = {"node": "a", "gpu": "0", "fault": what}
    return ("gpu_fault", labels, value, f"a/gpu0: GPU fault: {what} ({go_number(value)})")


def engine(eid: str, model: str, state: str = "ready", deployments=(), **stats) -> Engine:
    return Engine(
        id=eid,
        kind="vllm",
        endpoint="http://127.0.0.1:9000",
        state=state,  # type: ignore[arg-type]
        deployment_ids=list(deployments),
        models=[ModelStats(name=model, **stats)],
    )


CASES = {
    "requests in, tokens flowing, KV under, no errors: quiet": Case(
        engines=[
            vllm(
                requests_running=3,
                requests_waiting=0,
                generation_stalled_s=0.0,
                kv_cache_usage=0.5,
                preemption_rate=0.0,
                error_rate=0.0,
            ),
            standby(),
            triton(error_rate=0.0),
        ]
    ),
    "requests in and no token for 12 s: wedged": Case(
        engines=[
            vllm(requests_running=1, requests_waiting=2, generation_stalled_s=12.0),
            standby(),
            triton(),
        ],
        fires=[wedged(12)],
    ),
    "one request waiting and no token for exactly wedged_after_s: wedged": Case(
        engines=[
            vllm(requests_running=0, requests_waiting=1, generation_stalled_s=10.0),
            standby(),
            triton(),
        ],
        fires=[wedged(10)],
    ),
    "no token for 9.9 s: not yet": Case(
        engines=[vllm(requests_running=1, generation_stalled_s=9.9), standby(), triton()],
    ),
    "stalled but no request in: idle, not wedged": Case(
        engines=[
            vllm(requests_running=0, requests_waiting=0, generation_stalled_s=60.0),
            standby(),
            triton(),
        ],
    ),
    "stalled, requests unknown: quiet": Case(
        engines=[vllm(generation_stalled_s=60.0), standby(), triton()],
    ),
    "stalled while loading: expected work, quiet": Case(
        engines=[
            vllm("loading", requests_running=1, generation_stalled_s=60.0),
            standby(),
            triton(),
        ],
    ),
    "a Triton with requests queued and no finished-request count: cannot tell": Case(
        engines=[vllm(), standby(), triton(requests_running=2, requests_waiting=4)],
        cannot_tell={"triton_stall"},
    ),
    "a Triton with requests queued and none finished for 25 s: Triton stall": Case(
        engines=[vllm(), standby(), triton(requests_waiting=4, completion_stalled_s=25.0)],
        fires=[stall(25)],
    ),
    "a Triton with requests queued, none finished for 19.9 s: not yet": Case(
        engines=[vllm(), standby(), triton(requests_waiting=4, completion_stalled_s=19.9)],
    ),
    "a Triton stalled with nothing queued: quiet": Case(
        engines=[
            vllm(),
            standby(),
            triton(requests_running=1, requests_waiting=0, completion_stalled_s=60.0),
        ],
    ),
    "a vLLM with requests waiting and none finished: the wedge decides, not the stall": Case(
        engines=[
            vllm(requests_waiting=3, completion_stalled_s=60.0, generation_stalled_s=0.0),
            standby(),
            triton(),
        ],
    ),
    "KV at the model's 0.8 with preemptions: pressure": Case(
        engines=[vllm(kv_cache_usage=0.8, preemption_rate=0.3), standby(), triton()],
        fires=[kv(0.8)],
    ),
    "KV under the model's 0.8 with preemptions under a storm's rate: quiet": Case(
        engines=[vllm(kv_cache_usage=0.75, preemption_rate=0.49), standby(), triton()],
    ),
    "a preemption storm with the KV gauge read at 0: pressure": Case(
        engines=[vllm(kv_cache_usage=0.0, preemption_rate=0.5), standby(), triton()],
        fires=[storm(0.5)],
    ),
    "KV full without preemptions, nothing waiting for capacity: quiet": Case(
        engines=[
            vllm(
                kv_cache_usage=0.99,
                preemption_rate=0.0,
                requests_waiting_by_reason={"capacity": 0, "deferred": 2},
            ),
            standby(),
            triton(),
        ],
    ),
    "KV full, requests waiting for capacity, preemptions unknown: pressure": Case(
        engines=[
            vllm(kv_cache_usage=0.95, requests_waiting_by_reason={"capacity": 3}),
            standby(),
            triton(),
        ],
        fires=[kv(0.95)],
    ),
    "KV full, neither preemptions nor reasons exported: cannot tell, no rule fires": Case(
        engines=[vllm(kv_cache_usage=0.99), standby(), triton()],
        cannot_tell={"kv_pressure"},
    ),
    "the engine's error ratio at the model's error_burst_rate: burst": Case(
        engines=[vllm(error_rate=0.2), standby(), triton()],
        fires=[burst(0.2, "engine")],
    ),
    "the engine's error ratio just under it: quiet": Case(
        engines=[vllm(error_rate=0.19), standby(), triton()],
    ),
    "the gateway counted a quarter failed, the engine none: the gateway decides": Case(
        engines=[vllm(error_rate=0.0), standby(), triton()],
        gateway={"tiny-vllm": (40, 10)},
        fires=[burst(0.25, "gateway")],
    ),
    "the gateway counted none failed, the engine half: quiet": Case(
        engines=[vllm(error_rate=0.5), standby(), triton()],
        gateway={"tiny-vllm": (40, 0)},
    ),
    "the gateway passed no request: the engine's ratio decides": Case(
        engines=[vllm(error_rate=0.25), standby(), triton()],
        gateway={"tiny-vllm": (0, 0)},
        fires=[burst(0.25, "engine")],
    ),
    "a standby (weight 0) that fails every request: no burst": Case(
        engines=[
            vllm(),
            engine("vllm-8002", "tiny", deployments=["tiny-standby"], error_rate=1.0),
            triton(),
        ],
    ),
    "an engine of no deployment over the fleet's default 0.05: burst": Case(
        engines=[vllm(), standby(), triton(), engine("vllm-9000", "mystery", error_rate=0.0625)],
        fires=[
            (
                "error_burst",
                {"node": "a", "engine": "vllm-9000", "kind": "vllm", "model": "mystery"},
                0.0625,
                "a/vllm-9000: error burst: mystery: 0.0625 of requests failed "
                "(error_burst_rate 0.05)",
            )
        ],
    ),
    "an XID: GPU fault": Case(
        gpus=[Gpu(index=0, xid_events=[XidEvent(time=1.0, xid=79)])],
        fires=[fault("XID", 79)],
    ),
    "uncorrected ECC and a pending row remapping: one GPU fault, ECC named": Case(
        gpus=[Gpu(index=0, ecc_uncorrected=2, remapped_rows={"failure": False, "pending": True})],
        fires=[fault("uncorrected ECC", 2)],
    ),
    "a row remapping pending: GPU fault": Case(
        gpus=[Gpu(index=0, ecc_uncorrected=0, remapped_rows={"failure": False, "pending": True})],
        fires=[fault("row remapping pending", 1)],
    ),
    "no XID, no ECC error, no remapping; a current TensorRT-LLM engine: quiet": Case(
        gpus=[Gpu(index=0, ecc_uncorrected=0, remapped_rows={"failure": False, "pending": False})],
        trt=[TrtEngine(deployment="tiny-trt", model="tiny", state="current")],
    ),
    "a stale TensorRT-LLM engine": Case(
        trt=[TrtEngine(deployment="tiny-trt", model="tiny", state="stale", reasons=["driver"])],
        fires=[
            (
                "stale_trt_engine",
                {"node": "a", "deployment": "tiny-trt", "model": "tiny"},
                1,
                "a/tiny-trt: stale TensorRT-LLM engine: it no longer matches its node",
            )
        ],
    ),
}


def admin_snapshot(case: Case) -> dict:
    """The gateway's admin snapshot as the finder reads it (console/gateway/routing/measure.py)."""
    measures = {
        dep: {"up": True, "requests": r, "failures": f, "error_rate": f / r if r else None}
        for dep, (r, f) in case.gateway.items()
    }
    return {"models": {"tiny": measures}} if measures else {}


def finder(fleet: Fleet, case: Case) -> tuple[set[str], set[str]]:
    """The headless finder's diagnoses and cannot-tells on this case, by class."""
    now = time.monotonic()
    snap = decode_snapshot(snapshot(case).model_dump_json())
    states = {"a": NodeState("a", "agent", snapshot=snap, last_ok=now)}
    gateway = parse(admin_snapshot(case))
    view = build(fleet, states, 1.0, now=now, gateway=gateway)
    found, blind = diagnose_once(fleet, view, states, gateway)
    return {x.kind.name for x in found}, {b.name for b in blind}


def input_series(case: Case) -> list[dict[str, str]]:
    """The agent's /metrics for the case, and the gateway's counters of `tiny`'s
    deployments, every 15 s for 5 minutes."""
    out = []
    for line in render_metrics(snapshot(case)).splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            out.append({"series": series, "values": f"{value}x20"})
    for dep, (requests, failures) in case.gateway.items():
        labels = f'model="tiny",deployment="{dep}",engine="vllm"'
        for name, step in (("requests", requests), ("failures", failures)):
            out.append(
                {"series": f"engineroom_gateway_{name}_total{{{labels}}}", "values": f"0+{step}x20"}
            )
    return out


def expected(
    name: str, labels: dict[str, str], summary: str, fleet: str = "diagnoses"
) -> dict[str, dict[str, str]]:
    """The alert as promtool reports it: the series' labels and the rule's, with the
    class's wording and first move from its one definition."""
    defn = d.BY_NAME[name]
    rule_labels = {"severity": defn.severity, "fleet": fleet, "diagnosis": name}
    return {
        "exp_labels": {**rule_labels, **labels},
        "exp_annotations": {
            "summary": summary,
            "description": defn.summary,
            "rules_out": defn.rules_out,
            "first_move": d.MOVE_TEXT[defn.moves[0]],
        },
    }


def promtool_test(
    rules_file: Path, workdir: Path, series: list[dict[str, str]], tests: list, step: str = "15s"
) -> None:
    unit = workdir / "test.yml"
    unit.write_text(
        json.dumps(
            {
                "rule_files": [str(rules_file)],
                "evaluation_interval": step,
                "tests": [{"interval": step, "input_series": series, "alert_rule_test": tests}],
            },
            indent=1,
        )
    )
    result = promtool("test", "rules", str(unit))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`engineroom rules --fleet F --out FILE`, the real command."""
    out, _ = rules_written(tmp_path_factory.mktemp("rules"), FLEET_TEXT)
    return out


def alerts_in(text: str) -> set[str]:
    return set(re.findall(r"^\s+- alert: (\w+)$", text, re.M))


def test_every_rule_of_a_diagnosis_has_a_case_that_fires_it():
    assert {name for case in CASES.values() for name, *_ in case.fires} == set(RULES)


def test_promtool_accepts_the_rules_and_each_class_is_a_rule_or_named_with_why(rules_file):
    result = promtool("check", "rules", str(rules_file))
    assert result.returncode == 0, result.stdout + result.stderr
    text = rules_file.read_text()
    assert {a for a in alerts_in(text) if a.startswith("EngineroomDiagnosis")} == set(
        RULES.values()
    )
    header = [line for line in text.splitlines() if line.startswith("#")]
    for defn in d.ALL:
        assert defn.in_rules == (defn.name in RULES), defn.name
        if not defn.in_rules:
            assert defn.note, f"{defn.name}: no rule and no reason"
            assert any(defn.name in line and defn.note in line for line in header), defn.name


@pytest.mark.parametrize("name", list(CASES))
def test_the_rules_fire_where_the_finder_diagnoses_and_stay_quiet_where_it_does_not(
    name, rules_file, tmp_path
):
    case = CASES[name]
    found, blind = finder(FLEET, case)
    assert found == {fired for fired, *_ in case.fires}
    assert blind == case.cannot_tell
    tests = [
        {
            "eval_time": "2m",
            "alertname": alert,
            "exp_alerts": [
                expected(fired, labels, summary)
                for fired, labels, _value, summary in case.fires
                if fired == diagnosis
            ],
        }
        for diagnosis, alert in RULES.items()
    ]
    promtool_test(rules_file, tmp_path, input_series(case), tests)


def rule_blocks(text: str) -> list[tuple[str, str]]:
    """(alert, its lines) for each rule in the file."""
    parts = re.split(r"^\s+- alert: (\w+)$", text, flags=re.M)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def test_an_error_burst_fires_only_after_its_hold(rules_file, tmp_path):
    """The class's hold_s is the rule's `for:`: an error burst that lasted 15 s raises
    nothing, 30 s does (the finder waits the same while it watches); a class with no hold
    fires at once."""
    assert d.ERROR_BURST.hold_s == 30
    case = Case(engines=[vllm(error_rate=0.5), standby(), triton()])
    name, labels, _, summary = burst(0.5, "engine")
    alert = RULES["error_burst"]
    tests = [
        {"eval_time": t, "alertname": alert, "exp_alerts": alerts}
        for t, alerts in (("15s", []), ("30s", [expected(name, labels, summary)]))
    ]
    promtool_test(rules_file, tmp_path, input_series(case), tests)
    by_alert = {alert: name for name, alert in RULES.items()}
    for alert, lines in rule_blocks(rules_file.read_text()):
        if alert in by_alert:
            hold = d.BY_NAME[by_alert[alert]].hold_s
            assert re.findall(r"^\s+for: (\S+)$", lines, re.M) == ([f"{hold:g}s"] if hold else [])
            assert "keep_firing_for" not in lines  # a diagnosis clears as its condition goes


# Edits to FLEET_TEXT: (old, new) pairs.
NO_FLEET_WEDGED = [("[diagnoses]\nwedged_after_s = 10\n", "")]
NO_MODEL_KV = [("kv_pressure_usage = 0.8\n", "")]
FLEET_KV = [*NO_MODEL_KV, ("wedged_after_s = 10\n", "kv_pressure_usage = 0.85\n")]
MODEL_ERRORS = [("error_burst_rate = 0.2\n", "error_burst_rate = 0.3\n")]


@pytest.mark.parametrize(
    ("edit", "stats", "fires"),
    [
        (NO_FLEET_WEDGED, {"generation_stalled_s": 8.0}, wedged(8, after=6)),
        ([], {"generation_stalled_s": 8.0}, None),
        ([], {"kv_cache_usage": 0.85, "preemption_rate": 0.3}, kv(0.85)),
        (NO_MODEL_KV, {"kv_cache_usage": 0.85, "preemption_rate": 0.3}, None),
        (FLEET_KV, {"kv_cache_usage": 0.85, "preemption_rate": 0.3}, kv(0.85, at=0.85)),
        (MODEL_ERRORS, {"error_rate": 0.25}, None),
        ([], {"error_rate": 0.25}, burst(0.25, "engine")),
    ],
    ids=[
        "no [diagnoses]: the default wedged_after_s, 6 s; 8 s is wedged",
        "the fleet's wedged_after_s 10 s: 8 s is not",
        "the model's kv_pressure_usage 0.8: 0.85 is pressure",
        "none set: the default 0.9; 0.85 is not",
        "the fleet's 0.85, the model's none: 0.85 is",
        "the model's error_burst_rate 0.3: 0.25 is no burst",
        "the model's 0.2: 0.25 is",
    ],
)
def test_a_threshold_in_fleet_toml_moves_the_rule_and_the_finder_alike(
    edit, stats, fires, tmp_path
):
    text = FLEET_TEXT
    for old, new in edit:
        assert old in text
        text = text.replace(old, new)
    fleet = parse_fleet(text)
    case = Case(engines=[vllm(requests_running=1.0, **stats), standby(), triton()])
    found, _ = finder(fleet, case)
    assert found == ({fires[0]} if fires else set())
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(render_rules(fleet))
    tests = [
        {
            "eval_time": "2m",
            "alertname": alert,
            "exp_alerts": [expected(name, fires[1], fires[3])]
            if fires and fires[0] == name
            else [],
        }
        for name, alert in RULES.items()
    ]
    promtool_test(rules_file, tmp_path, input_series(case), tests)


def test_a_hostile_model_name_with_its_own_threshold_breaks_no_rule_and_matches_its_own(
    tmp_path,
):
    """A model name the fleet loader refuses (tests/test_rules.py's), given the renderer
    anyway with its own kv_pressure_usage: the file still loads, and its 0.8 applies to
    its own engine only; an engine whose model the name would match as a regex gets the
    default 0.9 (quiet at 0.85)."""
    model = FLEET.models[0]
    deps = [dep.model_copy(update={"id": HOSTILE + dep.id}) for dep in model.deployments]
    hostile = model.model_copy(update={"name": HOSTILE, "deployments": deps})
    fleet = FLEET.model_copy(update={"models": [hostile]})
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(render_rules(fleet))
    checked = promtool("check", "rules", str(rules_file))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    lookalike = HOSTILE.replace(".*", "xy")

    def sample(metric: str, labels: dict[str, str], value: str) -> dict[str, str]:
        shown = ",".join(f"{k}={json.dumps(v)}" for k, v in labels.items())
        return {"series": f"{metric}{{{shown}}}", "values": f"{value}x20"}

    series = []
    for eid, name in (("e1", HOSTILE), ("e2", lookalike)):
        at = {"node": "a", "engine": eid, "kind": "vllm"}
        series += [
            sample("engineroom_engine_state", {**at, "state": "ready"}, "1"),
            sample("engineroom_model_kv_cache_usage_ratio", {**at, "model": name}, "0.85"),
            sample("engineroom_model_preemption_rate", {**at, "model": name}, "0.3"),
        ]
    labels = {"node": "a", "engine": "e1", "kind": "vllm", "model": HOSTILE}
    summary = (
        f"a/e1: KV-cache pressure: {HOSTILE} uses 0.85 of its KV cache with requests "
        "preempted or waiting for capacity (kv_pressure_usage 0.8)"
    )
    tests = [
        {
            "eval_time": "2m",
            "alertname": RULES["kv_pressure"],
            "exp_alerts": [expected("kv_pressure", {**labels, "fleet_model": HOSTILE}, summary)],
        }
    ]
    promtool_test(rules_file, tmp_path, series, tests)


def test_a_triton_deployment_reporting_its_engine_model_gets_its_models_threshold(tmp_path):
    """tiny-trt's engine reports "ens.v1" (its engine_model), not "tiny": the finder maps
    it back to tiny and the rule matches the name, so tiny's own kv_pressure_usage (0.8)
    raises 0.85 in both; the fleet's default (0.9) would raise it in neither."""
    case = Case(engines=[triton(kv_cache_usage=0.85, preemption_rate=0.3)])
    assert finder(FLEET, case)[0] == {"kv_pressure"}
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(render_rules(FLEET))
    labels = {"node": "a", "engine": "triton-8000", "kind": "triton", "model": "ens.v1",
              "fleet_model": "tiny"}  # fmt: skip
    summary = (
        "a/triton-8000: KV-cache pressure: ens.v1 uses 0.85 of its KV cache with requests "
        "preempted or waiting for capacity (kv_pressure_usage 0.8)"
    )
    tests = [
        {
            "eval_time": "2m",
            "alertname": RULES["kv_pressure"],
            "exp_alerts": [expected("kv_pressure", labels, summary)],
        }
    ]
    promtool_test(rules_file, tmp_path, input_series(case), tests)
