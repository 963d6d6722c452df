"""TensorRT-LLM's two backends (issue 31). The engine backend serves an engine that
trtllm-build compiled; the PyTorch backend loads the checkpoint with no build. The engine
backend is gone from every release after 1.3.0rc20 (console.core.drills.trtllm_releases). So
what a change costs a deployment depends on its backend: a rebuild, or a re-validation.
And a drill of the engine pipeline planned against a release without it is refused by
name. TensorRT-LLM cannot run here: the agent's version probe is the TEST DOUBLE's
(console/sim/trtllm_double.py)."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from console.agent.drills.manifest import WeightsHasher
from console.cli import main as cli
from console.commands import drill as drill_command
from console.core.config.load import ConfigError, load_fleet, parse_fleet
from console.core.drills.trtllm_releases import has_engine_backend
from console.core.rollouts.planner import Ask, Refused, make_plan
from console.sim import trtllm_double
from tests.conftest import OPERATOR, VIEWER
from tests.engines.servers import free_port, wait_until
from tests.support.fleet import tiny_model, trtllm_deployments, watched_fleet

NEXT = "1.3.0rc21"  # a release after 1.3.0rc20, the last with the engine backend


def test_the_engine_backend_ends_after_1_3_0rc20() -> None:
    for version in ("1.2.0", "1.2.1", "1.2.0rc6.post3", "1.3.0rc1", "1.3.0rc20"):
        assert has_engine_backend(version) is True, version
    for version in (NEXT, "1.3.0rc21.dev0", "1.3.0", "1.4.0rc0", "2.0.0"):
        assert has_engine_backend(version) is False, version
    assert has_engine_backend("nightly") is None  # not a version: not judged


# -- fleet.toml: a drill is checked against the release it pins --------------------------

FLEET = """[fleet]
name = "backends"

[[nodes]]
name = "gpu-a1"
agent = "http://127.0.0.1:9"

[[models]]
name = "llama"
  [[models.deployments]]
  id = "llama-trt"
  node = "gpu-a1"
  engine = "trtllm"
  endpoint = "http://127.0.0.1:8000"
  [[models.deployments]]
  id = "llama-vllm"
  node = "gpu-a1"
  engine = "vllm"
  endpoint = "http://127.0.0.1:8001"

[drills.llama-rebuild]
model = "llama"
deployment = "llama-trt"
checkpoint = "/models/llama"
pipeline = "{pipeline}"
precision = "{precision}"
{pins}
{steps}"""


def drill_fleet(
    pipeline: str = "engine", precision: str = "bf16", release: str | None = None, steps: str = ""
) -> str:
    pins = f'pins = {{ tensorrt_llm = "{release}" }}' if release else ""
    return FLEET.format(pipeline=pipeline, precision=precision, pins=pins, steps=steps)


def refusal(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_fleet(text)
    return str(info.value)


def test_an_engine_drill_pinned_to_a_release_without_the_engine_backend_is_refused() -> None:
    assert refusal(drill_fleet(release=NEXT)) == (
        'fleet.toml:25: drills.llama-rebuild.pipeline: pipeline "engine" needs trtllm-build, '
        f"which TensorRT-LLM {NEXT} no longer has (the engine backend was removed after "
        '1.3.0rc20; use pipeline = "pytorch")'
    )
    for release in ("1.2.1", "1.3.0rc20"):  # still have it
        assert parse_fleet(drill_fleet(release=release)).drills["llama-rebuild"].pins
    assert parse_fleet(drill_fleet(pipeline="pytorch", release=NEXT)).drills


def test_a_pytorch_drill_is_refused_only_where_a_step_runs_a_removed_tool() -> None:
    # A quantized precision runs quantize.py, which went with the engine backend.
    error = refusal(drill_fleet("pytorch", "fp8", NEXT))
    assert "drills.llama-rebuild.precision:" in error
    assert f'precision "fp8" quantizes with quantize.py, which TensorRT-LLM {NEXT} no ' in error
    assert parse_fleet(drill_fleet("pytorch", "fp8", "1.2.1")).drills  # 1.2 has it
    # A convert step of its own (ModelOpt's export, say) runs nothing that is gone...
    own = '  [drills.llama-rebuild.steps.convert]\n  argv = ["python3", "hf_ptq.py"]\n'
    assert parse_fleet(drill_fleet("pytorch", "fp8", NEXT, own)).drills
    # ...unless it is one of the removed tools, named with its step.
    old = '  [drills.llama-rebuild.steps.convert]\n  argv = ["/opt/examples/quantize.py"]\n'
    error = refusal(drill_fleet("pytorch", "fp8", NEXT, old))
    assert f"drills.llama-rebuild.steps.convert: runs quantize.py, which TensorRT-LLM {NEXT}" in (
        error
    )


def test_a_rollout_of_engine_drills_onto_a_release_without_the_engine_backend_is_refused() -> None:
    fleet = parse_fleet(drill_fleet())
    ask = Ask("drill", deployments=["llama-trt"], what_if={"tensorrt_llm": NEXT})
    with pytest.raises(Refused) as info:
        make_plan(fleet, ask)
    assert info.value.problems == [
        "model llama: deployment llama-trt on node gpu-a1 (trtllm): drill llama-rebuild: "
        f'pipeline "engine" needs trtllm-build, which TensorRT-LLM {NEXT} no longer has '
        '(the engine backend was removed after 1.3.0rc20; use pipeline = "pytorch")'
    ]
    made = make_plan(fleet, Ask("drill", deployments=["llama-trt"], what_if={"driver": "590"}))
    assert [s.drill for w in made.waves for s in w.steps] == ["llama-rebuild"]
    pytorch = parse_fleet(drill_fleet(pipeline="pytorch"))
    assert make_plan(pytorch, ask).waves


def test_a_planned_drill_says_what_it_costs_its_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for pipeline, cost in (("engine", "(engine backend: rebuild)"),
                           ("pytorch", "(pytorch backend: re-validate, no build)")):  # fmt: skip
        fleet = tmp_path / f"{pipeline}.toml"
        fleet.write_text(drill_fleet(pipeline=pipeline))
        argv = ["rollout", "plan", "--drill", "--deployment", "llama-trt", "--fleet", str(fleet)]
        assert cli(argv) == 0
        row = next(line for line in capsys.readouterr().out.splitlines() if "llama-trt" in line)
        assert row.endswith(f"drill 'llama-rebuild' {cost} (canary)"), row


# -- the agent: each deployment's backend, and what a change costs it -------------------

AGENT_DRILL = """
[drills.{name}]
model = "tiny"
deployment = "{deployment}"
pipeline = "{pipeline}"
checkpoint = "{checkpoint}"
engine_cache = "{cache}"
serve_port = {serve_port}
env = {{ TRTLLM_DOUBLE_VERSION = "{version}" }}
  [drills.{name}.steps.preflight]
  argv = ["{python}", "{double}", "versions"]
"""


def manifest(pipeline: str, weights: str, checkpoint: Path) -> dict:
    """The manifest a drill writes (console.agent.drills.job), built on the node the TEST
    DOUBLE's version probe describes by default."""
    node = {key: default for key, (_, default) in trtllm_double.VERSIONS.items()}
    return {
        "schema": 1,
        "build_key": f"{pipeline}-0123456789abcdef",
        "pipeline": pipeline,
        "precision": "bf16",
        "tp_size": 1,
        "shapes": {"max_batch_size": 8},
        "versions": {k: node[k] for k in ("tensorrt_llm", "tensorrt", "cuda", "driver")},
        "gpu": {"name": node["gpu"], "compute_capability": node["compute_capability"]},
        "model": {"name": "tiny", "checkpoint": str(checkpoint), "weights_sha256": weights},
    }


@pytest.fixture
def backends(tmp_path: Path, agent_factory: Callable[..., object], monkeypatch) -> Path:
    """An agent with an engine-backend deployment, a PyTorch-backend one (both built on
    the node as it is) and one whose drill's node runs a release after 1.3.0rc20."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "model.safetensors").write_bytes(b"weights" * 64)
    weights = WeightsHasher(tmp_path / "hashes.json").hash(checkpoint)
    engines = tmp_path / "engines"
    for dep, pipeline in (("trt-engine", "engine"), ("trt-torch", "pytorch")):
        (engines / dep).mkdir(parents=True)
        built = manifest(pipeline, weights, checkpoint)
        (engines / dep / "engineroom-manifest.json").write_text(json.dumps(built))
    port = free_port()
    engine_dirs = {"trt-engine": engines / "trt-engine", "trt-torch": engines / "trt-torch"}
    trt = trtllm_deployments({**engine_dirs, "trt-next": None})
    text = watched_fleet("backends", port, tmp_path / "state", "T_VIEW", tiny_model(9, *trt))
    for name, deployment, pipeline, version in (
        ("engine-drill", "trt-engine", "engine", "1.2.0"),
        ("torch-drill", "trt-torch", "pytorch", "1.2.0"),
        ("next-drill", "trt-next", "engine", NEXT),  # unpinned: only its probe can tell
    ):
        text += AGENT_DRILL.format(
            name=name,
            deployment=deployment,
            pipeline=pipeline,
            checkpoint=checkpoint,
            cache=tmp_path / "cache",
            serve_port=free_port(),
            version=version,
            python=sys.executable,
            double=trtllm_double.__file__,
        )
    agent = agent_factory(text, "local", port)
    monkeypatch.setenv("T_VIEW", VIEWER)
    return agent.fleet  # type: ignore[attr-defined,no-any-return]


def what_if(fleet_file: Path, **change: str) -> dict[str, dict]:
    out = io.StringIO()
    assert drill_command.what_if(load_fleet(fleet_file), change, as_json=True, out=out) == 0
    return {row["deployment"]: row for row in json.loads(out.getvalue())}


def test_what_if_names_each_backend_and_what_a_change_costs_it(
    backends: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = what_if(backends, driver="590.10")
    assert {d: (r["backend"], r["verdict"]) for d, r in rows.items()} == {
        "trt-engine": ("engine", "rebuild"),
        "trt-torch": ("pytorch", "re-validate"),  # no build; validated, caches cold
        "trt-next": ("engine", "unknown"),  # its drill says the backend; no manifest
    }
    assert rows["trt-torch"]["why"] == ["driver 580.159.04 → 590.10"]

    # TensorRT is no part of the PyTorch backend: a TensorRT upgrade leaves it serving.
    rows = what_if(backends, tensorrt="10.99")
    assert rows["trt-engine"]["verdict"] == "rebuild"
    assert rows["trt-torch"]["verdict"] == "serves"

    # A release without the engine backend: the engine deployment's drill must change.
    rows = what_if(backends, tensorrt_llm=NEXT)
    assert rows["trt-torch"]["verdict"] == "re-validate"
    assert rows["trt-engine"]["verdict"] == "rebuild"
    assert rows["trt-engine"]["why"] == [
        f"TensorRT-LLM 1.2.0 → {NEXT}",
        f"TensorRT-LLM {NEXT} has no engine backend (removed after 1.3.0rc20): its drill "
        'must move to pipeline = "pytorch"',
    ]

    table = io.StringIO()
    fleet = load_fleet(backends)
    assert drill_command.what_if(fleet, {"driver": "590.10"}, as_json=False, out=table) == 0
    lines = table.getvalue().splitlines()
    torch_row = next(line for line in lines if "trt-torch" in line)
    assert "pytorch" in torch_row and "RE-VALIDATE" in torch_row and "REBUILD" not in torch_row
    assert "1 rebuild(s), about 0 s of drills plus 1 never drilled" in lines
    assert "1 re-validation(s), about 0 s of drills plus 1 never drilled" in lines

    # A rollout's --what-if plans the re-validations with the rebuilds.
    plan = ["rollout", "plan", "--restart", "--what-if", "--driver", "590.10"]
    assert cli([*plan, "--fleet", str(backends), "--json"]) == 0
    steps = [s for w in json.loads(capsys.readouterr().out)["waves"] for s in w["steps"]]
    assert {s["deployment"] for s in steps} == {"trt-engine", "trt-torch"}


def test_the_live_check_says_each_deployments_backend(backends: Path) -> None:
    fleet = load_fleet(backends)

    def engines() -> dict[str, dict]:
        headers = {"Authorization": f"Bearer {VIEWER}"}
        url = fleet.nodes[0].agent + "/v1/snapshot"  # type: ignore[operator]
        found = httpx.get(url, headers=headers, timeout=10).json()["trt_engines"]
        return {e["deployment"]: e for e in found}

    wait_until(lambda: len(engines()) == 3, timeout=30, what="the staleness check")
    found = engines()
    assert {d: (e["backend"], e["state"]) for d, e in found.items()} == {
        "trt-engine": ("engine", "current"),
        "trt-torch": ("pytorch", "current"),
        "trt-next": ("engine", "unknown"),
    }


def test_an_unpinned_engine_drill_is_refused_by_its_preflight_on_a_release_without_it(
    backends: Path,
) -> None:
    url = load_fleet(backends).nodes[0].agent
    headers = {"Authorization": f"Bearer {OPERATOR.split(':')[1]}"}
    resp = httpx.post(
        f"{url}/v1/jobs", json={"kind": "drill.run", "drill": "next-drill"}, headers=headers
    )
    assert resp.status_code == 202, resp.text
    job: dict = {}

    def ended() -> bool:
        job.update(httpx.get(f"{url}/v1/jobs/{resp.json()['id']}", headers=headers).json())
        return job["state"] in ("succeeded", "failed", "cancelled")

    wait_until(ended, timeout=60, what="the drill's end")
    assert job["state"] == "failed"
    assert job["error"] == (
        f'preflight: drill next-drill: pipeline "engine" needs trtllm-build, which '
        f"TensorRT-LLM {NEXT} no longer has (the engine backend was removed after 1.3.0rc20; "
        'use pipeline = "pytorch")'
    )
    assert [s["state"] for s in job["steps"]] == ["failed"] + ["skipped"] * 5  # nothing ran
