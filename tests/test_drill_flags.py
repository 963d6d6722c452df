"""The drill templates speak TensorRT-LLM 1.2: every flag a shipped template passes to
convert_checkpoint.py, quantize.py, trtllm-build or trtllm-serve is one that release's own
argument parser has. TensorRT-LLM cannot run here, so the parsers' flag names were read
from its published source and recorded (tests/fixtures/trtllm-1.2-flags.json, with the
file and commit of each)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from console.agent.drill_plan import PRECISIONS, templates
from console.core.config import Drill

RECORDED = json.loads((Path(__file__).parent / "fixtures" / "trtllm-1.2-flags.json").read_text())


def known_flags(tool: str) -> set[str]:
    entry = RECORDED["tools"][tool]
    return set(entry["flags"]) | set(entry.get("plugin_flags", []))


TOOLS = {
    "trtllm-build": "trtllm-build",
    "trtllm-serve": "trtllm-serve",
    "quantize.py": "quantize.py",
    "convert_checkpoint.py": "convert_checkpoint.py (llama)",
}


def tool_of(argv: list[str]) -> tuple[str, int] | None:
    """Which recorded TensorRT-LLM tool an argv runs, and where its arguments start (a
    wrapper such as the serve step's link-and-exec may come first); None: none of them."""
    for i, part in enumerate(argv[:8]):
        if (tool := TOOLS.get(part.rsplit("/", 1)[-1])) is not None:
            return tool, i + 1
    return None


def unknown_flags(argv: list[str]) -> list[str]:
    """The --flags in `argv` that its tool does not have in the recorded release."""
    found = tool_of(argv)
    if found is None:
        return []
    tool, start = found
    flags = [p[2:].split("=", 1)[0] for p in argv[start:] if p.startswith("--")]
    return [f"{tool}: --{flag}" for flag in flags if flag not in known_flags(tool)]


CASES = [
    (pipeline, precision)
    for pipeline in get_args(Drill.model_fields["pipeline"].annotation)
    for precision in PRECISIONS
]


@pytest.mark.parametrize(("pipeline", "precision"), CASES, ids=[f"{p}-{q}" for p, q in CASES])
def test_every_template_flag_exists_in_tensorrt_llm_1_2(pipeline, precision):
    drill = Drill.model_validate(
        {
            "model": "llama",
            "deployment": "llama-trt",
            "checkpoint": "/models/llama",
            "pipeline": pipeline,
            "precision": precision,
        }
    )
    steps = templates(drill)
    run = {name: t.argv for name, t in steps.items() if t.argv is not None}
    # Every step but the version probe runs one of the recorded tools: none goes unchecked.
    assert {name for name, argv in run.items() if tool_of(argv) is None} == {"preflight"}
    assert [bad for argv in run.values() for bad in unknown_flags(argv)] == []


def test_a_flag_the_release_lacks_is_caught():
    # trtllm-serve 1.2 has no --served_model_name (it names the model after its MODEL
    # directory); the serve template passed it until this check.
    argv = ["trtllm-serve", "{engine_dir}", "--port", "{port}", "--served_model_name", "x"]
    assert unknown_flags(argv) == ["trtllm-serve: --served_model_name"]
    assert unknown_flags(["python3", "-c", "print(1)", "--anything"]) == []


def test_each_recorded_tool_names_its_source():
    assert RECORDED["repo"] == "NVIDIA/TensorRT-LLM" and RECORDED["release"] == "1.2"
    for tool, entry in RECORDED["tools"].items():
        assert len(entry["commit"]) == 40 and entry["file"], tool
        assert entry["flags"] == sorted(set(entry["flags"])), f"{tool}: sorted, no repeats"


def test_the_candidate_serves_a_directory_named_after_the_model(tmp_path):
    """Without --served_model_name, trtllm-serve advertises its MODEL directory's name: the
    serve step links {served_dir} (named after the model) to the engine, then execs."""
    from console.agent.drill_plan import plan, values

    drill = Drill.model_validate(
        {"model": "llama", "deployment": "llama-trt", "checkpoint": "/models/llama"}
    )
    engine = tmp_path / "stage" / "engine"
    engine.mkdir(parents=True)
    serve = plan(drill, values(drill, "llama-3.1-8b", engine, engine, engine))["serve"].argv
    assert serve is not None
    tool = tool_of(serve)
    assert tool is not None and tool[0] == "trtllm-serve"
    served_dir = serve[tool[1]]
    assert Path(served_dir).name == "llama-3.1-8b"
    # Run the link-and-exec prefix for real, with a stand-in for trtllm-serve that reports
    # what its MODEL argument resolves to; twice, as a re-run drill's serve step would.
    report = "import os, sys; print(os.path.realpath(sys.argv[1]))"
    for _ in range(2):
        argv = [*serve[: tool[1] - 1], sys.executable, "-c", report, served_dir]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
        assert out.stdout.strip() == str(engine.resolve())
