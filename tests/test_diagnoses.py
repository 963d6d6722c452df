"""The diagnoses (issue 30) on real engines: a wedged vLLM (its EngineCore stopped, its API
server still answering) restarted through its agent, a start that fails on real vLLM and is
started again once its cause is fixed; GPU faults and a throttled GPU through the agent's
NVML sampler on the FakeNvml TEST DOUBLE; thresholds refused with their line, and engines
that cannot tell instead of guessing. The classes moved through the gateway (a Triton
whose model blocks, a crash loop, KV pressure, a replica imbalance, an error burst):
tests/test_diagnoses_gateway.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from console.agent.snapshot.gpu import GpuSampler
from console.collect.diagnose import diagnoser as diagnoses
from console.collect.diagnose import engines as diagnose_engines
from console.collect.diagnose import fleet as diagnose_fleet
from console.collect.diagnose.diagnoser import HOLD_GAP_S, Diagnoser, Diagnosis, diagnose_once
from console.collect.diagnose.output import move_hint, render_markdown, render_text
from console.collect.sources.source import NodeState
from console.collect.views.check import Diagnosed, poll_once
from console.collect.views.deployments import DeploymentRow
from console.collect.views.gateway_view import GatewayDeployment, GatewayPercentiles, GatewayView
from console.collect.views.view import build
from console.core import diagnosis as d
from console.core.config.load import ConfigError, load_fleet, parse_fleet
from console.core.snapshot import Latency, Percentiles, decode_snapshot
from console.core.snapshot import ModelStats as SnapModelStats
from console.core.wire import Engine, EngineJobResult, GoneGpu, Host, Job, NodeInfo, Snapshot
from console.core.wire import Latency as WireLatency
from console.core.wire import ModelStats as WireModelStats
from console.core.wire import Percentiles as WirePercentiles
from plugins.vllm import read_metrics
from tests.conftest import OPERATOR, Agent, agent_env, run_cli
from tests.engines.servers import (
    free_port,
    running,
    vllm_python,
    wait_until,
)
from tests.nvml_double import FakeGpu, FakeNvml
from tests.support.fleet import (
    LONG_STREAM_ENV,
    deployment,
    fleet_model,
    fleet_toml,
    one_node_fleet,
    tiny_model,
    vllm_cpu_args,
    vllm_profile,
)
from tests.test_agent_real_engines import by_deployment

OPERATOR_TOKEN = OPERATOR.split(":", 1)[1]


def look(fleet_path: Path, diagnoser: Diagnoser) -> list[Diagnosis]:
    fleet = load_fleet(fleet_path)
    view, states, gateway, _ = asyncio.run(poll_once(fleet))
    return diagnoser.update(view, states, gateway.snapshot)


def until_resolved(
    fleet_path: Path,
    diagnoser: Diagnoser,
    key: tuple[str, str],
    after: str,
    timeout: float,
    interval: float = 0.5,
    what: str = "resolved",
) -> Diagnosis:
    """Look until the diagnosis `key` reads resolved; that diagnosis, which says it was
    resolved after the move `after`."""
    resolved = wait_until(
        lambda: next(
            (x for x in look(fleet_path, diagnoser) if x.key == key and x.state == "resolved"),
            None,
        ),
        timeout, interval=interval, what=what,
    )  # fmt: skip
    assert resolved.detail.endswith(f"after {after}"), resolved.detail
    return resolved


def engine_core(pid: int) -> psutil.Process:
    """The EngineCore process under vLLM's API server `pid`."""
    [core] = [
        p for p in psutil.Process(pid).children(True)
        if "EngineCore" in " ".join(p.cmdline()) + p.name()
    ]  # fmt: skip
    return core


NODE_TOKEN = "T_NODE"  # the console's token for the node: an operator's, so it may act


def stop_in_bursts(
    core: psutil.Process, done: threading.Event, stopped_s: float, running_s: float
) -> threading.Thread:
    """The fault, from a thread until `done`: `core` stopped (SIGSTOP) for `stopped_s`,
    then running for `running_s`, again and again."""

    def bursts() -> None:
        while not done.is_set():
            core.suspend()
            done.wait(stopped_s)
            core.resume()
            done.wait(running_s)

    burster = threading.Thread(target=bursts, daemon=True)
    burster.start()
    return burster


def diagnosed_by_cli(fleet: Path) -> list[str]:
    """The names `engineroom diagnose --json` finds (it exits 1: something found)."""
    out = run_cli(
        "diagnose", "--fleet", str(fleet), "--json", env=agent_env(**{NODE_TOKEN: OPERATOR_TOKEN})
    )
    assert out.returncode == 1, out.stderr
    return [x["name"] for x in json.loads(out.stdout)["diagnoses"]]


def agent_over(
    agent_factory, text: str, monkeypatch: pytest.MonkeyPatch, discover: bool = False
) -> Agent:
    """A real agent at the address its fleet file names, which this process reads too."""
    port = free_port()
    node = f'agent = "http://127.0.0.1:{port}"\ntoken_env = "{NODE_TOKEN}"'
    text = text.replace('agent = "http://127.0.0.1:9410"', node)
    # Only the engines the test declares or starts: the suite's other engines on this
    # machine (a session's Triton, another test's vLLM) are not this test's fleet.
    if not discover:
        text = text.replace("[agent]\n", "[agent]\ndiscover = false\n", 1)
    agent: Agent = agent_factory(text, port=port)
    monkeypatch.setenv(NODE_TOKEN, OPERATOR_TOKEN)
    return agent


@pytest.mark.engines
def test_a_wedged_vllm_restarted_through_its_agent_is_resolved_once_it_generates(
    agent_factory, tiny_model_dir: Path, tmp_path: Path, monkeypatch
):
    """The move through the real path: a vLLM the agent started from a profile, its
    EngineCore stopped (SIGSTOP) under a stream, named wedged; `engineroom vllm restart`
    through the agent. While the job runs the diagnosis stays verifying; once the new
    engine generates for the next streams, resolved after restart."""
    port = free_port()
    profile = vllm_profile(
        "local", tiny_model_dir, port, vllm_python(),
        # Long streams (the tiny model declares 512 positions; its rotary embedding serves
        # longer ones fine): one lasts seconds, so vLLM's running gauge, read at a scrape,
        # shows it. With 200-token streams of 0.4 s the gauge read 0 at most scrapes on a
        # busy machine.
        args=vllm_cpu_args(2048), env=LONG_STREAM_ENV, ready_timeout_s=240,
        # SIGKILLed 1 s after SIGTERM: the restart's stop finds the core stopped, so the
        # engine never exits on SIGTERM, and nothing here depends on a clean exit.
        stop_grace_s=1,
    )  # fmt: skip
    text = one_node_fleet(
        "diag",
        fleet_model("tiny", deployment("tiny-vllm", "local", "vllm", port, profile="tiny")),
        agent={"state_dir": tmp_path / "state", "scrape_interval_s": 1},
        profiles={"tiny": profile},
    )
    agent = agent_over(agent_factory, text, monkeypatch)
    env = agent_env(**{NODE_TOKEN: OPERATOR_TOKEN})
    fleet = str(agent.fleet)
    started = run_cli(
        "vllm", "start", "--fleet", fleet, "--node", "local", "--profile", "tiny", "--wait",
        env=env, timeout=300,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    engine = f"vllm-{port}"
    base = f"http://127.0.0.1:{port}"
    diagnoser = Diagnoser(load_fleet(agent.fleet))
    done = threading.Event()
    flowing = threading.Event()  # a stream is under way: its tokens are arriving
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 1500, "temperature": 0,
            "ignore_eos": True, "stream": True}  # fmt: skip

    def streams() -> None:  # one after another; those cut by the restart fail, and go on
        while not done.is_set():
            try:
                with (
                    httpx.Client(timeout=300) as client,
                    client.stream("POST", base + "/v1/completions", json=body) as answer,
                ):
                    for n, _ in enumerate(answer.iter_lines()):
                        if n == 10:
                            flowing.set()
            except httpx.HTTPError:
                done.wait(0.2)  # the engine restarting: try again
            flowing.clear()

    sender = threading.Thread(target=streams, daemon=True)
    sender.start()
    core: psutil.Process | None = None
    try:
        old_pid = by_deployment(agent)["tiny-vllm"]["pid"]
        core = engine_core(old_pid)
        # Stopped while a stream's tokens are arriving, as its client sees them. vLLM's own
        # running gauge is no guide while the core runs: a busy API server answers /metrics
        # between requests, when it reads 0 (CI: "a stream running: not met within 120 s").
        # Once the core is stopped the API server is idle, and its gauge says the stream.
        for _ in range(50):
            wait_until(flowing.is_set, 120, what="a stream under way")
            core.suspend()
            if (by_metrics(base) or 0) >= 1:
                break
            core.resume()
        else:
            raise AssertionError("vLLM never counted a stream running with its core stopped")
        stopped = time.monotonic()
        found = wait_until(
            lambda: next(
                (x for x in look(agent.fleet, diagnoser) if x.kind is d.ENGINE_WEDGED), None
            ),
            60,
            interval=0.5,
            what="engine wedged diagnosed",
        )
        print(f"wedged: diagnosed {time.monotonic() - stopped:.1f} s after the core stopped")
        assert found.subject == f"local/{engine}" and found.engine == engine
        assert found.moves == ["failover", "restart"]
        shown = {e.figure: e.value for e in found.evidence}
        assert float(shown["requests running"]) >= 1, shown
        assert shown["health"].startswith("ready"), shown  # its API server still answers
        assert all(e.at == f"engine {engine} on local" for e in found.evidence)
        # The same through the command line, as an on-call engineer runs it over SSH.
        out = run_cli("diagnose", "--fleet", fleet, "--json", env=env)
        assert out.returncode == 1, out.stderr
        assert "engine_wedged" in [x["name"] for x in json.loads(out.stdout)["diagnoses"]]
        restart = run_cli(
            "vllm", "restart", "--fleet", fleet, "--node", "local", "--engine", engine,
            "--json", env=env,
        )  # fmt: skip
        assert restart.returncode == 0, restart.stdout + restart.stderr
        job = json.loads(restart.stdout)["id"]
        diagnoser.moved(found.key, "restart")
        states: list[str] = []  # the diagnosis's state at each look made while the job ran

        def job_state() -> str:
            return agent.get(f"/v1/jobs/{job}").json()["state"]

        def ended() -> bool:
            before = job_state()
            seen = [x.state for x in look(agent.fleet, diagnoser) if x.key == found.key]
            after = job_state()
            if before == after == "running":  # the look fell wholly inside the job
                states.extend(seen)
            return after not in ("queued", "running")

        wait_until(ended, 300, interval=1.0, what="the restart job ended")
        # The restart: a stop, then the same profile again, with a new cold start.
        restarted = agent.get(f"/v1/jobs/{job}").json()
        assert restarted["state"] == "succeeded", restarted
        assert [(s["name"], s["state"]) for s in restarted["steps"]] == [
            ("stop", "succeeded"), ("preflight", "succeeded"), ("spawn", "succeeded"),
            ("load", "succeeded"),
        ]  # fmt: skip
        typed = EngineJobResult.model_validate(restarted["result"])  # the wire's result model
        cold = typed.cold_start
        assert cold is not None and cold.total_s > 0 and cold.total_s == cold.phases["ready"]
        assert typed.argv and typed.endpoint == base
        assert not running(old_pid)
        assert states and set(states) == {"verifying"}, states  # never resolved meanwhile
        until_resolved(agent.fleet, diagnoser, found.key, "restart", 120,
                       what="resolved once the restarted engine generates")  # fmt: skip
        assert by_deployment(agent)["tiny-vllm"]["exits"] == []  # the restart was asked for
    finally:
        done.set()
        if core is not None:
            with contextlib.suppress(psutil.Error):
                core.resume()
        run_cli("vllm", "stop", "--fleet", fleet, "--node", "local", "--engine", engine,
                "--wait", env=env, timeout=120)  # fmt: skip
        sender.join(150)


def by_metrics(base: str) -> float | None:
    """Requests running, from vLLM's own /metrics."""
    text = httpx.get(base + "/metrics", timeout=10).text
    return next(m for m in read_metrics(text, ["tiny"]) if m.name == "tiny").requests_running


@pytest.mark.engines
def test_a_failed_start_on_real_vllm_is_diagnosed_with_its_cause_and_resolved_by_a_start(
    agent_factory, tiny_model_dir: Path, tmp_path: Path, monkeypatch
):
    """A model directory whose config names no architecture: vLLM starts, then refuses it.
    Named a failed start, its cause read from vLLM's words, the start again first; with the
    model put in its place and the profile started again through the agent, resolved."""
    broken = tmp_path / "no-architecture"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    port = free_port()
    profile = vllm_profile(
        "local", broken, port, vllm_python(), served="broken", args=vllm_cpu_args(256),
        env={"VLLM_CPU_KVCACHE_SPACE": "1"}, ready_timeout_s=240,
    )  # fmt: skip
    text = one_node_fleet(
        "diag",
        agent={"state_dir": tmp_path / "state", "scrape_interval_s": 1},
        profiles={"broken": profile},
    )
    agent = agent_over(agent_factory, text, monkeypatch)
    start = ("vllm", "start", "--fleet", str(agent.fleet), "--node", "local",
             "--profile", "broken", "--wait")  # fmt: skip
    env = agent_env(**{NODE_TOKEN: OPERATOR_TOKEN})
    started = run_cli(*start, env=env, timeout=300)
    assert started.returncode == 1, started.stdout + started.stderr
    diagnoser = Diagnoser(load_fleet(agent.fleet))
    failed = wait_until(  # in the agent's next snapshot
        lambda: [x for x in look(agent.fleet, diagnoser) if x.kind is d.START_FAILED],
        30,
        interval=0.5,
        what="the failed start diagnosed",
    )
    assert len(failed) == 1, [x.headline() for x in failed]
    assert failed[0].cause == "unknown architecture", failed[0].evidence
    assert failed[0].moves[0] == "start"
    # The cause fixed (the model put in its place), the move: the profile started again.
    shutil.rmtree(broken)
    shutil.copytree(tiny_model_dir, broken)
    diagnoser.moved(failed[0].key, "start")
    again = run_cli(*start, "--json", env=env, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    engine = json.loads(again.stdout)["result"]["engine_id"]
    try:
        until_resolved(agent.fleet, diagnoser, failed[0].key, "start", 30,
                       what="the failed start resolved once a start succeeded")  # fmt: skip
    finally:
        stopped = run_cli(
            "vllm", "stop", "--fleet", str(agent.fleet), "--node", "local", "--engine", engine,
            "--wait", env=env, timeout=120,
        )  # fmt: skip
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr


@pytest.mark.parametrize(
    ("table", "key", "value", "why"),
    [
        ("diagnoses", "kv_pressure_usage", "1.5", "less than or equal to 1"),
        ("diagnoses", "wedged_after_s", "0", "greater than 0"),
        ("diagnoses", "imbalance_times", "1.1", "greater than or equal to 1.5"),
        ("diagnoses", "wedge_after_s", "5", "did you mean 'wedged_after_s'"),  # not ignored
    ],
)
def test_thresholds_out_of_range_are_refused_with_their_line(table, key, value, why, tmp_path):
    text = f'[fleet]\nname = "x"\n\n[{table}]\n{key} = {value}\n'
    with pytest.raises(ConfigError) as refused:
        parse_fleet(text, tmp_path / "fleet.toml")
    message = str(refused.value)
    assert "fleet.toml:5" in message and key in message and why in message, message


def test_a_models_threshold_overrides_the_fleets_and_an_unset_one_takes_the_default(tmp_path):
    fleet = parse_fleet(
        '[fleet]\nname = "x"\n[diagnoses]\nwedged_after_s = 10\n'
        '[[models]]\nname = "m"\n[models.diagnoses]\nwedged_after_s = 4\n',
        tmp_path / "fleet.toml",
    )
    assert d.limit(fleet, "m", "wedged_after_s") == 4
    assert d.limit(fleet, "other", "wedged_after_s") == 10
    assert d.limit(fleet, "m", "kv_pressure_usage") == d.DEFAULTS["kv_pressure_usage"]


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        (
            "ValueError: To serve at least one request with the models's max seq len (8192), "
            "(0.5 GiB KV cache is needed, which is larger than the available KV cache memory",
            "KV cache cannot hold max_model_len",
        ),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", "out of memory"),
        ("OSError: [Errno 98] Address already in use", "port in use"),
        ("the engine exited with code 1 before it was ready", "unclassified"),
    ],
)
def test_a_failed_starts_cause_is_read_from_vllms_own_words(text, cause):
    assert d.start_cause(text) == cause


def test_every_class_has_moves_the_console_has_and_a_documented_name():
    docs = (Path(__file__).parent.parent / "docs" / "diagnoses.md").read_text()
    for kind in d.ALL:
        assert kind.moves and all(m in d.MOVE_TEXT for m in kind.moves), kind.name
        assert f"`{kind.name}`" in docs, f"{kind.name} is not in docs/diagnoses.md"


# -- GPU faults: the FakeNvml TEST DOUBLE (no GPU on these machines) ----------------------


NODE_FLEET = one_node_fleet("t")


def diagnose_snapshot(wire: Snapshot, fleet_text: str = NODE_FLEET) -> Diagnosed:
    """The finder over one node's snapshot, as the console holds it after a poll."""
    fleet = parse_fleet(fleet_text)
    wire.node.time = time.time()
    snap = decode_snapshot(wire.model_dump_json())
    states = {"local": NodeState("local", "agent", snapshot=snap, last_ok=time.monotonic())}
    return Diagnosed(*diagnose_once(fleet, build(fleet, states, 1.0), states))


def test_an_xid_and_uncorrected_ecc_read_through_nvml_are_gpu_faults_with_their_class():
    nvml = FakeNvml([FakeGpu(), FakeGpu(), FakeGpu()])  # TEST DOUBLE: no GPU here
    nvml.gpus[0].ecc = 2
    sampler = GpuSampler(nvml)
    nvml.xid_queue.append((1, 79))
    nvml.xid_queue.append((2, 31))
    gpus = wait_until(
        lambda: (g := sampler.read()) and g[1].xid_events and g[2].xid_events and g,
        timeout=5,
        what="the XIDs through the event thread",
    )
    sampler.close()
    wire = Snapshot(
        node=NodeInfo(name="local", agent_version="t", time=0.0), host=Host(),
        gpu_status="ok", gpus=gpus,
    )  # fmt: skip
    found = {x.subject: x for x in diagnose_snapshot(wire).found}
    assert set(found) == {"local/gpu0", "local/gpu1", "local/gpu2"}
    assert found["local/gpu0"].cause == "memory"
    assert found["local/gpu1"].cause == "hardware"  # fell off the bus
    assert found["local/gpu2"].cause == "application"  # a page fault: restart it
    assert found["local/gpu1"].evidence[0].figure == "XID 79"
    assert all(x.moves == ["failover", "escalate"] for x in found.values())
    assert d.xid_class(999) == ("unclassified", "not in the recorded table: see NVIDIA's")


THROTTLE_FLEET = one_node_fleet(
    "t",
    tiny_model(8001, slo={"itl_p95_ms": 40}),
    fleet_model("free", deployment("free-vllm", "local", "vllm", 8002)),
)


@pytest.mark.parametrize(
    ("reasons", "itl_ms", "model", "found", "blind"),
    [
        (0x40 | 0x4, 95.0, "tiny", "hardware thermal slowdown", None),
        (0x1, 95.0, "tiny", None, None),  # idle is no slowdown
        (0x80, 30.0, "tiny", None, None),  # slowed, but the model within its SLO
        (0x8, 95.0, "free", None, "an ITL SLO for free"),  # no SLO: cannot tell
        (0x8, None, "tiny", None, "an ITL p95"),  # a mean only: never taken for a p95
    ],
)
def test_a_slowed_gpu_under_an_engine_over_its_itl_slo_is_a_throttled_gpu(
    reasons, itl_ms, model, found, blind
):
    """The GPU through NVML (the FakeNvml TEST DOUBLE: no GPU here) and its reasons as the
    agent decodes them; the engine's ITL p95 as its window gives it (constructed: an ITL
    that rises with the GPU's clock needs the GPU)."""
    nvml = FakeNvml([FakeGpu(reasons=reasons, temp=91, processes=[(4242, 2**30)])])
    sampler = GpuSampler(nvml)
    [gpu] = sampler.read()
    sampler.close()
    engine = "vllm-8001" if model == "tiny" else "vllm-8002"
    for proc in gpu.processes or []:
        proc.engine_id = engine  # as the agent's cycle names the owner of pid 4242
    itl = WirePercentiles(p95=None if itl_ms is None else itl_ms / 1000, mean=0.09)
    stats = WireModelStats(name=model, requests_running=4.0, latency=WireLatency(itl_s=itl))
    wire = Snapshot(
        node=NodeInfo(name="local", agent_version="t", time=0.0), host=Host(),
        gpu_status="ok", gpus=[gpu],
        engines=[Engine(id=engine, kind="vllm", state="ready", models=[stats],
                        deployment_ids=[f"{model}-vllm"])],
    )  # fmt: skip
    out = diagnose_snapshot(wire, THROTTLE_FLEET)
    throttled = [x for x in out.found if x.kind is d.THROTTLED_GPU]
    if found is None:
        assert throttled == [], [x.headline() for x in throttled]
    else:
        [x] = throttled
        assert (x.subject, x.engine, x.cause) == ("local/gpu0", engine, found)
        assert x.moves[0] == "failover"
        shown = {e.figure: e.value for e in x.evidence}
        assert shown["clock-event reasons"] == "software power cap, hardware thermal slowdown"
        assert shown["ITL p95 of tiny"] == "95.0 ms (SLO 40 ms)"
        assert shown["temperature"] == "91 C"
    needs = [c.needs for c in out.cannot_tell if c.name == "throttled_gpu"]
    assert needs == ([] if blind is None else [blind])


async def test_a_gpu_gone_after_a_restart_and_a_lost_one_are_gpu_faults(tmp_path: Path):
    """The agent's NVML sampler over the FakeNvml TEST DOUBLE (no GPU here). Three GPUs;
    the agent restarts and NVML lists two (one fell off the bus): the one not listed is a
    hardware fault, by its UUID (NVML numbers the rest anew). Replaced (a new UUID, three
    listed again): nothing. A GPU lost while the agent runs keeps its place in NVML's list
    with its reads failing: a hardware fault too."""
    from console.agent.snapshot.gpu_inventory import GpuInventory
    from console.agent.snapshot.node import NodeAgent

    fleet = parse_fleet(NODE_FLEET + "[agent]\ndiscover = false\n")
    gpus = [FakeGpu(uuid=f"GPU-{n}") for n in "abc"]

    async def snapshot_with(nvml: FakeNvml) -> Snapshot:
        agent = NodeAgent(fleet, "local", gpu=GpuSampler(nvml))
        agent.inventory = GpuInventory(tmp_path / "gpus.json")  # as JobRunner.open sets it
        try:
            await agent.cycle()
        finally:
            await agent.close()
            agent.gpu.close()
        return Snapshot.model_validate_json(agent.latest_json())

    first = await snapshot_with(FakeNvml(gpus))
    assert first.gpus_gone == [] and diagnose_snapshot(first).found == []
    after = await snapshot_with(FakeNvml([gpus[0], gpus[2]]))  # GPU-b fell off the bus
    assert [g.uuid for g in after.gpus_gone] == ["GPU-b"] and after.gpus_gone[0].index == 1
    [fault] = diagnose_snapshot(after).found
    assert (fault.kind, fault.subject, fault.cause) == (d.GPU_FAULT, "local/GPU-b", "hardware")
    shown = {e.figure: e.value for e in fault.evidence}
    assert shown["GPUs listed"] == "2 of the 3 the node had", shown
    assert shown["not listed: GPU 1"] == "NVIDIA H200 GPU-b", shown
    assert fault.moves == ["failover", "escalate"]
    replaced = await snapshot_with(FakeNvml([gpus[0], FakeGpu(uuid="GPU-new"), gpus[2]]))
    assert replaced.gpus_gone == [] and diagnose_snapshot(replaced).found == []
    lost = FakeNvml([gpus[0], FakeGpu(uuid="GPU-new", lost=True), gpus[2]])
    [fault] = diagnose_snapshot(await snapshot_with(lost)).found
    assert (fault.subject, fault.cause) == ("local/gpu1", "hardware"), fault.evidence
    assert "GPU is lost" in fault.evidence[0].value


def test_the_escalation_commands_are_typed_on_the_node_or_through_its_ssh_quoted():
    """`e` in the console and `engineroom diagnose` give the same commands
    (d.escalation_commands): as typed on the node where fleet.toml gives it no ssh, else
    through `ssh -t` with its port; a target a shell would split is quoted."""
    x = Diagnosis(d.GPU_FAULT, "local/gpu0", "local", [], cause="memory")
    assert move_hint(parse_fleet(NODE_FLEET), x, "escalate") == (
        "  (on local: nvidia-smi -q ; sudo nvidia-bug-report.sh)"
    )
    for ssh, target in [("ops@10.0.0.7", "ops@10.0.0.7"), ("ops@a b;c", "'ops@a b;c'")]:
        node = {"name": "local", "ssh": ssh, "ssh_port": 2222}
        fleet = parse_fleet(fleet_toml(fleet={"name": "t"}, nodes=[node]))
        assert move_hint(fleet, x, "escalate") == (
            f"  (on local: ssh -t -p 2222 {target} nvidia-smi -q ; "
            f"ssh -t -p 2222 {target} sudo nvidia-bug-report.sh)"
        )


def test_an_engine_that_counts_no_tokens_cannot_tell_if_it_is_wedged():
    """trtllm-serve before 1.3 counts no tokens: requests in, never 'wedged', and never
    silent: 'cannot tell: needs a generated-token counter'. Triton counts none either; it is
    judged by its finished requests instead (the Triton stall), and where even those are
    unknown it says so."""
    model = WireModelStats(name="ensemble", requests_running=3.0, requests_waiting=1.0)
    engines = [
        Engine(id="triton-8000", kind="triton", state="ready", models=[model]),
        Engine(id="trtllm-8001", kind="trtllm", state="ready", models=[model]),
    ]
    wire = Snapshot(
        node=NodeInfo(name="local", agent_version="t", time=0.0), host=Host(),
        gpu_status="ok", engines=engines,
    )  # fmt: skip
    out = diagnose_snapshot(wire)
    assert out.found == []
    assert [(c.name, c.subject, c.needs) for c in out.cannot_tell] == [
        ("triton_stall", "local/triton-8000", "a finished-request counter"),
        ("engine_wedged", "local/trtllm-8001", "a generated-token counter"),
    ]


def test_an_engine_serving_a_model_under_its_engine_name_is_judged_as_the_declared_model():
    """A Triton deployment's engine reports its `engine_model` ("ensemble"), not the
    model's name: the model's own threshold applies, and the diagnosis names the declared
    model (the failover plan opens for it)."""
    trt = deployment("tiny-trt", "local", "triton", 8000, engine_model="ensemble")
    text = one_node_fleet("t", fleet_model("tiny", trt, diagnoses={"kv_pressure_usage": 0.5}))
    model = WireModelStats(name="ensemble", kv_cache_usage=0.6, preemption_rate=0.3)
    engine = Engine(id="triton-8000", kind="triton", state="ready", models=[model],
                    deployment_ids=["tiny-trt"])  # fmt: skip
    wire = Snapshot(
        node=NodeInfo(name="local", agent_version="t", time=0.0), host=Host(),
        gpu_status="ok", engines=[engine],
    )  # fmt: skip
    found = [x for x in diagnose_snapshot(wire, text).found if x.kind is d.KV_PRESSURE]
    assert [(x.model, x.deployment, x.subject) for x in found] == [
        ("tiny", "tiny-trt", "local/triton-8000")
    ]
    # The fleet's default (0.9) would not have raised it: the model's own 0.5 did.
    assert not diagnose_snapshot(wire, text.replace("kv_pressure_usage = 0.5", "")).found


def test_a_diagnosis_back_after_it_was_resolved_is_a_new_one_not_the_old_move_failing():
    """Wedged, failed over, resolved; wedged again later: that is active again (a new
    incident to look at), not "still there 188 s after failover" (the incident drill
    bench's second round read so)."""
    fleet = parse_fleet(NODE_FLEET)
    diagnoser = Diagnoser(fleet)

    def look(stalled: float, at: float) -> list[Diagnosis]:
        model = WireModelStats(name="tiny", requests_running=1.0, generation_stalled_s=stalled)
        engine = Engine(id="vllm-8000", kind="vllm", state="ready", models=[model])
        wire = Snapshot(
            node=NodeInfo(name="local", agent_version="t", time=time.time()), host=Host(),
            gpu_status="ok", engines=[engine],
        )  # fmt: skip
        snap = decode_snapshot(wire.model_dump_json())
        states = {"local": NodeState("local", "agent", snapshot=snap, last_ok=time.monotonic())}
        return diagnoser.update(build(fleet, states, 1.0), states, None, at)

    t = 1_000_000.0
    [first] = look(30.0, t)
    diagnoser.moved(first.key, "failover", t + 1)
    assert [x.state for x in look(30.0, t + 2)] == ["verifying"]
    assert [(x.state, x.detail) for x in look(0.0, t + 10)] == [
        ("resolved", "resolved 9 s after failover")
    ]
    [again] = look(30.0, t + 200)
    assert (again.state, again.detail, again.since) == ("active", "", t + 200)


def test_a_held_class_raised_at_the_first_look_stays_raised_at_the_next():
    """A replica imbalance already there when the console starts is raised at once (as
    an alert active at start); the next look must not take it back until its 60 s hold
    passed (the quarantine key's test waited 30 s on this)."""
    fleet = parse_fleet(NODE_FLEET)
    diagnoser = Diagnoser(fleet)
    x = Diagnosis(d.REPLICA_IMBALANCE, "tiny/b", "local", [], model="tiny", deployment="b")
    t = 1_000_000.0
    for at in (t, t + 1, t + 2):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(diagnoses, "find", lambda *a, **k: ([x], []))
            view, states = build(fleet, {}, 1.0), {}
            assert [y.key for y in diagnoser.update(view, states, None, at)] == [x.key], at
    with pytest.MonkeyPatch.context() as patch:  # gone, then back: a new one, held again
        patch.setattr(diagnoses, "find", lambda *a, **k: ([], []))
        assert diagnoser.update(build(fleet, {}, 1.0), {}, None, t + 3) == []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(diagnoses, "find", lambda *a, **k: ([x], []))
        assert diagnoser.update(build(fleet, {}, 1.0), {}, None, t + 4) == []


def test_a_hold_survives_one_missed_look_but_not_a_longer_gap():
    """The API server's CPU is read once per agent cycle and dips under a saturated load
    (43 % once among 91-98 %): one look without the condition keeps its 30 s hold; a gap
    longer than HOLD_GAP_S starts the hold again."""
    fleet = parse_fleet(NODE_FLEET)
    diagnoser = Diagnoser(fleet)
    x = Diagnosis(d.API_SERVER_SATURATED, "tiny/b", "local", [], model="tiny", deployment="b")
    t = 1_000_000.0

    def look(at: float, there: bool) -> list[tuple[str, str]]:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(diagnoses, "find", lambda *a, **k: ([x] if there else [], []))
            return [y.key for y in diagnoser.update(build(fleet, {}, 1.0), {}, None, at)]

    assert look(t, False) == []  # the first look: nothing to raise at once
    assert look(t + 2, True) == []
    assert look(t + 20, True) == []
    assert look(t + 22, False) == []  # one dip, within HOLD_GAP_S
    assert look(t + 24, True) == []
    assert look(t + 32, True) == [x.key]  # held 30 s from t + 2, through the dip
    assert look(t + 34, False) == []  # raised, then gone: it must hold again
    assert look(t + 36, True) == []
    assert look(t + 36 + HOLD_GAP_S + 1, False) == []  # missed longer than the gap
    assert look(t + 60, True) == []
    assert look(t + 80, True) == []  # 20 s since it came back, not 44 s since t + 36
    assert look(t + 91, True) == [x.key]


def test_a_moved_diagnosis_stays_verifying_while_its_restart_job_runs():
    """Restarted through its agent: while the job is under way the finder passes over the
    engine (expected work), which is no proof the wedge went: verifying until the job
    ended and the engine generates again, then resolved."""
    fleet = parse_fleet(NODE_FLEET)
    diagnoser = Diagnoser(fleet)

    def look(stalled: float, restarting: bool, at: float) -> list[Diagnosis]:
        model = WireModelStats(name="tiny", requests_running=1.0, generation_stalled_s=stalled)
        engine = Engine(id="vllm-8000", kind="vllm", state="ready", models=[model])
        job = Job(id="j1", kind="engine.restart", state="running" if restarting else
                  "succeeded", params={"engine": "vllm-8000"})  # fmt: skip
        wire = Snapshot(
            node=NodeInfo(name="local", agent_version="t", time=time.time()), host=Host(),
            gpu_status="ok", engines=[engine], jobs=[job],
        )  # fmt: skip
        snap = decode_snapshot(wire.model_dump_json())
        states = {"local": NodeState("local", "agent", snapshot=snap, last_ok=time.monotonic())}
        return diagnoser.update(build(fleet, states, 1.0), states, None, at)

    t = 1_000_000.0
    [wedged] = look(30.0, False, t)
    diagnoser.moved(wedged.key, "restart", t + 1)
    [during] = look(30.0, True, t + 20)
    assert (during.state, during.detail) == (
        "verifying",
        "verifying restart (19 s): its job is under way",
    )
    assert [(x.state, x.detail) for x in look(0.0, False, t + 60)] == [
        ("resolved", "resolved 59 s after restart")
    ]


def test_expected_work_raises_no_diagnosis():
    """A stalled engine with a job under way on it (a restart's stop, say) is expected
    work; a loading one is a cold start."""
    stalled = WireModelStats(
        name="m", requests_running=1.0, requests_waiting=0.0, generation_stalled_s=60.0
    )
    engine = Engine(id="vllm-8000", kind="vllm", state="ready", models=[stalled])
    wire = Snapshot(
        node=NodeInfo(name="local", agent_version="t", time=0.0), host=Host(),
        gpu_status="ok", engines=[engine],
    )  # fmt: skip
    assert [x.kind.name for x in diagnose_snapshot(wire).found] == ["engine_wedged"]
    wire.jobs = [
        Job(id="j1", kind="engine.restart", state="running", params={"engine": "vllm-8000"})
    ]
    assert diagnose_snapshot(wire).found == []
    wire.jobs, engine.state = [], "loading"
    assert diagnose_snapshot(wire).found == []


@pytest.mark.parametrize(
    ("slow", "others", "named", "count"),
    [
        (0.400, [0.100, 0.110], True, 20.0),  # 4x and 0.3 s over: named
        (0.400, [0.100, 0.110], True, None),  # a count not known: compared
        (0.400, [0.100, 0.110], False, 19.0),  # 19 samples in the window: no p95 to judge
        (0.012, [0.005, 0.006], False, 50.0),  # 2x, but 6.5 ms: noise on a tiny model
        (0.150, [0.100, 0.110], False, 50.0),  # 50 ms over, but under 2x
    ],
)
def test_replica_imbalance_names_the_slow_one_only_when_it_matters(slow, others, named, count):
    p95s = [slow, *others]
    rows = [
        DeploymentRow(
            model="m", id=f"d{i}", node="local", engine="vllm", engine_id=f"e{i}",
            version=None, state="ready", reason=None, weight=1,
            stats=SnapModelStats(
                name="m",
                latency=Latency(ttft_s=Percentiles(p95=p95, source="histogram", count=count)),
            ),
        )
        for i, p95 in enumerate(p95s)
    ]  # fmt: skip
    fleet = parse_fleet(NODE_FLEET)
    node = diagnose_engines.Node("local", None, 1.0, set())  # type: ignore[arg-type]
    found = diagnose_fleet.imbalance(fleet, {"local": node}, "m", rows)
    assert [x.subject for x in found] == (["m/d0"] if named else [])


def test_an_agents_hostile_text_reaches_the_terminal_and_markdown_only_through_the_sanitizer():
    """Engine ids and errors come from the agents: outside text. A failed start's error
    carrying an escape sequence and a Markdown table break prints neither."""
    hostile = "vllm-8000\x1b[2J\x1b]0;owned\x07|x"
    job = Job(
        id="j1", kind="vllm.start", state="failed", created=time.time(), updated=time.time(),
        error="load: \x1b[31mboom\x1b[0m | not | a | cell\nsecond line",
        result={"engine_id": hostile, "log_tail": ["Address already in use"]},
    )  # fmt: skip
    wire = Snapshot(
        node=NodeInfo(name="local", agent_version="t", time=0.0), host=Host(),
        gpu_status="ok", jobs=[job],
    )  # fmt: skip
    fleet = parse_fleet(NODE_FLEET)
    wire.node.time = time.time()
    snap = decode_snapshot(wire.model_dump_json())
    states = {"local": NodeState("local", "agent", snapshot=snap, last_ok=time.monotonic())}
    view = build(fleet, states, 1.0)
    found = Diagnosed(*diagnose_once(fleet, view, states))
    assert [x.cause for x in found.found] == ["port in use"]
    text = render_text(view, found, None, fleet)
    assert "\x1b" not in text and "\x07" not in text and "start failed" in text
    table = render_markdown(view, found).splitlines()
    row = next(line for line in table if "start failed" in line)
    assert "\x1b" not in row and row.count(" | ") == 4, row  # five cells, no more


def test_an_agents_hostile_numbers_and_names_in_exits_and_gone_gpus_break_nothing():
    """Exit times and a gone GPU come from the agents too: times no clock can give cost
    their reading (never the look), and a gone GPU's name and UUID reach the text only
    through the sanitizer."""
    now = time.time()
    engine = Engine(id="vllm-8000", kind="vllm", state="down", pid=77,
                    deployment_ids=["tiny-vllm"], exits=[-1e308, 1e308, now - 5])  # fmt: skip
    gone = GoneGpu(uuid="GPU-\x1b]0;owned\x07x", index=3, name="H200\x1b[2J", last_seen=1e308)
    wire = Snapshot(
        node=NodeInfo(name="local", agent_version="t", time=now), host=Host(),
        gpu_status="ok", engines=[engine], gpus_gone=[gone],
    )  # fmt: skip
    fleet_text = one_node_fleet("t", tiny_model(8000))
    fleet = parse_fleet(fleet_text)
    snap = decode_snapshot(wire.model_dump_json())
    states = {"local": NodeState("local", "agent", snapshot=snap, last_ok=time.monotonic())}
    view = build(fleet, states, 1.0)
    found = Diagnosed(*diagnose_once(fleet, view, states))
    crash = next(x for x in found.found if x.kind is d.CRASH_LOOP)
    assert crash.cause == "exited, not back" and crash.evidence[0].value.startswith("1 (")
    assert any(x.kind is d.GPU_FAULT for x in found.found)
    text = render_text(view, found, None, fleet) + render_markdown(view, found)
    assert "\x1b" not in text and "\x07" not in text and "crash loop" in text


# -- a saturated API server: constructed figures (made on real vLLM in bench.diagnose_time only) --

SATURATED_FLEET = one_node_fleet("t", tiny_model(8000, slo={"ttft_p95_ms": 500}))


@pytest.mark.parametrize(
    ("engine_p95", "client_p95", "cpu", "named", "blind"),
    [
        (0.2, 1.0, 95.0, True, False),  # clients wait 5x, the API server at 95 % of a core
        (0.2, 1.0, 50.0, False, False),  # the process well under a core: not its API server
        (0.2, 0.5, 95.0, False, False),  # 2.5x: under saturated_gap_times (3)
        (0.6, 3.0, 95.0, False, False),  # the engine itself over its 500 ms SLO
        (0.2, 1.0, None, False, True),  # its CPU not read: cannot tell, never a guess
    ],
)
def test_clients_waiting_far_longer_than_the_engine_with_its_api_server_busy_is_saturation(
    engine_p95, client_p95, cpu, named, blind
):
    """The gateway's TTFT p95 against the engine's own, with the API server's process CPU
    from the agent: named on the deployment, a standby first; a figure not read is
    `cannot tell`. (A real saturated API server is made in bench.diagnose_time, not in the
    suite, where other processes share its core: docs/diagnoses.md.)"""
    stats = WireModelStats(
        name="tiny",
        latency=WireLatency(ttft_s=WirePercentiles(p95=engine_p95, count=50, source="histogram")),
    )
    engine = Engine(id="vllm-8000", kind="vllm", state="ready", models=[stats],
                    deployment_ids=["tiny-vllm"], api_server_cpu_pct=cpu)  # fmt: skip
    wire = Snapshot(
        node=NodeInfo(name="local", agent_version="t", time=time.time()), host=Host(),
        gpu_status="ok", engines=[engine],
    )  # fmt: skip
    gateway = GatewayView(
        models={"tiny": {"tiny-vllm": GatewayDeployment(
            model="tiny", id="tiny-vllm", weight=100, up=True,
            ttft_s=GatewayPercentiles(p95=client_p95, count=50),
        )}}
    )  # fmt: skip
    fleet = parse_fleet(SATURATED_FLEET)
    snap = decode_snapshot(wire.model_dump_json())
    states = {"local": NodeState("local", "agent", snapshot=snap, last_ok=time.monotonic())}
    found, cannot = diagnose_once(
        fleet, build(fleet, states, 1.0, gateway=gateway), states, gateway
    )
    saturated = [x for x in found if x.kind is d.API_SERVER_SATURATED]
    assert [(x.subject, x.deployment, x.moves[0]) for x in saturated] == (
        [("tiny/tiny-vllm", "tiny-vllm", "standby")] if named else []
    )
    if named:
        shown = {e.figure: e.value for e in saturated[0].evidence}
        assert shown["API server CPU"] == "95% of a core", shown
    said = [(c.name, c.needs) for c in cannot if c.name == d.API_SERVER_SATURATED.name]
    assert said == ([("api_server_saturated", "the API server's CPU")] if blind else [])
