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
import asyncio
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

THIS_FILE = Path(__file__).resolve()
DEFAULT_VERSION = "1.2.0"
ENGINE_BYTES = 256 * 1024
WEIGHT_BYTES = 4 * 1024

QUANT_ALGOS = {
    "fp8": "FP8",
    "fp8_pc_pt": "FP8_PER_CHANNEL_PER_TOKEN",
    "int4_awq": "W4A16_AWQ",
    "w4a8_awq": "W4A8_AWQ",
    "int8_sq": "W8A8_SQ_PER_CHANNEL",
    "int8_wo": "W8A16",
    "int4_wo": "W4A16",
    "nvfp4": "NVFP4",
}
KV_CACHE_ALGOS = {"fp8": "FP8", "int8": "INT8", "nvfp4": "NVFP4"}
HF_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
)

# What each sub-command prints before an injected failure, and the error it then reports.
FAILURES = {
    "convert": "CUDA runtime error in cudaMalloc: out of memory",
    "quantize": "CUDA runtime error in cudaMalloc: out of memory",
    "build": "CUDA runtime error in cudaMalloc: out of memory",
    "serve": "Failed to deserialize cuda engine: engine plan built for a different GPU",
    "versions": "CUDA initialization failure with error: 35 (driver version is insufficient)",
}


def version() -> str:
    return os.environ.get("TRTLLM_DOUBLE_VERSION") or DEFAULT_VERSION


def say(line: str) -> None:
    print(line, flush=True)


def elapsed(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(max(seconds, 1.0)))


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        say(f"[TensorRT-LLM][WARNING] {name}={raw!r} is not a number; using {default}")
        return default


def _selected(env: str, sub: str) -> bool:
    return sub in {s.strip() for s in os.environ.get(env, "").split(",")}


def inject_faults(sub: str, banner: bool = True) -> None:
    """Exit 1 (TRTLLM_DOUBLE_FAIL) or hang for good (TRTLLM_DOUBLE_HANG) when asked to.

    `banner`: print the version line first (the caller has not printed it yet).
    """
    if banner and (_selected("TRTLLM_DOUBLE_FAIL", sub) or _selected("TRTLLM_DOUBLE_HANG", sub)):
        say(f"[TensorRT-LLM] TensorRT-LLM version: {version()}")
    if _selected("TRTLLM_DOUBLE_FAIL", sub):
        say("[TRT] [I] [MemUsageChange] Init CUDA: CPU +2, GPU +0, now: CPU 512, GPU 1024 (MiB)")
        say(f"[TensorRT-LLM][ERROR] {FAILURES[sub]} (TEST DOUBLE: TRTLLM_DOUBLE_FAIL={sub})")
        sys.exit(1)
    if _selected("TRTLLM_DOUBLE_HANG", sub):
        say(f"[TensorRT-LLM] {sub}: waiting on the GPU (TEST DOUBLE: hanging)")
        # A child in the same group (as MPI workers are), deaf to SIGTERM like its parent
        # (the ignore is inherited): only a SIGKILL of the whole group leaves no orphan.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        pids_file = os.environ.get("TRTLLM_DOUBLE_CHILD_PIDS")
        if pids_file:
            with open(pids_file, "a") as out:
                out.write(f"{child.pid}\n")
        while True:
            time.sleep(3600)


def fill(seed: str, size: int) -> bytes:
    """`size` bytes that depend only on `seed`."""
    return hashlib.shake_256(seed.encode()).digest(size)


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def read_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object at `path`, or an error line and exit 1."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        say(f"[TensorRT-LLM][ERROR] {what}: {path} not found")
        sys.exit(1)
    except (OSError, ValueError) as exc:
        say(f"[TensorRT-LLM][ERROR] {what}: cannot read {path}: {exc}")
        sys.exit(1)
    if not isinstance(data, dict):
        say(f"[TensorRT-LLM][ERROR] {what}: {path} is not a JSON object")
        sys.exit(1)
    return data


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=4) + "\n")


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


# -- convert / quantize -------------------------------------------------------------------


def checkpoint_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--model_dir", type=Path, required=True)
    parser.add_argument("--output_dir", type=Path, required=True)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tp_size", type=int, default=1)
    parser.add_argument("--pp_size", type=int, default=1)
    parser.add_argument("--qformat", default=None)
    parser.add_argument("--kv_cache_dtype", default=None)
    parser.add_argument("--calib_size", type=int, default=512)
    parser.add_argument("--export_format", default="tensorrt_llm")
    return parser


def checkpoint_config(hf: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """A TensorRT-LLM checkpoint config.json from a Hugging Face one."""
    architectures = hf.get("architectures") or ["LlamaForCausalLM"]
    dtype = args.dtype
    if dtype == "auto":
        dtype = hf.get("torch_dtype") or hf.get("dtype") or "float16"
    config: dict[str, Any] = {"architecture": architectures[0], "dtype": dtype}
    # As TensorRT-LLM does: no num_key_value_heads means plain multi-head attention.
    hf = {"num_key_value_heads": hf.get("num_attention_heads"), **hf}
    for key in HF_KEYS:
        if hf.get(key) is not None:
            config[key] = hf[key]
    config["mapping"] = {
        "world_size": args.tp_size * args.pp_size,
        "tp_size": args.tp_size,
        "pp_size": args.pp_size,
    }
    qformat = (args.qformat or "").lower()
    config["quantization"] = {
        "quant_algo": QUANT_ALGOS.get(qformat),
        "kv_cache_quant_algo": KV_CACHE_ALGOS.get((args.kv_cache_dtype or "").lower()),
    }
    return config


def safetensors_bytes(config: dict[str, Any], rank: int) -> bytes:
    """A well-formed safetensors file: one U8 tensor of deterministic bytes."""
    data = fill(f"{canonical(config)}|{version()}|rank{rank}", WEIGHT_BYTES)
    header = {
        "__metadata__": {"format": "pt", "test_double": "trtllm_double.py"},
        "transformer.vocab_embedding.weight": {
            "dtype": "U8",
            "shape": [WEIGHT_BYTES],
            "data_offsets": [0, WEIGHT_BYTES],
        },
    }
    head = canonical(header).encode()
    head += b" " * (-len(head) % 8)
    return len(head).to_bytes(8, "little") + head + data


def checkpoint(sub: str, argv: list[str]) -> int:
    prog = "convert_checkpoint.py" if sub == "convert" else "quantize.py"
    args, _unknown = checkpoint_parser(prog).parse_known_args(argv)
    started = time.monotonic()
    say(f"[TensorRT-LLM] TensorRT-LLM version: {version()}")
    inject_faults(sub, banner=False)
    if args.tp_size < 1 or args.pp_size < 1:
        say(f"[TensorRT-LLM][ERROR] tp_size {args.tp_size}, pp_size {args.pp_size}: must be >= 1")
        return 1
    hf = read_json(
        args.model_dir / "config.json", f"{prog}: --model_dir has no Hugging Face config"
    )
    config = checkpoint_config(hf, args)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    world = config["mapping"]["world_size"]
    if sub == "quantize":
        say(f"Initializing model from {args.model_dir}")
        say(f"Quantization format: {args.qformat}, calibration size: {args.calib_size}")
    say(f"Weights loaded. Total time: {elapsed(time.monotonic() - started)}")
    write_json(args.output_dir / "config.json", config)
    for rank in range(world):
        (args.output_dir / f"rank{rank}.safetensors").write_bytes(safetensors_bytes(config, rank))
    if sub == "quantize":
        say(f"Quantized model exported to {args.output_dir}")
    say(f"Total time of converting checkpoints: {elapsed(time.monotonic() - started)}")
    return 0


# -- build --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trtllm-build")
    parser.add_argument("--checkpoint_dir", type=Path, required=True)
    parser.add_argument("--output_dir", type=Path, default=Path("engine_outputs"))
    parser.add_argument("--max_batch_size", type=int, default=2048)
    parser.add_argument("--max_input_len", type=int, default=1024)
    parser.add_argument("--max_seq_len", type=int, default=None)
    parser.add_argument("--max_num_tokens", type=int, default=8192)
    parser.add_argument("--max_beam_width", type=int, default=1)
    parser.add_argument("--gemm_plugin", default="auto")
    parser.add_argument("--workers", type=int, default=1)
    return parser


def build(argv: list[str]) -> int:
    args, _unknown = build_parser().parse_known_args(argv)
    started = time.monotonic()
    say(f"[TensorRT-LLM] TensorRT-LLM version: {version()}")
    inject_faults("build", banner=False)
    pretrained = read_json(
        args.checkpoint_dir / "config.json",
        "trtllm-build: --checkpoint_dir holds no checkpoint (run convert_checkpoint.py first)",
    )
    mapping = pretrained.get("mapping") or {}
    world = int(mapping.get("world_size", 1))
    max_seq_len = args.max_seq_len or int(pretrained.get("max_position_embeddings", 2048))
    engine_config = {
        "version": version(),
        "pretrained_config": pretrained,
        "build_config": {
            "max_input_len": args.max_input_len,
            "max_seq_len": max_seq_len,
            "max_batch_size": args.max_batch_size,
            "max_beam_width": args.max_beam_width,
            "max_num_tokens": args.max_num_tokens,
            "opt_num_tokens": None,
            "kv_cache_type": "PAGED",
            "plugin_config": {
                "gemm_plugin": args.gemm_plugin or "auto",
                "gpt_attention_plugin": "auto",
                "context_fmha": True,
                "paged_kv_cache": True,
                "remove_input_padding": True,
            },
        },
    }
    say(f"[TensorRT-LLM][INFO] Set dtype to {pretrained.get('dtype', 'float16')}.")
    say(f"[TensorRT-LLM][INFO] max_seq_len is set to {max_seq_len}")
    say(f"[TRT] [I] Building engine for {world} rank(s) with {args.workers} worker(s) ...")
    build_s = env_float("TRTLLM_DOUBLE_BUILD_S", 0.0)
    deadline = time.monotonic() + build_s
    layer = 0
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(0.5, left))
        layer += 1
        say(f"[TRT] [I] Tactic search: layer {layer} ({time.monotonic() - started:.1f} s)")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    seed = canonical(engine_config)
    for rank in range(world):
        say(f"[TRT] [I] Total Weights Memory: {ENGINE_BYTES} bytes (rank {rank})")
        data = fill(f"{seed}|{version()}|rank{rank}", ENGINE_BYTES)
        (args.output_dir / f"rank{rank}.engine").write_bytes(data)
        say(f"[TensorRT-LLM][INFO] Engine serialized to {args.output_dir}/rank{rank}.engine")
    write_json(args.output_dir / "config.json", engine_config)
    took = elapsed(time.monotonic() - started)
    say(f"[TensorRT-LLM] [I] Total time of building all engines: {took}")
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


# -- serve --------------------------------------------------------------------------------


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trtllm-serve")
    parser.add_argument("model")
    parser.add_argument(
        "--backend", choices=["pytorch", "tensorrt", "_autodeploy"], default="pytorch"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--served_model_name", default=None)
    parser.add_argument("--max_batch_size", type=int, default=None)
    return parser


def engine_problem(model: Path) -> str | None:
    """Why `model` is not an engine directory trtllm-serve --backend tensorrt could load."""
    if not model.is_dir():
        return f"engine directory {model} does not exist"
    try:
        config = json.loads((model / "config.json").read_text())
    except FileNotFoundError:
        return f"{model}/config.json not found: not an engine directory"
    except (OSError, ValueError) as exc:
        return f"cannot read {model}/config.json: {exc}"
    if not isinstance(config, dict) or "version" not in config:
        return f"{model}/config.json has no 'version': a checkpoint, not an engine"
    if not (model / "rank0.engine").is_file():
        return f"{model}/rank0.engine not found"
    return None


def error_body(message: str, kind: str, code: int) -> dict[str, Any]:
    """trtllm-serve's flat OpenAI error shape."""
    return {"object": "error", "message": message, "type": kind, "param": None, "code": code}


def drift(answer: dict[str, Any], start: int) -> None:
    """Make a completion disagree from token (or, without logprobs, character) `start` on."""
    for choice in answer.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict) and isinstance(logprobs.get("tokens"), list):
            tokens = logprobs["tokens"]
            tokens = tokens[:start] + [" drift"] * max(len(tokens) - start, 0)
            logprobs["tokens"] = tokens
            choice["text"] = "".join(str(t) for t in tokens)
        elif isinstance(choice.get("text"), str) and len(choice["text"]) > start:
            choice["text"] = choice["text"][:start] + " drift"


def rename(data: Any, served: str) -> Any:
    if isinstance(data, dict) and "model" in data:
        data["model"] = served
    return data


def make_app(served: str) -> Any:
    from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

    upstream = (os.environ.get("TRTLLM_DOUBLE_UPSTREAM") or "").rstrip("/")
    upstream_model = os.environ.get("TRTLLM_DOUBLE_UPSTREAM_MODEL")
    drift_raw = os.environ.get("TRTLLM_DOUBLE_DRIFT")
    drift_at = int(drift_raw) if drift_raw else None
    app = web.Application()

    def error(message: str, kind: str, code: int) -> web.Response:
        return web.json_response(error_body(message, kind, code), status=code)

    async def session_ctx(app: web.Application) -> Any:
        # Every request shares one pool, big enough for the drill's 64 concurrent streams.
        async with ClientSession(
            connector=TCPConnector(limit=512),
            timeout=ClientTimeout(total=None, sock_connect=10, sock_read=600),
            read_bufsize=1 << 20,
        ) as session:
            app["session"] = session
            yield

    app.cleanup_ctx.append(session_ctx)

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def get_version(_: web.Request) -> web.Response:
        return web.json_response({"version": version()})

    async def models(_: web.Request) -> web.Response:
        card = {"id": served, "object": "model", "owned_by": "tensorrt_llm"}
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(_: web.Request) -> web.Response:
        return web.json_response([])

    async def forward(request: web.Request) -> web.StreamResponse:
        if not upstream:
            return error(
                "no model backend (TEST DOUBLE: TRTLLM_DOUBLE_UPSTREAM is not set)",
                "ServiceUnavailableError",
                503,
            )
        try:
            body = await request.json()
        except ValueError:
            return error("request body is not JSON", "BadRequestError", 400)
        if not isinstance(body, dict):
            return error("request body must be a JSON object", "BadRequestError", 400)
        if upstream_model:
            body["model"] = upstream_model
        session: ClientSession = request.app["session"]
        stream: web.StreamResponse | None = None
        try:
            async with session.post(upstream + request.path, json=body) as up:
                if body.get("stream") and up.status == 200:
                    stream = web.StreamResponse(status=up.status)
                    stream.content_type = up.content_type or "text/event-stream"
                    stream.headers["Cache-Control"] = "no-cache"
                    await stream.prepare(request)
                    # Line by line, each written at once: the client sees every event as
                    # the upstream sends it.
                    async for line in up.content:
                        await stream.write(_rename_sse(line, served))
                    await stream.write_eof()
                    return stream
                raw = await up.read()
                try:
                    answer = json.loads(raw)
                except ValueError:
                    return web.Response(status=up.status, body=raw, content_type=up.content_type)
                rename(answer, served)
                if (
                    drift_at is not None
                    and up.status == 200
                    and request.path == "/v1/completions"
                    and isinstance(answer, dict)
                ):
                    drift(answer, drift_at)
                return web.json_response(answer, status=up.status)
        except (ClientError, TimeoutError) as exc:
            if stream is not None:
                raise  # headers are gone: aiohttp drops the connection, the client sees it cut
            return error(f"upstream {upstream}: {exc!r}", "BadGatewayError", 502)

    async def not_found(request: web.Request) -> web.Response:
        return error(f"{request.method} {request.path} not found", "NotFoundError", 404)

    app.router.add_get("/health", health)
    app.router.add_get("/version", get_version)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", forward)
    app.router.add_post("/v1/chat/completions", forward)
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app


def _rename_sse(line: bytes, served: str) -> bytes:
    """One SSE line with its chunk's model renamed; anything else as it came."""
    if not line.startswith(b"data:"):
        return line
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return line
    try:
        chunk = json.loads(payload)
    except ValueError:
        return line
    ending = line[len(line.rstrip(b"\r\n")) :]
    return b"data: " + json.dumps(rename(chunk, served)).encode() + ending


async def serve_async(args: argparse.Namespace) -> int:
    from aiohttp import web

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    served = args.served_model_name or os.path.basename(os.path.normpath(args.model))
    say(f"[TensorRT-LLM] TensorRT-LLM version: {version()}")
    load_s = env_float("TRTLLM_DOUBLE_LOAD_S", 0.5)
    deadline = loop.time() + load_s
    while (left := deadline - loop.time()) > 0:
        say(f"[TensorRT-LLM][INFO] Loading engine... ({args.model}, backend {args.backend})")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), min(0.5, left))
        if stop.is_set():
            return 0
    say("[TensorRT-LLM][INFO] Engine loaded (TEST DOUBLE: no model; completions go upstream)")
    runner = web.AppRunner(make_app(served), access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    try:
        await site.start()
    except OSError as exc:
        say(f"[TensorRT-LLM][ERROR] cannot listen on {args.host}:{args.port}: {exc}")
        await runner.cleanup()
        return 1
    port = runner.addresses[0][1] if runner.addresses else args.port
    say(f"INFO:     Started server process [{os.getpid()}]")
    say("INFO:     Waiting for application startup.")
    say("INFO:     Application startup complete.")
    say(f"INFO:     Uvicorn running on http://{args.host}:{port} (Press CTRL+C to quit)")
    await stop.wait()
    say("INFO:     Shutting down")
    await runner.cleanup()
    say(f"INFO:     Finished server process [{os.getpid()}]")
    return 0


def serve(argv: list[str]) -> int:
    args, _unknown = serve_parser().parse_known_args(argv)
    inject_faults("serve")
    if args.backend == "tensorrt":
        problem = engine_problem(Path(args.model))
        if problem:
            say(f"[TensorRT-LLM] TensorRT-LLM version: {version()}")
            say(f"[TensorRT-LLM][ERROR] {problem}")
            return 1
    return asyncio.run(serve_async(args))


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
