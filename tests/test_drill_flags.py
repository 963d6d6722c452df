"""The drill templates speak TensorRT-LLM 1.2: every flag a shipped template passes to
convert_checkpoint.py, quantize.py, trtllm-build or trtllm-serve is one that release's own
argument parser has. TensorRT-LLM cannot run here, so the parsers' flag names were read
from its published source and recorded (tests/fixtures/trtllm-1.2-flags.json, with the
file and commit of each). Releases after 1.3.0rc20 have no engine backend: what their
trtllm-serve takes, and the tools they no longer have, are recorded the same way
(tests/fixtures/trtllm-main-flags.json); a drill against one either runs only what it
has, or is refused when it is planned (console.core.drills.trtllm_releases)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from console.agent.drills.plan import PRECISIONS, templates
from console.core.config.load import Drill
from console.core.drills.trtllm_releases import (
    ENGINE_BACKEND_LAST,
    GONE_WITH_ENGINE_BACKEND,
    drill_release_problems,
)

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = json.loads((FIXTURES / "trtllm-1.2-flags.json").read_text())
AFTER_ENGINE = json.loads((FIXTURES / "trtllm-main-flags.json").read_text())
# A version each record stands for: 1.3.0rc21 is any release after 1.3.0rc20.
RECORDS = {"1.2.0": RECORDED, "1.3.0rc21": AFTER_ENGINE}


def known_flags(tool: str, record: dict = RECORDED) -> set[str]:
    entry = record["tools"][tool]
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


def unknown_flags(argv: list[str], record: dict = RECORDED) -> list[str]:
    """What `argv` runs that the recorded release lacks: its tool, a --flag, or a value
    outside a flag's recorded choices."""
    found = tool_of(argv)
    if found is None:
        return []
    tool, start = found
    if tool in record.get("removed", {}) or tool not in record["tools"]:
        return [f"{tool}: not in TensorRT-LLM {record['release']}"]
    choices = record["tools"][tool].get("choices", {})
    bad = []
    for i, part in enumerate(argv[start:], start):
        if not part.startswith("--"):
            continue
        flag = part[2:].split("=", 1)[0]
        if flag not in known_flags(tool, record):
            bad.append(f"{tool}: --{flag}")
        elif flag in choices and i + 1 < len(argv) and argv[i + 1] not in choices[flag]:
            bad.append(f"{tool}: --{flag} {argv[i + 1]}")
    return bad


def llama_drill(**more: object) -> Drill:
    """[drills.X] rebuilding llama-trt from /models/llama, with `more` keys."""
    return Drill.model_validate(
        {"model": "llama", "deployment": "llama-trt", "checkpoint": "/models/llama", **more}
    )


CASES = [
    (pipeline, precision)
    for pipeline in get_args(Drill.model_fields["pipeline"].annotation)
    for precision in PRECISIONS
]


@pytest.mark.parametrize(("pipeline", "precision"), CASES, ids=[f"{p}-{q}" for p, q in CASES])
def test_every_template_flag_exists_in_tensorrt_llm_1_2(pipeline, precision):
    drill = llama_drill(pipeline=pipeline, precision=precision)
    steps = templates(drill)
    run = {name: t.argv for name, t in steps.items() if t.argv is not None}
    # Every step but the version probe runs one of the recorded tools: none goes unchecked.
    assert {name for name, argv in run.items() if tool_of(argv) is None} == {"preflight"}
    assert [bad for argv in run.values() for bad in unknown_flags(argv)] == []


RELEASE_CASES = [(p, q, version) for p, q in CASES for version in RECORDS]


@pytest.mark.parametrize(
    ("pipeline", "precision", "version"),
    RELEASE_CASES,
    ids=[f"{p}-{q}-{v}" for p, q, v in RELEASE_CASES],
)
def test_a_drill_runs_only_what_its_release_has_or_is_refused_when_planned(
    pipeline, precision, version
):
    drill = llama_drill(pipeline=pipeline, precision=precision, pins={"tensorrt_llm": version})
    run = [t.argv for t in templates(drill).values() if t.argv is not None]
    lacking = [bad for argv in run for bad in unknown_flags(argv, RECORDS[version])]
    refused = drill_release_problems(drill, version)
    if not refused:  # fleet.toml lets it be planned: the release has all it runs
        assert lacking == []
    else:  # refused, and only for what the record says the release lacks
        assert lacking != [], refused


def test_a_flag_or_tool_a_release_without_the_engine_backend_lacks_is_caught():
    serve = ["trtllm-serve", "{served_dir}", "--backend", "tensorrt", "--max_input_len", "8"]
    assert unknown_flags(serve, AFTER_ENGINE) == [
        "trtllm-serve: --backend tensorrt",
        "trtllm-serve: --max_input_len",
    ]
    assert unknown_flags(["trtllm-serve", "m", "--backend", "pytorch"], AFTER_ENGINE) == []
    assert unknown_flags(["trtllm-build", "--checkpoint_dir", "x"], AFTER_ENGINE) == [
        f"trtllm-build: not in TensorRT-LLM {AFTER_ENGINE['release']}"
    ]


def test_the_record_after_the_engine_backend_names_its_sources():
    assert AFTER_ENGINE["repo"] == "NVIDIA/TensorRT-LLM"
    assert AFTER_ENGINE["boundary"]["engine_backend_last"] == ENGINE_BACKEND_LAST
    for tool, entry in AFTER_ENGINE["tools"].items():
        assert len(entry["commit"]) == 40 and entry["file"], tool
        assert entry["flags"] == sorted(set(entry["flags"])), f"{tool}: sorted, no repeats"
    # The tools the refusals name are the ones the record says were removed.
    assert {TOOLS[t] for t in GONE_WITH_ENGINE_BACKEND} == set(AFTER_ENGINE["removed"])


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
    from console.agent.drills.plan import plan, values

    drill = llama_drill()
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
