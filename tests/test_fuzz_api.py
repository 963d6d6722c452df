"""The agent's and the gateway's APIs under a fuzzer: every answer is one its schema
documents, every request the schema allows is taken and every one it forbids refused, and
no input gets a 500, hangs, or leaves a job, a process or an in-flight request behind.

`schemathesis run --checks all` generates requests from each API's OpenAPI schema (the
agent's own /openapi.json; the gateway's tests/fixtures/gateway-openapi.yaml): the schema's
examples, its boundary cases, generated ones fitting the schema and breaking it, and
sequences that follow one answer's id into the next request. It sends them to a real agent
and a real gateway on loopback with every role's token. The agent's launch profile runs
this test's python, which has no vLLM: an operator-token start gets as far as spawning the
engine, which exits at once. The gateway's engines are the ENGINE DOUBLES of
tests/engine_double.py (a real vLLM cannot answer thousands of requests in a minute here;
tests/test_gateway.py runs the real ones).

A failure prints schemathesis's report: each failed check and a `curl` reproducer. The
same cases run every time (seeded); FUZZ_RANDOM=1 explores new ones, FUZZ_EXAMPLES sets
how many per operation.
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
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
import yaml

from console.agent.snapshot.engines import engine_id as make_engine_id
from tests.conftest import OPERATOR, ROOT, VIEWER, Agent
from tests.engines.servers import free_ports, log_tail, stop, wait_until
from tests.support.fleet import fleet_toml, model_dir, vllm_profile
from tests.test_gateway import ADMIN, Gateway, start_gateway

OPERATOR_TOKEN = OPERATOR.split(":", 1)[1]
CLIENT_KEY = "client-key-0123456789"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "10"))  # per operation, phase and mode
REQUEST_TIMEOUT_S = 10.0  # a fuzzed request that takes longer has hung
RUN_TIMEOUT_S = 300.0  # one schemathesis run, all phases
FINAL = ("succeeded", "failed", "cancelled")

# The run's settings besides the command line: reproducers show every body field (the
# default hides any field named like a token, max_tokens too) but not the Authorization
# header; a 503 is the honest "not now" (no deployment can answer, no snapshot yet), any
# other 5xx a defect; a 413 refuses a body over the documented size, which no schema can
# say (schemathesis counts it neither as a refusal nor as an acceptable answer).
SCHEMATHESIS_TOML = """\
[output.sanitization]
keys-to-sanitize = ["authorization"]
sensitive-markers = ["authorization"]

[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", "503"]

[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422"]

[checks.positive_data_acceptance]
expected-statuses = ["2xx", "401", "403", "404", "409", "413", "503"]
"""

Answered = Counter[tuple[str, str, int]]  # (method, path, status): how often


def schemathesis_run(
    doc: dict[str, Any], base_url: str, token: str, workdir: Path, *options: str, toml: str = ""
) -> Answered:
    """`schemathesis run --checks all` of `doc` against `base_url` with `token`, every
    phase; fails the test with schemathesis's report if any check failed. Its files (crash
    records, the report) stay in `workdir`, never in the checkout. Returns how often each
    request path answered each status (from the run's HAR report)."""
    workdir.mkdir(parents=True)
    (workdir / "schema.json").write_text(json.dumps(doc))
    (workdir / "schemathesis.toml").write_text(SCHEMATHESIS_TOML + toml)
    har = workdir / "requests.har"
    seed = [] if os.environ.get("FUZZ_RANDOM") else ["--seed", "1"]
    argv = [
        *(sys.executable, "-m", "schemathesis.cli", "--config-file", "schemathesis.toml"),
        *("run", "schema.json", "--url", base_url, "--checks", "all"),
        *("--header", f"Authorization: Bearer {token}"),
        *("--max-examples", str(EXAMPLES), "--request-timeout", str(REQUEST_TIMEOUT_S)),
        *("--generation-database", "none", "--report", "har", "--report-har-path", str(har)),
        *("--no-color", *seed, *options),
    ]
    done = subprocess.run(
        argv, cwd=workdir, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    (workdir / "schemathesis.out").write_text(done.stdout + done.stderr)
    if done.returncode != 0:  # its report, each line cut short (a fuzzed body can be huge)
        report = [line[:400] for line in (done.stdout + done.stderr).splitlines() if line]
        raise AssertionError("schemathesis found:\n" + "\n".join(report[-300:]))
    answered: Answered = Counter()
    for entry in json.loads(har.read_text())["log"]["entries"]:
        path = urlsplit(entry["request"]["url"]).path
        answered[entry["request"]["method"], path, entry["response"]["status"]] += 1
    return answered


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


# -- the agent ---------------------------------------------------------------------------


@pytest.fixture
def fuzzed_agent(agent_factory, tmp_path: Path) -> Agent:
    model = model_dir(tmp_path)
    agent_port, port = free_ports(2)
    tiny = vllm_profile(
        "local", model, port,
        sys.executable,  # no vLLM here: a started engine exits at once
        overridable=["port"], allowed_args=["max_num_seqs"], stop_grace_s=2,
    )  # fmt: skip
    far = {"engine": "vllm", "node": "elsewhere", "model": model, "served_model_name": "far",
           "port": port}  # fmt: skip
    text = fleet_toml(
        fleet={"name": "fuzz"},
        agent={"state_dir": tmp_path / "state", "scrape_interval_s": 0.5},
        nodes=[
            {"name": "local", "agent": f"http://127.0.0.1:{agent_port}"},
            {"name": "elsewhere", "agent": "http://127.0.0.1:9"},
        ],
        profiles={"tiny": tiny, "far": far},
        models=[{"name": "tiny", "deployments": [
            {"id": "tiny-trt", "node": "local", "engine": "trtllm", "endpoint": "http://127.0.0.1:9"}
        ]}],
    )  # fmt: skip
    return agent_factory(text, port=agent_port)


def served_schema(agent: Agent) -> dict[str, Any]:
    """The agent's /openapi.json as any client reads it (behind a viewer token)."""
    doc: dict[str, Any] = agent.get("/openapi.json").json()
    del doc["paths"]["/v1/snapshot/stream"]  # endless by design
    return doc


def agent_schema(agent: Agent) -> dict[str, Any]:
    """The agent's own OpenAPI, which spells out each job kind's body (console.core.wire),
    with the fleet's own names put in, as a console would send them: the profiles (tiny
    here, far on another node, one that is nowhere), the engine the tiny one starts, and
    the overrides tiny allows. The schema cannot know them; without them the fuzzer would
    never get past "no such profile". The negative cases still send every other shape."""
    doc = served_schema(agent)
    kinds = doc["components"]["schemas"]
    start = kinds["VllmStart"]["properties"]
    # tiny marks port and args.max_num_seqs overridable, and sets no value for
    # max_num_seqs: true/false is not for it (a boolean adds or drops a flag).
    args = next(iter(start["overrides"]["patternProperties"].values()))
    start["overrides"] = {
        "type": "object",
        "properties": {
            "port": start["overrides"]["properties"]["port"],
            "args.max_num_seqs": {"anyOf": [t for t in args["anyOf"] if t["type"] != "boolean"]},
        },
        "additionalProperties": False,
    }
    start["profile"] = {"enum": ["tiny", "far", "absent"]}
    for kind in ("EngineStop", "EngineRestart"):
        kinds[kind]["properties"]["engine"] = {"enum": [engine_of(agent), "vllm-absent"]}
    # Sent first, as they are: requests that must get past the refusals.
    tiny = {"kind": "vllm.start", "profile": "tiny"}
    stop_it = {"kind": "engine.stop", "engine": engine_of(agent)}
    for path, bodies in (("/v1/jobs/plan", [tiny]), ("/v1/jobs", [tiny, stop_it])):
        content = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        content["examples"] = {f"seed{n}": {"value": body} for n, body in enumerate(bodies)}
    return doc


def engine_of(agent: Agent) -> str:
    """The id of the engine the tiny profile starts."""
    ports = [line for line in agent.fleet.read_text().splitlines() if line.startswith("port = ")]
    port = int(ports[0].split("=")[1])
    return make_engine_id("vllm", f"http://127.0.0.1:{port}")


def agent_jobs(agent: Agent) -> list[dict]:
    resp = agent.get("/v1/jobs?limit=1000")
    resp.raise_for_status()
    return resp.json()


def test_the_agent_answers_only_what_its_schema_says_and_leaves_nothing_running(
    fuzzed_agent: Agent, tmp_path: Path
):
    agent = fuzzed_agent
    # The schema as served, every route with a viewer token: what anyone who reads it may
    # send (where a route acts, the viewer gets its 403).
    answered = schemathesis_run(served_schema(agent), agent.url, VIEWER, tmp_path / "viewer")
    # With the fleet's names and an operator token: plan, start, stop, cancel.
    acting = ("POST /v1/jobs/plan", "POST /v1/jobs", "DELETE /v1/jobs/{job_id}")
    only = [f"--include-name={name}" for name in acting]
    workdir = tmp_path / "operator"
    answered += schemathesis_run(agent_schema(agent), agent.url, OPERATOR_TOKEN, workdir, *only)
    # The fuzzer got past the refusals: it planned and started jobs.
    assert answered["POST", "/v1/jobs/plan", 200] and answered["POST", "/v1/jobs", 202], answered

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
    left: list[psutil.Process] = []

    def no_child() -> bool:
        left[:] = parent.children(recursive=True)
        return not left

    try:
        wait_until(no_child, 30, what="no child process of the agent")
    except TimeoutError:
        shown = [p.as_dict(["pid", "status", "cmdline"], ad_value="?") for p in left]
        kinds = [(j["kind"], j["state"]) for j in jobs]
        raise AssertionError(f"children left: {shown}; jobs: {kinds}") from None
    for record in (agent.fleet.parent.parent / "state").glob("*/engines/*/engine.json"):
        pgid = json.loads(record.read_text()).get("pgid")
        if pgid:
            with pytest.raises(ProcessLookupError):
                os.killpg(pgid, 0)


def test_requests_the_fuzzer_found_get_the_answers_the_agent_schema_promises(
    fuzzed_agent: Agent,
):
    """Before: a profile the node does not have answered 422, which the schema keeps for
    requests that break it, and a port of 8001.0 (an integer to JSON Schema) was refused."""
    agent = fuzzed_agent
    plan = agent.url + "/v1/jobs/plan"
    for profile in ("absent", "far"):  # nowhere; on another node
        body = {"kind": "vllm.start", "profile": profile}
        answer = httpx.post(plan, json=body, headers=bearer(VIEWER), timeout=10)
        assert answer.status_code == 404, answer.text
    port = int(engine_of(agent).rpartition("-")[2])
    whole = {"kind": "vllm.start", "profile": "tiny", "overrides": {"port": float(port)}}
    answer = httpx.post(plan, json=whole, headers=bearer(VIEWER), timeout=10)
    assert answer.status_code == 200 and f"--port={port}" in answer.json()["argv"], answer.text
    empty = {"kind": "vllm.start", "profile": ""}  # which the schema now refuses too
    assert httpx.post(plan, json=empty, headers=bearer(VIEWER), timeout=10).status_code == 422


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


# PUT /admin/routes/save is PUT /admin/routes/{model} for a model named "save" (a name a
# fleet may use): it answers 404, no such model, where schemathesis expects 405 for a
# method /admin/routes/save does not declare, and a 405's Allow names PUT with POST.
SAVE_IS_A_MODEL = """
[[operations]]
include-path = "/admin/routes/save"
phases.coverage.unexpected-methods = ["GET", "DELETE", "PATCH", "TRACE"]
"""


def gateway_schema() -> dict[str, Any]:
    """tests/fixtures/gateway-openapi.yaml, with requests that must get past the refusals
    sent first as its examples: an engine answers them, a failover starts."""
    doc: dict[str, Any] = yaml.safe_load(
        (ROOT / "tests" / "fixtures" / "gateway-openapi.yaml").read_text()
    )
    prompt = {"model": "tiny", "max_tokens": 4, "prompt": "hi"}
    chat = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    seeds: dict[str, list[dict[str, Any]]] = {
        "/v1/completions": [prompt, {**prompt, "stream": True}],
        "/v1/chat/completions": [chat, {**chat, "stream": True}],
        "/admin/failover": [{"model": "tiny", "to": "tiny-vllm", "mode": "emergency"}],
    }
    for path, bodies in seeds.items():
        content = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        content["examples"] = {f"seed{n}": {"value": body} for n, body in enumerate(bodies)}
    return doc


def only(doc: dict[str, Any], prefix: str, keep: bool = True) -> dict[str, Any]:
    """`doc` with the paths that start with `prefix` (keep) or the others."""
    paths = {p: v for p, v in doc["paths"].items() if p.startswith(prefix) == keep}
    return {**doc, "paths": paths}


def test_the_gateway_answers_only_what_its_schema_says_and_leaves_nothing_in_flight(
    fuzzed_gateway: Gateway, tmp_path: Path
):
    gateway = fuzzed_gateway
    doc = gateway_schema()
    front, admin = only(doc, "/v1/"), only(doc, "/v1/", keep=False)
    # The front door hands a body to the engine, which decides what it takes (OpenAI's
    # fields; here the ENGINE DOUBLES): what the gateway itself refuses (a wrong key, an
    # unknown model, a body that is not JSON or too big) is held to the schema's statuses.
    relayed = ("--exclude-checks", "positive_data_acceptance,negative_data_rejection")
    answered = schemathesis_run(front, gateway.url, CLIENT_KEY, tmp_path / "front", *relayed)
    workdir = tmp_path / "admin"
    answered += schemathesis_run(admin, gateway.url, ADMIN, workdir, toml=SAVE_IS_A_MODEL)
    # The fuzzer got past the refusals: engines answered, failovers started.
    chats = answered["POST", "/v1/chat/completions", 200]
    assert answered["POST", "/v1/completions", 200] and chats, answered
    assert answered["POST", "/admin/failover", 202], answered

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


def test_a_whole_float_is_a_weight_as_the_gateway_schema_says(fuzzed_gateway: Gateway):
    put = {"weights": {"tiny-trt": 100.0, "tiny-vllm": 0}}
    answer = fuzzed_gateway.admin("PUT", "/admin/routes/tiny", json=put)
    assert answer.status_code == 200, answer.text
    weights = {d["id"]: d["weight"] for d in answer.json()["deployments"]}
    assert weights == {"tiny-trt": 100, "tiny-vllm": 0}
    for bad in (True, 2.5):
        put = {"weights": {"tiny-trt": bad}}
        assert fuzzed_gateway.admin("PUT", "/admin/routes/tiny", json=put).status_code == 422


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
