"""The vocabulary of a drill step's argv template: the `{placeholders}` a fleet.toml
`[drills.NAME.steps.STEP]` table may use, and how an argv element is filled.

Templates are argv lists whose elements may hold `{placeholders}`; each element is filled
on its own and never passed through a shell, so a value with spaces or quotes stays one
argument. An unknown placeholder is a fleet.toml error, found at load time
(console/core/config/load.py);
a literal brace is written twice ({{ and }}). The shipped templates are TensorRT-LLM's
(console.agent.drills.plan); the precisions they know are here, so fleet.toml's check can
tell which tools a drill runs (console.core.drills.trtllm_releases).
"""

from __future__ import annotations

from console.core.config.model import Drill

PLACEHOLDERS = (
    "checkpoint",  # the Hugging Face checkpoint directory
    "ckpt_dir",  # the converted (or quantized) checkpoint, in staging
    "staging",  # where the build writes the engine
    "engine_dir",  # what the candidate serves: the staged or cached engine
    "dtype",
    "qformat",
    "kv_cache_dtype",
    "tp_size",
    "max_batch_size",
    "max_input_len",
    "max_seq_len",
    "max_num_tokens",
    "port",
    "served_model_name",
    "served_dir",  # a link named after the served model, to what the candidate serves
    "examples_dir",
    "family",
    "precision",
)


# precision -> (dtype, quantize.py --qformat, --kv_cache_dtype); a --qformat of None: the
# checkpoint is not quantized (no quantize.py step)
PRECISIONS: dict[str, tuple[str, str | None, str | None]] = {
    "fp16": ("float16", None, None),
    "bf16": ("bfloat16", None, None),
    "fp8": ("bfloat16", "fp8", "fp8"),
    "int8-sq": ("bfloat16", "int8_sq", "int8"),
    "int4-awq": ("bfloat16", "int4_awq", None),
    "w4a8-awq": ("bfloat16", "w4a8_awq", None),
    "nvfp4": ("bfloat16", "nvfp4", "fp8"),
}


class _Strict(dict[str, str]):
    def __missing__(self, key: str) -> str:
        raise KeyError(key)


def fill(template: list[str], found: dict[str, str]) -> list[str]:
    """Each argv element with its {placeholders} filled; KeyError for an unknown one."""
    return [part.format_map(_Strict(found)) for part in template]


def template_problems(drill: Drill) -> list[tuple[str, str]]:
    """Unknown placeholders or bad braces in a drill's steps, as (step, what)."""
    dummy = {key: "x" for key in PLACEHOLDERS}
    problems: list[tuple[str, str]] = []
    for name, spec in drill.steps.items():
        for part in [*(spec.argv or []), *(spec.expect_files or [])]:
            try:
                part.format_map(_Strict(dummy))
            except KeyError as exc:
                problems.append(
                    (
                        name,
                        f"unknown placeholder {{{exc.args[0]}}} in {part!r} "
                        f"(known: {', '.join(PLACEHOLDERS)})",
                    )
                )
            except (ValueError, IndexError) as exc:
                problems.append((name, f"bad template {part!r}: {exc}"))
        if spec.argv is not None and not spec.argv:
            problems.append((name, "argv is empty"))
    return problems
