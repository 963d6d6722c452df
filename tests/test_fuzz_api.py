"""The agent's and the gateway's APIs under a fuzzer: no input gets a 500, hangs, or leaves
a job, a process or an in-flight request behind.

schemathesis generates requests from each API's OpenAPI schema (the agent's own
/openapi.json; the gateway's tests/fixtures/gateway-openapi.yaml), both fitting the schema
and breaking it, and sends them to a real agent and a real gateway on loopback with every
role's token. The agent's launch profile runs this test's python, which has no vLLM: an
operator-token start gets as far as spawning the engine, which exits at once. The
gateway's engines are the ENGINE DOUBLES of tests/engine_double.py (a real vLLM cannot
answer thousands of requests in a minute here; tests/test_gateway.py runs the real ones).

A failure prints hypothesis's falsifying case and schemathesis's `curl` reproducer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.config import SanitizationConfig
from schemathesis.specs.openapi.checks import response_schema_conformance

from console.agent.engines import engine_id as make_engine_id
from tests.conftest import OPERATOR, ROOT, VIEWER, Agent
from tests.engines.servers import free_ports, log_tail, stop, wait_until
from tests.test_gateway import ADMIN, Gateway, start_gateway

OPERATOR_TOKEN = OPERATOR.split(":", 1)[1]
CLIENT_KEY = "client-key-0123456789"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))  # per operation and mode
REQUEST_TIMEOUT_S = 10.0  # a fuzzed request that takes longer has hung
FINAL = ("succeeded", "failed", "cancelled")

AGENT_FLEET = """
[fleet]
name = "fuzz"
[agent]
state_dir = "{state}"
scrape_interval_s = 0.5
[[nodes]]
name = "local"
agent = "http://127.0.0.1:{agent_port}"
[[nodes]]
name = "elsewhere"
agent = "http://127.0.0.1:9"

[profiles.tiny]
engine = "vllm"
node = "local"
model = "{model}"
served_model_name = "tiny"
port = {port}
command = ["{python}", "-m", "vllm.entrypoints.openai.api_server"]
args = {{ host = "127.0.0.1", max_model_len = 256 }}
overridable = ["port"]
allowed_args = ["max_num_seqs"]
stop_grace_s = 2

[profiles.far]
engine = "vllm"
node = "elsewhere"
model = "{model}"
served_model_name = "far"
port = {port}

[[models]]
name = "tiny"
  [[models.deployments]]
  id = "tiny-trt"
  node = "local"
  engine = "trtllm"
  endpoint = "http://127.0.0.1:9"
"""

GATEWAY_FLEET = """\
[fleet]
name = "fuzz"

[gateway]
url = "http://127.0.0.1:{port}"
state_dir = "{state}"
health_interval_s = 0.5
api_keys_env = "FUZZ_API_KEYS"
max_body_bytes = 65536

[[nodes]]
name = "local"
agent = "http://127.0.0.1:9"

[[models]]
name = "tiny"
auto_failover = true
failover = {{ steps = [50, 100], verify_s = 0.2, warmup_requests = 1, drain_timeout_s = 5 }}

  [[models.deployments]]
  id = "tiny-trt"
  node = "local"
  engine = "triton"
  endpoint = "http://127.0.0.1:{triton}"
  engine_model = "ensemble"
  weight = 50

  [[models.deployments]]
  id = "tiny-vllm"
  node = "local"
  engine = "vllm"
  endpoint = "http://127.0.0.1:{vllm}"
  weight = 50
"""


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def no_server_error(ctx: Any, response: Any, case: Any) -> None:
    """A 5xx other than 503 (the honest "not now": no deployment can answer, no snapshot
    yet) is a defect, whatever the input."""
    if response.status_code >= 500 and response.status_code != 503:
        raise AssertionError(f"answered {response.status_code}: {response.text[:300]}")


def load(doc: dict[str, Any]) -> Any:
    """A schemathesis schema whose reproducers show every body field (the default hides
    any field named like a token, max_tokens too) but still hide the Authorization header."""
    schema = schemathesis.openapi.from_dict(doc)
    hidden = ("authorization",)
    schema.config.output.sanitization = SanitizationConfig(
        keys_to_sanitize=hidden, sensitive_markers=hidden
    )
    return schema


def fuzz(
    schema: Any,
    base_url: str,
    headers: dict[str, str],
    checks: list[Any],
    seeds: dict[str, list[Any]] | None = None,
    modes: tuple[GenerationMode, ...] = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE),
) -> Counter[tuple[str, int]]:
    """Every operation of `schema`, EXAMPLES cases per mode, each answer held to
    no_server_error and `checks`; returns how often each operation answered each status.
    `seeds` ("METHOD /path": [body, ...]) are sent first, as they are: the requests that
    must get past the refusals, so that a fleet set up wrong cannot make the fuzz vacuous."""
    answered: Counter[tuple[str, int]] = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in modes:
            strategy = operation.as_strategy(generation_mode=mode, headers=headers)

            @settings(
                max_examples=EXAMPLES,
                deadline=None,  # the timeout below is the deadline, per request
                database=None,
                # The same cases every run, so CI finds what a developer can rerun;
                # FUZZ_RANDOM=1 explores new ones.
                derandomize=not os.environ.get("FUZZ_RANDOM"),
                phases=[Phase.explicit, Phase.generate, Phase.shrink],
                suppress_health_check=list(HealthCheck),
                print_blob=True,
            )
            @given(case=strategy)
            def one(case: Any) -> None:
                response = case.call(base_url=base_url, timeout=REQUEST_TIMEOUT_S)
                answered[(case.operation.label, response.status_code)] += 1
                case.validate_response(response, checks=[no_server_error, *checks])

            if mode.is_positive:
                for body in (seeds or {}).get(operation.label, []):
                    seed = operation.Case(body=body, headers=headers, media_type="application/json")
                    one = example(case=seed)(one)
            try:
                one()
            except Unsatisfiable:
                if mode.is_positive:
                    raise
                # Nothing in this operation's inputs can break its schema (no parameters,
                # or strings that take any text).
    return answered


# -- the agent ---------------------------------------------------------------------------


@pytest.fixture
def fuzzed_agent(agent_factory, tmp_path: Path) -> Agent:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    agent_port, port = free_ports(2)
    text = AGENT_FLEET.format(
        state=tmp_path / "state",
        agent_port=agent_port,
        model=model,
        port=port,
        python=sys.executable,  # no vLLM here: a started engine exits at once
    )
    return agent_factory(text, port=agent_port)


def agent_schema(agent: Agent) -> Any:
    """The agent's own OpenAPI: it spells out each job kind's body (console.core.wire), so
    the fuzzer sends real kinds and fields. Only the names are narrowed here, so that it
    reaches past "no such profile": the real profiles and the engine the tiny one starts.
    what-if takes any object: its keys are spelled here. The negative cases still send
    every other shape."""
    doc = agent.get("/openapi.json").json()  # behind a viewer token
    del doc["paths"]["/v1/snapshot/stream"]  # endless by design
    kinds = doc["components"]["schemas"]
    kinds["VllmStart"]["properties"]["profile"] = {"enum": ["tiny", "far", "absent"]}
    for kind in ("EngineStop", "EngineRestart"):
        kinds[kind]["properties"]["engine"] = {"enum": [engine_of(agent), "vllm-absent"]}
    what_if = {
        "type": "object",
        "properties": {
            k: {"anyOf": [{"type": "string"}, {"type": "null"}, {}]}
            for k in ("driver", "cuda", "tensorrt", "tensorrt_llm", "gpu", "compute_capability")
        },
    }
    content = doc["paths"]["/v1/drills/what-if"]["post"]["requestBody"]["content"]
    content["application/json"]["schema"] = what_if  # (FastAPI's "any object" would swallow it)
    return load(doc)


def engine_of(agent: Agent) -> str:
    """The id of the engine the tiny profile starts."""
    ports = [line for line in agent.fleet.read_text().splitlines() if line.startswith("port = ")]
    port = int(ports[0].split("=")[1])
    return make_engine_id("vllm", f"http://127.0.0.1:{port}")


def agent_jobs(agent: Agent) -> list[dict]:
    resp = agent.get("/v1/jobs?limit=1000")
    resp.raise_for_status()
    return resp.json()


def test_the_agent_api_survives_a_fuzzer_and_leaves_nothing_running(fuzzed_agent: Agent):
    agent = fuzzed_agent
    schema = agent_schema(agent)
    checks = [response_schema_conformance]
    start = {"kind": "vllm.start", "profile": "tiny"}
    engine = {"kind": "engine.stop", "engine": engine_of(agent)}
    seeds = {"POST /v1/jobs/plan": [start], "POST /v1/jobs": [start, engine]}
    answered = fuzz(schema, agent.url, bearer(VIEWER), checks, seeds)
    acting = schema.include(method=["POST", "DELETE"])
    answered += fuzz(acting, agent.url, bearer(OPERATOR_TOKEN), checks, seeds)
    # The fuzzer got past the refusals: it planned and started jobs.
    assert answered["POST /v1/jobs/plan", 200] and answered["POST /v1/jobs", 202], answered

    # Whatever the fuzzer started has ended, and nothing it started still runs.
    seen: list[dict] = []

    def all_ended() -> bool:
        seen[:] = agent_jobs(agent)
        return all(j["state"] in FINAL for j in seen)

    try:
        wait_until(all_ended, 60, interval=0.5, what="every fuzzed job in a final state")
    except TimeoutError:
        running = [j for j in seen if j["state"] not in FINAL]
        raise AssertionError(f"jobs left running: {json.dumps(running, indent=1)}") from None
    jobs = seen
    assert agent.process.poll() is None, f"the agent died:\n{log_tail(agent.log)}"
    parent = psutil.Process(agent.process.pid)
    wait_until(
        lambda: not parent.children(recursive=True),
        30,
        what=f"no child process of the agent (jobs: {[j['kind'] for j in jobs]})",
    )
    for record in (agent.fleet.parent.parent / "state").glob("*/engines/*/engine.json"):
        pgid = json.loads(record.read_text()).get("pgid")
        if pgid:
            with pytest.raises(ProcessLookupError):
                os.killpg(pgid, 0)


# -- the gateway ---------------------------------------------------------------------------


@pytest.fixture
def fuzzed_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    vllm, triton, port = free_ports(3)
    log = tmp_path / "engines.log"
    with log.open("wb") as out:
        engines = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "engine_double.py"),
             f"vllm:{vllm}", f"triton:{triton}"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    gateway = None
    try:
        wait_until(lambda: "listening" in log.read_text(), 20, what="engine doubles")
        monkeypatch.setenv("FUZZ_API_KEYS", CLIENT_KEY)
        text = GATEWAY_FLEET.format(port=port, state=tmp_path / "gw", vllm=vllm, triton=triton)
        gateway = start_gateway(tmp_path, text, port)
        yield gateway
    finally:
        if gateway is not None:
            stop(gateway.process, grace=5)
        stop(engines, grace=2)
        if engines.returncode not in (0, -signal.SIGTERM):
            print(log_tail(log))


def test_the_gateway_survives_a_fuzzer_and_leaves_nothing_in_flight(fuzzed_gateway: Gateway):
    gateway = fuzzed_gateway
    schema = load(
        yaml.safe_load((ROOT / "tests" / "fixtures" / "gateway-openapi.yaml").read_text())
    )
    front = schema.include(path_regex="^/v1/")
    admin = schema.exclude(path_regex="^/v1/")
    prompt = {"model": "tiny", "max_tokens": 4, "prompt": "hi"}
    chat = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    seeds = {
        "POST /v1/completions": [prompt, {**prompt, "stream": True}],
        "POST /v1/chat/completions": [chat, {**chat, "stream": True}],
        "POST /admin/failover": [{"model": "tiny", "to": "tiny-vllm", "mode": "emergency"}],
    }
    answered = fuzz(front, gateway.url, bearer(CLIENT_KEY), [], seeds)
    answered += fuzz(admin, gateway.url, bearer(ADMIN), [], seeds)
    # The fuzzer got past the refusals: engines answered, failovers started.
    assert answered["POST /v1/completions", 200] and answered["POST /v1/chat/completions", 200]
    assert answered["POST /admin/failover", 202], answered

    def settled() -> dict | None:
        jobs = gateway.admin("GET", "/admin/jobs").json()
        routes = gateway.admin("GET", "/admin/routes").json()
        inflight = {d["id"]: d["inflight"] for d in routes["tiny"]["deployments"]}
        running = [j["id"] for j in jobs if j["state"] not in FINAL]
        return None if running or any(inflight.values()) else routes

    wait_until(settled, 60, interval=0.5, what="no failover running and nothing in flight")
    assert gateway.process.poll() is None, f"the gateway died:\n{log_tail(gateway.log)}"
    # And it still serves: every deployment back at work.
    gateway.admin("PUT", "/admin/routes/tiny", json={"weights": {"tiny-trt": 100}})
    answer = httpx.post(
        gateway.url + "/v1/completions",
        json={"model": "tiny", "prompt": "hi", "max_tokens": 2},
        headers=bearer(CLIENT_KEY),
        timeout=10,
    )
    assert answer.status_code == 200, answer.text


# Inputs the fuzzer found that answered 500, each kept as a plain request.
FOUND = [
    # A truthy "stream" that is not `true`: the gateway answered as if not streaming while
    # asking Triton for its SSE stream, then failed to parse the stream as one JSON answer.
    ("POST", "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2, "stream": 1}),
    ("POST", "/v1/chat/completions",
     {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}),
]  # fmt: skip


def test_requests_the_fuzzer_found_get_answers_not_500s(fuzzed_gateway: Gateway):
    gateway = fuzzed_gateway
    put = gateway.admin(
        "PUT", "/admin/routes/tiny", json={"weights": {"tiny-trt": 100, "tiny-vllm": 0}}
    )
    assert put.status_code == 200, put.text
    for method, path, body in FOUND:
        resp = httpx.request(
            method, gateway.url + path, json=body, headers=bearer(CLIENT_KEY), timeout=10
        )
        assert resp.status_code < 500, f"{method} {path} {json.dumps(body)}: {resp.text}"
        assert resp.headers.get("X-Engineroom-Deployment") == "tiny-trt"


def test_admin_bodies_that_are_not_objects_get_a_400(fuzzed_gateway: Gateway):
    for path in ("/admin/failover", "/admin/failover/plan"):
        for body in ([], 8.016625408535524e256, "tiny"):
            resp = fuzzed_gateway.admin("POST", path, json=body)
            assert resp.status_code == 400, f"POST {path} {json.dumps(body)}: {resp.status_code}"


def test_an_admin_body_with_a_misspelt_key_is_refused_naming_it_and_changes_nothing(
    fuzzed_gateway: Gateway,
):
    """Before: unknown keys were dropped. `"mdoe": "emergency"` started a PLANNED failover,
    and a weight change's `"reason"` never reached the audit log."""
    gateway = fuzzed_gateway
    routes = gateway.admin("GET", "/admin/routes").json()
    ask = {"model": "tiny", "to": "tiny-vllm", "mdoe": "emergency"}
    for path in ("/admin/failover", "/admin/failover/plan"):
        resp = gateway.admin("POST", path, json=ask)
        assert resp.status_code == 422, f"{path}: {resp.status_code} {resp.text}"
        assert "mdoe" in resp.json()["error"], resp.text
    assert gateway.admin("GET", "/admin/jobs").json() == []
    put = {"weights": {"tiny-vllm": 0}, "reason": "drain for the upgrade"}
    resp = gateway.admin("PUT", "/admin/routes/tiny", json=put)
    assert resp.status_code == 422 and "reason" in resp.json()["error"], resp.text
    assert gateway.admin("GET", "/admin/routes").json() == routes
