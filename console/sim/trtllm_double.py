#!/usr/bin/env python3
"""TEST DOUBLE of TensorRT-LLM's command-line tools, for the rebuild-drill tests and the demo.

It ships in the package (not under tests/) because `engineroom demo` runs its drill on it.

TensorRT-LLM needs an NVIDIA GPU, and these machines have none. This file stands in for
the tools a drill runs, so the drill's plumbing (steps, logs, timeouts, cancels, the
artifact layout, the candidate-versus-baseline comparison) runs for real:

    python -m console.sim.trtllm_double install BIN_DIR EXAMPLES_DIR
    python -m console.sim.trtllm_double convert|quantize --model_dir D --output_dir D [...]
    python -m console.sim.trtllm_double build --checkpoint_dir D --output_dir D [...]
    python -m console.sim.trtllm_double serve MODEL [--backend tensorrt] [--port N] [...]
    python -m console.sim.trtllm_double versions

`install` writes `trtllm-build`, `trtllm-serve` and `trtllm-versions` into BIN_DIR, and
`models/core/llama/convert_checkpoint.py` and `quantization/quantize.py` into EXAMPLES_DIR,
each running this file, so a drill calls them by the same names as on a real node.
The sub-commands live beside it: `trtllm_double_build` (convert, quantize, build),
`trtllm_double_serve` (serve), and what they share, `trtllm_double_common`.

What it imitates:
- the arguments of convert_checkpoint.py, quantize.py, trtllm-build and trtllm-serve (the
  ones a drill passes; anything else is accepted and ignored);
- the on-disk layout: a checkpoint `config.json` (architecture, dtype, mapping,
  quantization) with `rank{i}.safetensors`, and an engine `config.json` in EngineConfig's
  shape (`version`, `pretrained_config`, `build_config`) with `rank{i}.engine`;
- the progress lines the tools print, and an error line and exit 1 on failure;
- trtllm-serve's HTTP surface: `/health`, `/version`, `/v1/models`, `/metrics` (empty
  iteration stats), the flat OpenAI error shape, and uvicorn's "running on" line.

What it does not imitate:
- no weights are read, converted, quantized or compiled: the `.safetensors` and `.engine`
  files are deterministic bytes derived from the configs (identical inputs, identical
  bytes), a few KiB and 256 KiB each, and nothing can load them;
- there is no model: `serve` forwards completions to another OpenAI server (env
  TRTLLM_DOUBLE_UPSTREAM, a vLLM on CPU in the tests) and renames the model both ways;
- no GPU, memory, plugin, TP/PP or argument-compatibility checks beyond those below; the
  versions come from the environment, not from an installed TensorRT.

Environment:
- TRTLLM_DOUBLE_VERSION: the TensorRT-LLM version everywhere (default 1.2.0); the
  `versions` probe also reads TRTLLM_DOUBLE_TENSORRT, _CUDA, _DRIVER, _GPU and _CC (the
  last three are the node's: the demo sets them to its simulated NVML's, `node_env`).
- TRTLLM_DOUBLE_BUILD_S: seconds `build` takes (default 0), with a line every 0.5 s.
- TRTLLM_DOUBLE_LOAD_S: seconds `serve` loads before it listens (default 0.5).
- TRTLLM_DOUBLE_UPSTREAM, TRTLLM_DOUBLE_UPSTREAM_MODEL: where `serve` forwards completions
  (a base URL) and the model name it asks for there. Unset upstream: 503.
- TRTLLM_DOUBLE_DRIFT=N: non-streaming /v1/completions answers disagree from token N on
  (tokens become " drift"), so a candidate can be made to differ from its baseline.
- TRTLLM_DOUBLE_FAIL=SUB[,SUB]: that sub-command prints a few lines, then a
  `[TensorRT-LLM][ERROR] ... (TEST DOUBLE: TRTLLM_DOUBLE_FAIL=SUB)` line, and exits 1.
- TRTLLM_DOUBLE_HANG=SUB[,SUB]: that sub-command starts one child in its own process
  group (its pid appended to the file TRTLLM_DOUBLE_CHILD_PIDS, if set), ignores SIGTERM
  and sleeps forever: only a SIGKILL of the group ends it without leaving an orphan.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

THIS_FILE = Path(__file__).resolve()
if not __package__:  # run by its path, as the installed tools run it: its package's root
    sys.path.append(str(THIS_FILE.parents[2]))

from console.sim.trtllm_double_build import build, checkpoint  # noqa: E402
from console.sim.trtllm_double_common import DEFAULT_VERSION, inject_faults  # noqa: E402
from console.sim.trtllm_double_serve import serve  # noqa: E402

# -- install ------------------------------------------------------------------------------

BIN_SCRIPT = """#!{python}
# TEST DOUBLE of {name} (written by console/sim/trtllm_double.py install): not TensorRT-LLM.
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("trtllm_double", {this!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.exit(module.main([{sub!r}, *sys.argv[1:]]))
"""

EXAMPLE_SCRIPT = """#!/usr/bin/env python3
# TEST DOUBLE of TensorRT-LLM's {name} (written by console/sim/trtllm_double.py install).
# Any python3 runs this; it hands over to the interpreter that installed it.
import os
import sys

os.execv({python!r}, [{python!r}, {this!r}, {sub!r}, *sys.argv[1:]])
"""


def install(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="trtllm_double.py install")
    parser.add_argument("bin_dir", type=Path)
    parser.add_argument("examples_dir", type=Path)
    args = parser.parse_args(argv)
    python, this = os.path.abspath(sys.executable), str(THIS_FILE)
    scripts = {
        args.bin_dir / "trtllm-build": BIN_SCRIPT.format(
            python=python, name="trtllm-build", this=this, sub="build"
        ),
        args.bin_dir / "trtllm-serve": BIN_SCRIPT.format(
            python=python, name="trtllm-serve", this=this, sub="serve"
        ),
        args.bin_dir / "trtllm-versions": BIN_SCRIPT.format(
            python=python, name="the preflight version probe", this=this, sub="versions"
        ),
        args.examples_dir / "models/core/llama/convert_checkpoint.py": EXAMPLE_SCRIPT.format(
            python=python, name="convert_checkpoint.py", this=this, sub="convert"
        ),
        args.examples_dir / "quantization/quantize.py": EXAMPLE_SCRIPT.format(
            python=python, name="quantize.py", this=this, sub="quantize"
        ),
    }
    for path, text in scripts.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
        print(path)
    return 0


# -- versions -----------------------------------------------------------------------------


# What `versions` prints: (the variable that sets it, its default). The stack's versions
# are the double's own; the node's facts (driver, GPU, compute capability) are what the
# node it runs on has: a test without NVML takes the defaults, the demo passes what its
# SIMULATED NVML answers (`node_env`), so the probe's line and the node's facts agree.
VERSIONS = {
    "tensorrt_llm": ("TRTLLM_DOUBLE_VERSION", DEFAULT_VERSION),
    "tensorrt": ("TRTLLM_DOUBLE_TENSORRT", "10.13.3.9"),
    "cuda": ("TRTLLM_DOUBLE_CUDA", "13.0"),
    "driver": ("TRTLLM_DOUBLE_DRIVER", "580.159.04"),
    "gpu": ("TRTLLM_DOUBLE_GPU", "NVIDIA H200"),
    "compute_capability": ("TRTLLM_DOUBLE_CC", "9.0"),
}


def node_env(**facts: str) -> dict[str, str]:
    """The environment under which `versions` reports these facts (keys of VERSIONS)."""
    return {VERSIONS[key][0]: value for key, value in facts.items()}


def versions(argv: list[str]) -> int:
    inject_faults("versions")
    found = {key: os.environ.get(name) or default for key, (name, default) in VERSIONS.items()}
    print(json.dumps(found), flush=True)
    return 0


# -- main ---------------------------------------------------------------------------------

COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "install": install,
    "convert": lambda argv: checkpoint("convert", argv),
    "quantize": lambda argv: checkpoint("quantize", argv),
    "build": build,
    "serve": serve,
    "versions": versions,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: trtllm_double.py {{{','.join(COMMANDS)}}} ARGS...", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
