"""Which TensorRT-LLM releases still have the TensorRT engine backend, and what a drill
runs that a release no longer has.

TensorRT-LLM removed its engine backend on its main branch in mid-2026
(docs/source/legacy/tensorrt-backend-removal.md in NVIDIA/TensorRT-LLM): no
`trtllm-build`, no per-model `convert_checkpoint.py`, no `--backend tensorrt`; the
PyTorch backend loads Hugging Face checkpoints with no build step. The release notes of
v1.3.0rc20 (github.com/NVIDIA/TensorRT-LLM/releases/tag/v1.3.0rc20, 30 June 2026) say
"This RC version will be the last one supporting the TensorRT backend, in the next
version the TensorRT backend will be removed". So 1.2.x and 1.3.0rc20 and earlier have
it, and every later release does not. What `trtllm-serve` accepts on either side is
recorded with its source in tests/fixtures/trtllm-1.2-flags.json and
tests/fixtures/trtllm-main-flags.json.
"""

from __future__ import annotations

import re

from console.core.config.model import Drill
from console.core.drills.templates import PRECISIONS

ENGINE_BACKEND_LAST = "1.3.0rc20"  # the last release with the engine backend

# The tools that went with the engine backend, and the change on main that removed each.
GONE_WITH_ENGINE_BACKEND = {
    "trtllm-build": "its console script, with the engine backend's Python modules (PR #15918)",
    "convert_checkpoint.py": "examples/models/core/*/convert_checkpoint.py (PR #15763)",
    "quantize.py": "examples/quantization/quantize.py, the engine checkpoint export (PR #16612)",
}

_VERSION = re.compile(
    r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:(a|b|rc)(\d+))?(?:\.post\d+)?(?:\.dev\d+)?(?:\+[\w.]+)?"
)
_PRE = {"a": 0, "b": 1, "rc": 2, None: 3}  # a final release sorts after its candidates


def release_key(version: str) -> tuple[int, int, int, int, int] | None:
    """A TensorRT-LLM version (1.2.0, 1.3.0rc20, 1.2.0rc6.post3) as a sortable key: its
    release and pre-release; a .post or .dev suffix does not move it past the next
    candidate. None for a version that is not one."""
    found = _VERSION.fullmatch(version.strip())
    if found is None:
        return None
    major, minor, patch, pre, number = found.groups()
    return int(major), int(minor), int(patch or 0), _PRE[pre], int(number or 0)


def has_engine_backend(version: str) -> bool | None:
    """Whether TensorRT-LLM `version` has the engine backend; None: not a version."""
    key = release_key(version)
    last = release_key(ENGINE_BACKEND_LAST)
    return None if key is None or last is None else key <= last


def gone_tools(argv: list[str]) -> list[str]:
    """The removed tools an argv runs (a wrapper such as the serve step's may come first)."""
    return [t for t in (p.rsplit("/", 1)[-1] for p in argv[:8]) if t in GONE_WITH_ENGINE_BACKEND]


Problem = tuple[tuple[str, ...], str]  # (the key in the drill's table, why)


def drill_release_problems(drill: Drill, version: str) -> list[Problem]:
    """What in `drill` TensorRT-LLM `version` cannot run, one Problem each: an
    engine pipeline after the engine backend's removal, or a step that runs a removed
    tool. Empty for a release that has the engine backend, or a version not understood."""
    if has_engine_backend(version) is not False:
        return []
    release = f"TensorRT-LLM {version}"
    if drill.pipeline == "engine":
        return [
            (
                ("pipeline",),
                f'pipeline "engine" needs trtllm-build, which {release} no longer has (the '
                f"engine backend was removed after {ENGINE_BACKEND_LAST}; use "
                'pipeline = "pytorch")',
            )
        ]
    problems: list[Problem] = []
    for step, spec in drill.steps.items():
        for tool in gone_tools(spec.argv or []):
            removed = GONE_WITH_ENGINE_BACKEND[tool]
            problems.append(
                (("steps", step), f"runs {tool}, which {release} no longer has ({removed})")
            )
    convert = drill.steps.get("convert")
    if PRECISIONS[drill.precision][1] is not None and (convert is None or convert.argv is None):
        problems.append(
            (
                ("precision",),
                f'precision "{drill.precision}" quantizes with quantize.py, which {release} '
                "no longer has (removed with the engine backend); give its convert step an "
                "argv of its own, for example NVIDIA Model Optimizer's Hugging Face export",
            )
        )
    return problems
