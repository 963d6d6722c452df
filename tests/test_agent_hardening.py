"""Issue 13, the agent: what an operator token (or a mistake) can make a node do, bounded.

Real agents on loopback throughout. The engine they start is ENGINE_DOUBLE below, a TEST
DOUBLE for vLLM: these tests are about the agent's argv, locks, signals and GPU holds,
and a real vLLM takes a minute of both CPU cores to load here. What vLLM itself makes of
the argv is checked once, with vLLM 0.32's own argument parser. The GPU tests run the
agent in this process over the NVML test double (tests/nvml_double.py): there is no GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import uvicorn

from console.agent.api.app import MAX_BODY_BYTES, create_app
from console.agent.api.auth import TokenError, Tokens
from console.agent.jobs.runner import JobRunner
from console.agent.jobs.store import JobEnded, Store
from console.agent.snapshot.gpu import GpuSampler
from console.agent.snapshot.node import NodeAgent
from console.agent.supervise.processes import capped_output
from console.agent.supervise.signals import signal_group, signal_process
from console.agent.supervise.supervisor import Managed, Supervisor
from console.collect.clients.actions import ActionError, AgentActions
from console.core.config.load import load_fleet, parse_fleet
from tests.conftest import OPERATOR, ROOT, VIEWER, Agent, agent_env, run_cli
from tests.engines.servers import free_port, require_python, running, vllm_python, wait_until
from tests.nvml_double import FakeGpu, FakeNvml

OPERATOR_TOKEN = OPERATOR.split(":", 1)[1]
GIB = 2**30

# ENGINE DOUBLE: stands in for vLLM. It reads --port and --served-model-name from its argv,
# answers /health and /v1/models, and can ignore SIGTERM (DOUBLE_IGNORE_TERM) or
# never open its port (DOUBLE_NEVER_READY), the two behaviours these tests need.
ENGINE_DOUBLE = """\
import http.server, json, os, signal, sys, time
flags, args = {}, sys.argv[1:]
for i, arg in enumerate(args):  # --name=value, or --name value
    if arg.startswith("--"):
        name, _, value = arg[2:].partition("=")
        flags[name] = value or (args[i + 1] if i + 1 < len(args) else "")
if os.environ.get("DOUBLE_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.environ.get("DOUBLE_NEVER_READY"):
    time.sleep(3600)
name = flags["served-model-name"]

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": name}]} if self.path == "/v1/models" else {})
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass

print("engine double serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(flags["port"])), Handler).serve_forever()
"""

FLEET = """
[fleet]
name = "hardening"
[agent]
state_dir = "{state}"
scrape_interval_s = 1
{agent_extra}
[[nodes]]
name = "local"
agent = "http://127.0.0.1:9410"

[profiles.double]
engine = "vllm"
node = "local"
model = "{model}"
served_model_name = "double"
port = {port}
gpus = {gpus}
command = ["{python}", "{double}"]
args = {{ host = "127.0.0.1", enforce_eager = false, gpu_memory_utilization = 0.4 }}
env = {{ {env} }}
overridable = ["port", "args.enforce_eager", "args.host", "args.gpu_memory_utilization"]
allowed_args = ["max_num_seqs", "chat_template"]
ready_timeout_s = 120
stop_grace_s = {grace}

# allowed_args without a typed default: the review's way in.
[profiles.untyped]
engine = "vllm"
node = "local"
model = "{model}"
served_model_name = "untyped"
port = {port}
command = ["{python}", "{double}"]
allowed_args = ["enforce_eager", "chat_template", "max_num_seqs", "port"]
"""


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[dict]:
    """Paths for a fleet file; every engine a test's agents left running is killed after."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    double = tmp_path / "engine_double.py"
    double.write_text(ENGINE_DOUBLE)
    state = tmp_path / "state"
    yield {"state": state, "model": model, "double": double}
    for record in state.glob("*/engines/*/engine.json"):
        try:
            os.killpg(json.loads(record.read_text())["pgid"], signal.SIGKILL)
        except (ProcessLookupError, ValueError, KeyError):
            continue


def fleet_text(
    setup: dict,
    port: int,
    *,
    env: str = "",
    grace: float = 30,
    gpus: str = "[]",
    agent_extra: str = "",
) -> str:
    return FLEET.format(
        python=sys.executable,
        port=port,
        env=env,
        grace=grace,
        gpus=gpus,
        agent_extra=agent_extra,
        **setup,
    )


def post(agent_url: str, path: str, body: dict, token: str = OPERATOR_TOKEN) -> httpx.Response:
    return httpx.post(
        agent_url + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def job_of(url: str, job_id: str) -> dict:
    resp = httpx.get(f"{url}/v1/jobs/{job_id}", headers=_viewer(), timeout=10)
    resp.raise_for_status()
    return resp.json()


def wait_state(url: str, job_id: str, states: tuple[str, ...], timeout: float = 60) -> dict:
    return wait_until(
        lambda: (job := job_of(url, job_id))["state"] in states and job,
        timeout,
        interval=0.1,
        what=f"job {job_id} {'/'.join(states)}",
    )


def submit(url: str, body: dict) -> str:
    """Job `body`, accepted (202): its id."""
    started = post(url, "/v1/jobs", body)
    assert started.status_code == 202, started.text
    return started.json()["id"]


def start_double(url: str) -> str:
    """A vllm.start of the "double" profile, accepted: its job id."""
    return submit(url, {"kind": "vllm.start", "profile": "double"})


def until_ended(url: str, job_id: str, timeout: float, what: str) -> dict:
    """Job `job_id` once it no longer runs."""
    return wait_until(
        lambda: (j := job_of(url, job_id))["state"] != "running" and j, timeout, what=what
    )


def until_loading(url: str, job_id: str, what: str = "the first start loading") -> None:
    """Until start `job_id` waits for its engine to load (its third step runs)."""
    wait_until(lambda: job_of(url, job_id)["steps"][2]["state"] == "running", 20, what=what)


def cancel(url: str, job_id: str, timeout: float = 60) -> httpx.Response:
    """DELETE job `job_id`, as the operator."""
    return httpx.delete(
        f"{url}/v1/jobs/{job_id}",
        headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
        timeout=timeout,
    )


def double_agent(setup: dict, gpus: list[FakeGpu], env: str) -> Iterator[InProcessAgent]:
    """An in-process agent over `gpus` (the NVML TEST DOUBLE), its "double" profile on all
    of them with `env`; closed after."""
    indexes = "[" + ", ".join(str(n) for n in range(len(gpus))) + "]"
    text = fleet_text(setup, free_port(), env=env, gpus=indexes, agent_extra="discover = false")
    agent = InProcessAgent(text, FakeNvml(gpus))
    yield agent
    agent.close()


def audit(state: Path) -> list[tuple[str, str, dict | None]]:
    with sqlite3.connect(next(state.glob("*/jobs.sqlite"))) as db:
        rows = db.execute("SELECT who, action, result FROM audit ORDER BY seq").fetchall()
    return [(w, a, json.loads(r) if r else None) for w, a, r in rows]


def _viewer() -> dict[str, str]:
    return {"Authorization": f"Bearer {VIEWER}"}


# ---------------------------------------------------------------------------------------------
# Flag smuggling through overrides


@pytest.mark.parametrize(
    ("profile", "overrides", "message"),
    [
        # The review's find: an untyped allowed arg took any string, and a second flag in it.
        (
            "untyped",
            {"args.enforce_eager": "--trust-remote-code"},
            "args.enforce_eager: a value may not start with '-'",
        ),
        # The --flag=value form sets any vLLM option, allowed or not.
        (
            "untyped",
            {"args.chat_template": "--allowed-local-media-path=/"},
            "args.chat_template: a value may not start with '-'",
        ),
        # A boolean passed the type check for any key, and false drops the flag.
        (
            "double",
            {"args.host": False},
            "args.host: true/false only where the profile's own value is a boolean "
            "(the profile sets '127.0.0.1')",
        ),
        (
            "untyped",
            {"args.enforce_eager": True},
            "args.enforce_eager: true/false only where the profile's own value is a boolean "
            "(the profile sets no value)",
        ),
        ("double", {"args.chat_template": "a\nb"}, "args.chat_template: a value may not hold"),
        # A second --port after the one the preflight checked would win.
        ("untyped", {"args.port": 9}, "args.port: the agent sets --port itself"),
    ],
)
def test_an_override_that_would_add_or_drop_a_flag_is_refused_naming_the_key_and_audited(
    agent_factory, setup, profile, overrides, message
):
    agent = agent_factory(fleet_text(setup, free_port()))
    body = {"kind": "vllm.start", "profile": profile, "overrides": overrides}
    started = post(agent.url, "/v1/jobs", body)
    assert started.status_code == 422, started.text
    assert started.json()["error"].startswith(message)
    planned = post(agent.url, "/v1/jobs/plan", body, token=VIEWER)
    assert planned.status_code == 422 and planned.json() == started.json()  # the same refusal
    assert agent.get("/v1/jobs").json() == []
    assert not list(setup["state"].glob("*/engines/*/engine.json"))
    [(who, action, result)] = audit(setup["state"])
    assert (who, action) == ("alice", "job vllm.start refused")
    assert result is not None and result["error"].startswith(message)


def test_each_value_is_one_flag_argument_and_the_start_runs_exactly_the_plan(agent_factory, setup):
    agent = agent_factory(fleet_text(setup, free_port()))
    overrides = {
        "args.chat_template": "x --trust-remote-code",  # a value with a flag inside stays a value
        "args.enforce_eager": True,  # the profile's own value is a boolean
        "args.max_num_seqs": 4,
    }
    body = {"kind": "vllm.start", "profile": "double", "overrides": overrides}
    plan = post(agent.url, "/v1/jobs/plan", body, token=VIEWER).json()
    assert plan["ok"], plan
    argv = plan["argv"]
    assert "--chat-template=x --trust-remote-code" in argv
    assert "--trust-remote-code" not in argv
    assert {"--enforce-eager", "--host=127.0.0.1", "--max-num-seqs=4"} <= set(argv)
    started = post(agent.url, "/v1/jobs", body)
    assert started.status_code == 202, started.text
    job = wait_state(agent.url, started.json()["id"], ("succeeded", "failed"))
    assert job["state"] == "succeeded", job
    assert job["result"]["argv"] == argv
    status = next(setup["state"].glob("*/engines/*/status.json"))
    engine = psutil.Process(json.loads(status.read_text())["engine_pid"])
    assert engine.cmdline() == argv  # what runs is what the plan showed


def test_vllms_own_parser_reads_the_planned_argv_as_the_profile_meant(agent_factory, setup):
    """vLLM 0.32's argument parser, on the argv the agent plans: the value with a flag in it
    is one value, and no option the profile did not name is set."""
    python = require_python(vllm_python(), "vllm")
    agent = agent_factory(fleet_text(setup, free_port()))
    body = {
        "kind": "vllm.start",
        "profile": "double",
        "overrides": {"args.chat_template": "x --trust-remote-code", "args.enforce_eager": True},
    }
    argv = post(agent.url, "/v1/jobs/plan", body, token=VIEWER).json()["argv"][2:]
    code = (
        "import json, sys\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "a = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])\n"
        "print(json.dumps({k: getattr(a, k) for k in ('trust_remote_code', 'chat_template',"
        " 'enforce_eager', 'host', 'port', 'model', 'allowed_local_media_path')}))\n"
    )
    out = subprocess.run(
        [str(python), "-c", code, *argv], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    parsed = json.loads(out.stdout.strip().splitlines()[-1])
    assert parsed["trust_remote_code"] is False
    assert parsed["chat_template"] == "x --trust-remote-code"
    assert parsed["enforce_eager"] is True and parsed["host"] == "127.0.0.1"
    assert parsed["model"] == str(setup["model"])
    assert parsed["allowed_local_media_path"] in ("", None)


# ---------------------------------------------------------------------------------------------
# Two agents on one node and state folder


def test_a_second_agent_on_the_same_state_folder_exits_at_once_and_touches_no_job(
    agent_factory, setup
):
    # The first agent stops an engine that ignores SIGTERM: its stop job runs for a minute.
    engine_port = free_port()
    text = fleet_text(setup, engine_port, env='DOUBLE_IGNORE_TERM = "1"', grace=60)
    first = agent_factory(text)
    start = post(first.url, "/v1/jobs", {"kind": "vllm.start", "profile": "double"}).json()
    assert wait_state(first.url, start["id"], ("succeeded", "failed"))["state"] == "succeeded"
    engine = f"vllm-{engine_port}"
    stopping = post(first.url, "/v1/jobs", {"kind": "engine.stop", "engine": engine}).json()
    wait_until(
        lambda: job_of(first.url, stopping["id"])["steps"][0]["state"] == "running",
        10,
        what="the stop step running",
    )

    t0 = time.monotonic()
    second = run_cli(
        "agent", "--fleet", str(first.fleet), "--node", "local",
        "--listen", f"127.0.0.1:{free_port()}",  # another port: the lock, not the port, refuses
        timeout=30,
    )  # fmt: skip
    assert second.returncode == 4, second.stderr
    assert f"in use by another agent (pid {first.process.pid})" in second.stderr
    assert time.monotonic() - t0 < 20

    job = job_of(first.url, stopping["id"])
    assert job["state"] == "running" and job["steps"][0]["state"] == "running", job
    assert not [a for _, a, _ in audit(setup["state"]) if a.endswith("failed")]
    assert first.engine(engine)["pid"] is not None


def test_the_lock_dies_with_the_agent_and_the_next_one_adopts_its_engine(agent_factory, setup):
    engine_port, agent_port = free_port(), free_port()
    text = fleet_text(setup, engine_port)
    first = agent_factory(text, port=agent_port)
    start = post(first.url, "/v1/jobs", {"kind": "vllm.start", "profile": "double"}).json()
    assert wait_state(first.url, start["id"], ("succeeded", "failed"))["state"] == "succeeded"
    os.kill(first.process.pid, signal.SIGKILL)  # no cleanup: the kernel drops the flock
    first.process.wait(10)
    # The engine it started (and outlived it) must not hold the lock.
    again = agent_factory(text, port=agent_port)
    wait_until(
        lambda: again.engine(f"vllm-{engine_port}")["profile"] == "double",
        20,
        what="the engine re-adopted",
    )


def test_a_start_whose_agent_and_engine_both_died_says_the_engine_is_gone(agent_factory, setup):
    """The next agent marks the start failed and says what became of its engine (it read
    the engine's id from the wrong level of the record, and never said)."""
    engine_port, agent_port = free_port(), free_port()
    text = fleet_text(setup, engine_port, env='DOUBLE_NEVER_READY = "1"')
    first = agent_factory(text, port=agent_port)
    start = post(first.url, "/v1/jobs", {"kind": "vllm.start", "profile": "double"}).json()
    until_loading(first.url, start["id"], what="the start loading")
    os.kill(first.process.pid, signal.SIGKILL)
    first.process.wait(10)
    [record] = [json.loads(p.read_text()) for p in setup["state"].glob("*/engines/*/engine.json")]
    os.killpg(record["pgid"], signal.SIGKILL)
    wait_until(lambda: not running(record["pgid"]), 10, what="the engine gone")
    again = agent_factory(text, port=agent_port)
    job = job_of(again.url, start["id"])
    assert job["state"] == "failed"
    assert job["error"].startswith("the agent stopped while this job ran; ")
    assert f"engine vllm-{engine_port} is gone (exit code" in job["error"]


def test_a_job_ends_once_even_when_two_writers_saw_it_running(tmp_path):
    """The compare-and-set: a writer that read "running" before another ended the job
    (what the second agent did, 2 ms after the first) changes nothing and audits nothing."""
    path = tmp_path / "jobs.sqlite"
    first, second = Store(path), Store(path)
    job = first.create_job("drill.run", "alice", {"drill": "d"})
    first.update_job(job.id, "running")
    seen_running = second.job(job.id)
    first.update_job(job.id, "failed", {"error": "the agent stopped while this job ran"})
    second.job = lambda _id: seen_running  # type: ignore[method-assign]  # its stale read
    with pytest.raises(JobEnded, match="already ended"):
        second.update_job(job.id, "failed", {"error": "again"})
    failed = [a for a in first.audit_log() if a["action"] == "job drill.run failed"]
    assert len(failed) == 1 and failed[0]["result"]["error"].startswith("the agent stopped")
    assert first.job(job.id).result == {"error": "the agent stopped while this job ran"}
    assert first.interrupted() == []


# ---------------------------------------------------------------------------------------------
# Signals go only to the process the agent means


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A process the agent did not start, leading its own session (as an engine does)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    yield proc
    proc.kill()
    proc.wait()


def test_a_pid_whose_start_time_differs_is_never_signalled(stranger):
    created = psutil.Process(stranger.pid).create_time()
    assert not signal_process(stranger.pid, created - 50, signal.SIGTERM)
    assert not signal_group(stranger.pid, created - 50, signal.SIGTERM)
    assert stranger.poll() is None
    assert signal_process(stranger.pid, created, signal.SIGTERM)  # its own start time: sent
    assert stranger.wait(10) == -signal.SIGTERM


async def test_stopping_a_record_whose_pid_was_reused_signals_nothing(tmp_path, stranger):
    supervisor = Supervisor(tmp_path, 1 << 20, 1)
    created = psutil.Process(stranger.pid).create_time()
    record = Managed(
        engine_id="vllm-1",
        kind="vllm",
        profile="p",
        overrides={},
        endpoint="http://127.0.0.1:1",
        served_model_name="m",
        argv=["vllm"],
        pgid=stranger.pid,  # the engine's old pid, now the stranger's
        leader_created=created - 100,
        job_id="j",
        started=time.time() - 100,
        dir=tmp_path,
    )
    assert not record.alive()
    await supervisor.stop(record, grace_s=0.5)
    assert stranger.poll() is None


def test_an_engine_record_whose_pid_was_reused_is_not_adopted_nor_stoppable(
    agent_factory, setup, stranger
):
    """A stale engine.json (the engine died, its pid now leads another session) is not
    the agent's engine: not adopted, a stop finds nothing, the stranger lives."""
    port = free_port()
    where = setup["state"] / "local" / "engines" / f"vllm-{port}"
    where.mkdir(parents=True)
    created = psutil.Process(stranger.pid).create_time()
    (where / "engine.json").write_text(
        json.dumps(
            {
                "engine_id": f"vllm-{port}",
                "kind": "vllm",
                "profile": "double",
                "overrides": {},
                "endpoint": f"http://127.0.0.1:{port}",
                "served_model_name": "double",
                "argv": ["vllm"],
                "pgid": stranger.pid,
                "leader_created": created - 100,
                "job_id": "gone",
                "started": time.time() - 100,
                "dir": str(where),
            }
        )
    )
    agent = agent_factory(fleet_text(setup, port))
    resp = post(agent.url, "/v1/jobs", {"kind": "engine.stop", "engine": f"vllm-{port}"})
    assert resp.status_code == 404, resp.text
    assert stranger.poll() is None


def found_engine(setup: dict, port: int, **env: str) -> subprocess.Popen[bytes]:
    """An engine the agent did not start, found among the processes by its vLLM argv."""
    return subprocess.Popen(
        [sys.executable, str(setup["double"]), "vllm.entrypoints.openai.api_server",
         f"--port={port}", "--served-model-name=found"],
        start_new_session=True, stdout=subprocess.DEVNULL, env={**os.environ, **env},
    )  # fmt: skip


@contextlib.contextmanager
def found_and_listed(
    agent_factory, setup: dict, agent_extra: str = "", **env: str
) -> Iterator[tuple[subprocess.Popen[bytes], Agent, str]]:
    """A found_engine and an agent that lists it: (its process, the agent, its engine id);
    the process killed after."""
    port = free_port()
    found = found_engine(setup, port, **env)
    try:
        agent = agent_factory(fleet_text(setup, free_port(), agent_extra=agent_extra))
        engine = f"vllm-{port}"
        wait_until(lambda: any(e["id"] == engine for e in agent.snapshot()["engines"]), 20)
        yield found, agent, engine
    finally:
        found.kill()
        found.wait()


def test_a_found_engine_is_stopped_by_its_pid_and_start_time(agent_factory, setup):
    with found_and_listed(agent_factory, setup) as (found, agent, engine):
        stopping = submit(agent.url, {"kind": "engine.stop", "engine": engine})
        job = wait_state(agent.url, stopping, ("succeeded", "failed"))
        assert job["state"] == "succeeded", job
        assert "after SIGTERM" in job["steps"][0]["detail"]
        assert found.wait(10) == -signal.SIGTERM


def test_a_found_engine_that_ignores_sigterm_is_killed_after_the_agents_grace(agent_factory, setup):
    """No profile names a found engine's grace: [agent] stop_grace_s does (it was a
    hard-coded 30 s)."""
    listed = found_and_listed(
        agent_factory, setup, agent_extra="stop_grace_s = 1", DOUBLE_IGNORE_TERM="1"
    )
    with listed as (found, agent, engine):
        stopping = submit(agent.url, {"kind": "engine.stop", "engine": engine})
        job = wait_state(agent.url, stopping, ("succeeded", "failed"), timeout=20)
        assert job["steps"][0]["detail"] == "did not exit within 1 s of SIGTERM: killed (SIGKILL)"
        assert found.wait(10) == -signal.SIGKILL


def test_a_profile_without_its_own_grace_takes_the_agents(setup):
    fleet = parse_fleet(fleet_text(setup, free_port(), grace=7, agent_extra="stop_grace_s = 3"))
    assert fleet.agent.stop_grace_s == 3
    assert fleet.profiles["double"].stop_grace_s == 7  # its own
    assert fleet.profiles["untyped"].stop_grace_s == 3  # none of its own: the agent's
    assert parse_fleet(fleet_text(setup, free_port())).profiles["untyped"].stop_grace_s == 30


def test_a_discovered_engine_whose_process_exited_is_not_signalled(agent_factory, setup):
    """A found engine stays listed (as down) for minutes after its process exits; a stop
    in that time must not signal its old pid, which may be another process's now."""
    with found_and_listed(agent_factory, setup) as (found, agent, engine):
        pass  # killed on leaving
    wait_until(lambda: agent.engine(engine)["state"] == "down", 20, what="found engine down")
    resp = post(agent.url, "/v1/jobs", {"kind": "engine.stop", "engine": engine})
    assert resp.status_code == 409, resp.text
    assert f"process {found.pid} has exited" in resp.json()["error"]


# ---------------------------------------------------------------------------------------------
# GPUs: held from an accepted start until it ends; the preflight reads the launch's share


class InProcessAgent:
    """The agent's app over the NVML test double, served by uvicorn on loopback from a
    thread (the GPUs are the only thing not real: there is none on this machine)."""

    def __init__(self, fleet_text: str, nvml: FakeNvml) -> None:
        fleet = parse_fleet(fleet_text)
        self.agent = NodeAgent(fleet, "local", gpu=GpuSampler(nvml))
        self.runner = JobRunner.open(self.agent)
        tokens = Tokens.from_env("V", "O", environ={"V": VIEWER, "O": OPERATOR})
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(
            create_app(self.agent, tokens, runner=self.runner),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            access_log=False,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, 30, what="in-process agent")

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture
def gpu_agent(setup) -> Iterator[InProcessAgent]:
    half_free = FakeGpu(mem_used=70 * GIB, mem_total=140 * GIB)
    yield from double_agent(setup, [half_free], env='DOUBLE_NEVER_READY = "1"')


def test_a_second_start_on_a_gpu_held_by_a_loading_start_is_refused_naming_the_job(gpu_agent):
    agent = gpu_agent
    first_id = start_double(agent.url)
    until_loading(agent.url, first_id)
    # NVML still shows GPU 0 idle: the first engine has not loaded anything yet.
    other = {"kind": "vllm.start", "profile": "double", "overrides": {"port": free_port()}}
    plan = post(agent.url, "/v1/jobs/plan", other, token=VIEWER).json()
    (gpus,) = [c for c in plan["checks"] if c["name"] == "gpus"]  # one verdict per GPU
    assert not plan["ok"] and f"held by job {first_id}" in gpus["detail"]
    second = post(agent.url, "/v1/jobs", other)
    assert second.status_code == 409, second.text
    assert second.json()["error"].startswith(f"gpus: GPU 0 is held by job {first_id}")
    assert audit_of(agent)[-1][1] == "job vllm.start refused"

    # The hold ends with the job: cancelled, its GPU takes the next start.
    cancelled = cancel(agent.url, first_id, timeout=5)  # httpx's default
    assert cancelled.json()["state"] == "cancelled"
    again = post(agent.url, "/v1/jobs", other)
    assert again.status_code == 202, again.text
    cancel(agent.url, again.json()["id"])


def test_the_gpu_check_reads_an_overridden_memory_share(gpu_agent):
    agent = gpu_agent
    body = {"kind": "vllm.start", "profile": "double"}
    assert post(agent.url, "/v1/jobs/plan", body, token=VIEWER).json()["ok"]  # 0.4 of 140 fits
    body["overrides"] = {"args.gpu_memory_utilization": 0.9}
    plan = post(agent.url, "/v1/jobs/plan", body, token=VIEWER).json()
    [gpus] = [c for c in plan["checks"] if c["name"] == "gpus"]
    assert not gpus["ok"]
    assert gpus["detail"] == (
        "GPU 0 has 70.0 GiB free, the launch needs 126.0 GiB (gpu_memory_utilization 0.9)"
    )
    refused = post(agent.url, "/v1/jobs", body)
    assert refused.status_code == 409 and "gpu_memory_utilization 0.9" in refused.json()["error"]


def audit_of(agent: InProcessAgent) -> list[tuple[str, str, dict | None]]:
    return audit(Path(agent.agent.fleet.agent.state_dir))


# ---------------------------------------------------------------------------------------------
# Tokens: one way to read each entry


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("s3cret:with:colons", "V entry 1 holds more than one ':'"),
        ("ab+cd/ef:ghijklmnop", "V entry 1: the part before ':' is not a name"),
        ("alice:tok en-123456", "V entry 1 holds whitespace"),
        ("viewer-token-1,,viewer-token-2", "V entry 2 is empty"),
        ("alice:tiny12", "V entry 1: the token is shorter than 8 characters"),
    ],
)
def test_a_token_entry_that_reads_more_than_one_way_is_refused_without_its_value(value, message):
    with pytest.raises(TokenError) as info:
        Tokens.from_env("V", "O", environ={"V": value})
    assert str(info.value).startswith(message)
    secret_parts = [p for p in value.replace(",", ":").split(":") if len(p) >= 5]
    assert not any(part in str(info.value) for part in secret_parts)


def test_the_same_token_or_name_twice_is_refused():
    with pytest.raises(TokenError, match="O entry 1: the same token as V entry 1"):
        Tokens.from_env("V", "O", environ={"V": "viewer-token-1", "O": "bob:viewer-token-1"})
    with pytest.raises(TokenError, match="O entry 1: the name 'bob' is already V entry 1's"):
        Tokens.from_env("V", "O", environ={"V": "bob:token-one-1", "O": "bob:token-two-2"})


def test_named_and_unnamed_tokens_read_as_documented():
    tokens = Tokens.from_env(
        "V", "O", environ={"V": "viewer-token-1, carol:viewer-token-2", "O": OPERATOR}
    )
    assert tokens.check("viewer-token-1").name == "viewer-1"  # type: ignore[union-attr]
    assert tokens.check("viewer-token-2").name == "carol"  # type: ignore[union-attr]
    assert tokens.check(OPERATOR_TOKEN).role == "operator"  # type: ignore[union-attr]
    assert tokens.check("carol:viewer-token-2") is None


def test_an_agent_with_an_ambiguous_token_does_not_start_and_never_prints_it(tmp_path, setup):
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(fleet_text(setup, free_port()))
    env = {**agent_env(), "ENGINEROOM_OPERATOR_TOKEN": "p4ssw0rd:with:colon"}
    result = run_cli(
        "agent", "--fleet", str(fleet), "--node", "local", "--listen", "127.0.0.1:1",
        env=env, timeout=30,
    )  # fmt: skip
    assert result.returncode == 3
    assert "ENGINEROOM_OPERATOR_TOKEN entry 1 holds more than one ':'" in result.stderr
    assert "p4ssw0rd" not in result.stderr + result.stdout
    assert "with:colon" not in result.stderr + result.stdout


# ---------------------------------------------------------------------------------------------
# What answers without a token; bounded bodies and connections


def test_only_healthz_answers_without_a_token_and_there_is_no_docs_page(agent_factory, setup):
    agent = agent_factory(fleet_text(setup, free_port()))
    assert agent.get("/healthz", token=None).status_code == 200
    assert agent.get("/openapi.json", token=None).status_code == 401
    schema = agent.get("/openapi.json")
    assert schema.status_code == 200 and "/v1/snapshot" in schema.json()["paths"]
    for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert agent.get(page).status_code == 404, page


def test_the_schema_documents_each_job_kind_and_its_fields(agent_factory, setup):
    """POST /v1/jobs took "any object": a client could not learn a kind's fields."""
    agent = agent_factory(fleet_text(setup, free_port()))
    doc = agent.get("/openapi.json").json()
    body = doc["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
    union = doc["components"]["schemas"][body["schema"]["$ref"].rsplit("/", 1)[1]]
    kinds = {
        kind: doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
        for kind, ref in union["discriminator"]["mapping"].items()
    }
    assert set(kinds) == {"vllm.start", "engine.stop", "engine.restart", "drill.run"}
    assert kinds["vllm.start"]["required"] == ["kind", "profile"]
    assert "overrides" in kinds["vllm.start"]["properties"]
    assert kinds["engine.stop"]["required"] == kinds["engine.restart"]["required"]
    assert kinds["drill.run"]["required"] == ["kind", "drill"]
    plan = doc["paths"]["/v1/jobs/plan"]["post"]["requestBody"]["content"]["application/json"]
    assert plan["schema"]["$ref"].endswith("/VllmStart")


@pytest.mark.parametrize(
    "body, message",
    [
        ({"kind": "engine.stop"}, "engine: field required"),
        ({"kind": "engine.stop", "engine": 7}, "engine: input should be a valid string (got 7)"),
        ({"kind": "drill.run", "drill": "d", "argv": ["rm"]}, "argv: a drill.run job has no such"),
        ({"kind": "vllm.start", "profile": "double", "overrides": []}, "overrides: input should"),
    ],
)
def test_a_job_request_of_the_wrong_shape_is_refused_naming_the_field_and_audited(
    agent_factory, setup, body, message
):
    agent = agent_factory(fleet_text(setup, free_port()))
    resp = post(agent.url, "/v1/jobs", body)
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"].startswith(message), resp.json()
    [(who, action, result)] = audit(setup["state"])
    assert (who, action) == ("alice", f"job {body['kind']} refused")
    assert result is not None and result["error"] == resp.json()["error"]
    assert agent.get("/v1/jobs").json() == []


def test_a_request_body_over_the_limit_is_refused_unread(agent_factory, setup):
    agent = agent_factory(fleet_text(setup, free_port()))
    headers = {"Authorization": f"Bearer {OPERATOR_TOKEN}", "Content-Type": "application/json"}
    big = b'{"kind": "vllm.start", "profile": "' + b"x" * (MAX_BODY_BYTES + 1) + b'"}'
    resp = httpx.post(agent.url + "/v1/jobs", content=big, headers=headers, timeout=30)
    assert resp.status_code == 413 and "over 65536 bytes" in resp.json()["error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"kind": "vllm.start", "profile": "'
        for _ in range(100):
            yield b"x" * 4096
        yield b'"}'

    resp = httpx.post(agent.url + "/v1/jobs", content=chunks(), headers=headers, timeout=30)
    assert resp.status_code == 413
    assert audit(setup["state"]) == []  # neither reached the job runner
    small = post(agent.url, "/v1/jobs", {"kind": "nope"})
    assert small.status_code == 422  # an ordinary body still reads

    # A Content-Length of 5,000 digits (int() refuses past 4,300): 413, not a 500.
    port = int(agent.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {OPERATOR_TOKEN}\r\n".encode()
            + b"Content-Length: "
            + b"9" * 5000
            + b"\r\n\r\n{}"
        )
        head = sock.recv(64)
    assert not head.startswith(b"HTTP/1.1 5"), head
    assert "Traceback" not in agent.log.read_text()


def test_connections_over_the_limit_get_503_and_the_agent_recovers(agent_factory, setup):
    """max_connections = 4: four snapshot streams are served, a fifth connection is not."""
    agent = agent_factory(fleet_text(setup, free_port(), agent_extra="max_connections = 4"))
    streams = []
    try:
        for _ in range(4):
            sock = socket.create_connection(("127.0.0.1", int(agent.url.rsplit(":", 1)[1])))
            sock.settimeout(10)
            sock.sendall(
                b"GET /v1/snapshot/stream HTTP/1.1\r\nHost: x\r\n"
                + f"Authorization: Bearer {VIEWER}\r\n\r\n".encode()
            )
            assert sock.recv(12) == b"HTTP/1.1 200"  # each of the four streams is served
            streams.append(sock)
        assert agent.get("/healthz", timeout=5).status_code == 503
    finally:
        for sock in streams:
            sock.close()
    wait_until(lambda: agent.get("/healthz", timeout=5).status_code == 200, 10)


# ---------------------------------------------------------------------------------------------
# Subprocess output the agent reads is bounded


@pytest.mark.parametrize(
    ("code", "limit", "timeout_s"),
    [
        ("import sys\nwhile True: sys.stdout.write('x' * 65536)", 1 << 20, 60),  # floods
        ("import time\nprint('{}', flush=True)\ntime.sleep(600)", 1 << 20, 1),  # hangs
    ],
)
async def test_a_probe_that_floods_or_hangs_is_killed_and_read_no_further(code, limit, timeout_s):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=subprocess.PIPE, start_new_session=True
    )
    started = time.monotonic()
    try:
        assert await capped_output(proc, limit, timeout_s) is None
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert time.monotonic() - started < timeout_s + 15


async def test_a_probe_that_exits_gives_its_whole_output():
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", """print('{"cuda": "12.8"}')""", stdout=subprocess.PIPE
    )
    assert await capped_output(proc, 1 << 20, 30) == b'{"cuda": "12.8"}\n'


# ---------------------------------------------------------------------------------------------
# The console following a job: bounded, and an agent that goes away is said, not a traceback


def test_vllm_start_wait_says_the_agent_went_away_and_exits_2(setup, agent_factory, tmp_path):
    """The job goes on; the command says the agent stopped answering (a guard: the follow
    below gained a limit)."""
    agent = agent_factory(fleet_text(setup, free_port(), env='DOUBLE_NEVER_READY = "1"'))
    console_fleet = tmp_path / "console.toml"
    console_fleet.write_text(
        f'[fleet]\nname = "c"\n[[nodes]]\nname = "local"\nagent = "{agent.url}"\n'
        'token_env = "T_OP"\n'
    )
    cli = subprocess.Popen(
        [sys.executable, "-m", "console.cli", "vllm", "start", "--fleet", str(console_fleet),
         "--node", "local", "--profile", "double", "--wait"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
        env={**agent_env(), "T_OP": OPERATOR_TOKEN},
    )  # fmt: skip
    try:
        running = wait_until(
            lambda: [j for j in httpx.get(f"{agent.url}/v1/jobs", headers=_viewer(),
                                          timeout=10).json() if j["state"] == "running"],
            30, what="the start job running",
        )  # fmt: skip
        assert running
        os.killpg(agent.process.pid, signal.SIGKILL)
        _, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
    text = err.decode()
    assert cli.returncode == 2, text
    assert "did not answer" in text and "Traceback" not in text, text


async def test_following_a_job_is_bounded(setup, agent_factory, tmp_path, monkeypatch):
    agent = agent_factory(fleet_text(setup, free_port(), env='DOUBLE_NEVER_READY = "1"'))
    started = post(agent.url, "/v1/jobs", {"kind": "vllm.start", "profile": "double"})
    assert started.status_code == 202, started.text
    console_fleet = tmp_path / "console.toml"
    console_fleet.write_text(
        f'[fleet]\nname = "c"\n[[nodes]]\nname = "local"\nagent = "{agent.url}"\n'
        'token_env = "T_OP"\n'
    )
    monkeypatch.setenv("T_OP", OPERATOR_TOKEN)
    actions = AgentActions(load_fleet(console_fleet), "local")
    try:
        with pytest.raises(ActionError, match=r"still not ended after 1 s; it goes on"):
            await actions.follow(started.json()["id"], lambda _: None, 0.2, limit_s=1)
    finally:
        await actions.close()
