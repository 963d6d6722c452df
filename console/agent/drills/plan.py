"""A drill's steps as argv lists: the shipped templates for TensorRT-LLM's two pipelines.

    engine   convert_checkpoint.py (or quantize.py) -> trtllm-build
             -> trtllm-serve --backend tensorrt
    pytorch  (quantize.py --export_format hf) -> trtllm-serve --backend pytorch, where the
             "build" is the server's cold start and warm-up

A `[drills.NAME.steps.STEP]` table replaces a template's argv, timeout or success
condition. The placeholders a template may use, and how it is filled, are the core's
(console.core.drills.templates), so fleet.toml is checked without the agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from console.core.config.load import Drill, DrillStep
from console.core.drills.templates import PLACEHOLDERS, PRECISIONS, fill, template_problems

__all__ = [
    "PLACEHOLDERS",
    "PRECISIONS",
    "PlannedStep",
    "Template",
    "plan",
    "template_problems",
    "values",
]

# What the preflight runs on the node when the drill does not say: the versions of the
# TensorRT-LLM stack in the python that serves it. Driver, GPU and compute capability
# come from NVML. `import tensorrt_llm` prints a banner, so the last JSON line counts.
PROBE = """\
import json
found = {}
for key, module, attr in (
    ("tensorrt_llm", "tensorrt_llm", "__version__"),
    ("tensorrt", "tensorrt", "__version__"),
    ("cuda", "torch", "version.cuda"),
):
    try:
        value = __import__(module)
        for part in attr.split("."):
            value = getattr(value, part)
        found[key] = str(value)
    except Exception as exc:
        found["error_" + key] = repr(exc)[:200]
print(json.dumps(found))
"""

# trtllm-serve 1.2 has no --served_model_name: its OpenAI server names the model after the
# MODEL argument, a directory's basename. So the candidate serves {served_dir}, a link
# named after the served model that points at {engine_dir}, made by this snippet right
# before it execs trtllm-serve (the same pid: the drill's process group and signals hold).
SERVE_AS = """\
import os, sys
link, target = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(link), exist_ok=True)
if os.path.lexists(link):
    os.remove(link)
os.symlink(target, link)
os.execvp(sys.argv[3], sys.argv[3:])
"""


@dataclass(frozen=True)
class Template:
    argv: list[str] | None  # None: the step is skipped (why says why) or built in
    expect_files: list[str]
    why: str | None = None


def _convert(drill: Drill, export_hf: bool) -> Template:
    _, qformat, kv = PRECISIONS[drill.precision]
    if qformat is None:
        if export_hf:
            return Template(None, [], "the PyTorch backend loads the checkpoint as it is")
        argv = [
            "python3",
            "{examples_dir}/models/core/{family}/convert_checkpoint.py",
            "--model_dir",
            "{checkpoint}",
            "--output_dir",
            "{ckpt_dir}",
            "--dtype",
            "{dtype}",
            "--tp_size",
            "{tp_size}",
        ]
        return Template(argv, ["{ckpt_dir}/config.json"])
    argv = [
        "python3",
        "{examples_dir}/quantization/quantize.py",
        "--model_dir",
        "{checkpoint}",
        "--dtype",
        "{dtype}",
        "--qformat",
        "{qformat}",
        *(["--kv_cache_dtype", "{kv_cache_dtype}"] if kv else []),
        "--calib_size",
        "512",
        "--tp_size",
        "{tp_size}",
        "--output_dir",
        "{ckpt_dir}",
        *(["--export_format", "hf"] if export_hf else []),
    ]
    return Template(argv, ["{ckpt_dir}/config.json"])


SHAPE_ARGS = [
    "--max_batch_size",
    "{max_batch_size}",
    "--max_num_tokens",
    "{max_num_tokens}",
    "--max_seq_len",
    "{max_seq_len}",
]


def templates(drill: Drill) -> dict[str, Template]:
    """The shipped template of each step for the drill's pipeline and precision."""
    preflight = Template(["python3", "-c", _literal(PROBE)], [])
    serve_head = [
        *("python3", "-c", _literal(SERVE_AS), "{served_dir}", "{engine_dir}"),
        *("trtllm-serve", "{served_dir}", "--host", "127.0.0.1", "--port", "{port}"),
    ]
    if drill.pipeline == "engine":
        build = Template(
            [
                "trtllm-build",
                "--checkpoint_dir",
                "{ckpt_dir}",
                "--output_dir",
                "{staging}",
                "--max_input_len",
                "{max_input_len}",
                *SHAPE_ARGS,
                "--gemm_plugin",
                "auto",
            ],
            ["{staging}/config.json", "{staging}/rank0.engine"],
        )
        serve = Template([*serve_head, "--backend", "tensorrt", "--tokenizer", "{checkpoint}"], [])
        return {
            "preflight": preflight,
            "convert": _convert(drill, export_hf=False),
            "build": build,
            "serve": serve,
        }
    serve = Template(
        [*serve_head, "--backend", "pytorch", *SHAPE_ARGS, "--tp_size", "{tp_size}"], []
    )
    build = Template(None, [], "the build is trtllm-serve's cold start and warm-up")
    return {
        "preflight": preflight,
        "convert": _convert(drill, export_hf=True),
        "build": build,
        "serve": serve,
    }


def _literal(code: str) -> str:
    """Braces in a template are placeholders: code's own are doubled to stay literal."""
    return code.replace("{", "{{").replace("}", "}}")


@dataclass(frozen=True)
class PlannedStep:
    name: str
    argv: list[str] | None
    timeout_s: float
    expect_files: list[Path]
    expect_output: str | None
    skip: str | None = None  # why the step does not run


def values(
    drill: Drill, served_model_name: str, staging: Path, ckpt_dir: Path, engine_dir: Path | str
) -> dict[str, str]:
    dtype, qformat, kv = PRECISIONS[drill.precision]
    return {
        "checkpoint": str(Path(drill.checkpoint).expanduser()),
        "ckpt_dir": str(ckpt_dir),
        "staging": str(staging),
        "engine_dir": str(engine_dir),
        "dtype": dtype,
        "qformat": qformat or "full_prec",
        "kv_cache_dtype": kv or "auto",
        "tp_size": str(drill.tp_size),
        "max_batch_size": str(drill.shapes.max_batch_size),
        "max_input_len": str(drill.shapes.max_input_len),
        "max_seq_len": str(drill.shapes.max_seq_len),
        "max_num_tokens": str(drill.shapes.max_num_tokens),
        "port": str(drill.serve_port),
        "served_model_name": served_model_name,
        # trtllm-serve names the model after this directory (SERVE_AS links it).
        "served_dir": str(Path(staging).parent / "served" / served_model_name),
        "examples_dir": str(Path(drill.examples_dir).expanduser()),
        "family": drill.family,
        "precision": drill.precision,
    }


def plan(drill: Drill, found: dict[str, str]) -> dict[str, PlannedStep]:
    """Every step's argv, timeout and success condition, filled with `found`."""
    out: dict[str, PlannedStep] = {}
    for name, template in templates(drill).items():
        spec = drill.steps.get(name, DrillStep())  # type: ignore[call-overload]
        argv = spec.argv if spec.argv is not None else template.argv
        expect = spec.expect_files if spec.expect_files is not None else template.expect_files
        skip = template.why if argv is None else None
        out[name] = PlannedStep(
            name=name,
            argv=None if argv is None else fill(argv, found),
            timeout_s=spec.timeout_s,
            expect_files=[Path(p) for p in fill(expect, found)],
            expect_output=spec.expect_output,
            skip=skip,
        )
    return out
