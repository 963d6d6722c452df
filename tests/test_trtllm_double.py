"""The TensorRT-LLM test double does what the rebuild-drill tests rely on.

It stands in for convert_checkpoint.py, quantize.py, trtllm-build, trtllm-serve and the
preflight version probe (see console/sim/trtllm_double.py), so these stories check it once,
quickly, on loopback: the artifacts it lays out, its failures on demand, and a serve that
answers like trtllm-serve while a stand-in upstream does the generating.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from console.sim import trtllm_double
from tests.engines.servers import log_tail, running, stop, wait_until

DOUBLE = Path(trtllm_double.__file__)
HF_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}
UPSTREAM_ANSWER = {
    "choices": [{"text": "a b c d", "logprobs": {"tokens": ["a", " b", " c", " d"]}}],
    "model": "up",
}


def double_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_DOUBLE_")}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def run(argv: Sequence[str | Path], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=double_env(**env),
        capture_output=True,
        text=True,
        timeout=30,
    )


@dataclass
class Tools:
    """The double installed where a drill finds TensorRT-LLM's tools."""

    root: Path
    bin: Path
    examples: Path
    model: Path

    def convert(self, out: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        # The examples run under whichever python3 is on PATH, as the drill calls them.
        python3 = shutil.which("python3") or sys.executable
        script = self.examples / "models/core/llama/convert_checkpoint.py"
        argv: list[str | Path] = [
            python3,
            script,
            "--model_dir",
            self.model,
            "--output_dir",
            out,
            *args,
        ]
        return run(argv, self.root, **env)

    def build(
        self, ckpt: str, out: str, *args: str, **env: str
    ) -> subprocess.CompletedProcess[str]:
        argv: list[str | Path] = [
            self.bin / "trtllm-build",
            "--checkpoint_dir",
            ckpt,
            "--output_dir",
            out,
            *args,
        ]
        return run(argv, self.root, **env)


@pytest.fixture
def tools(tmp_path: Path) -> Tools:
    tools = Tools(tmp_path, tmp_path / "bin", tmp_path / "examples", tmp_path / "hf")
    installed = run([sys.executable, DOUBLE, "install", tools.bin, tools.examples], tmp_path)
    assert installed.returncode == 0, installed.stderr
    tools.model.mkdir()
    (tools.model / "config.json").write_text(json.dumps(HF_CONFIG))
    return tools


def test_convert_then_build_lays_out_a_checkpoint_and_an_engine(tools: Tools) -> None:
    converted = tools.convert("ckpt", "--tp_size", "2", "--dtype", "auto", "--unknown_flag", "1")
    assert converted.returncode == 0, converted.stdout + converted.stderr
    assert "Total time of converting checkpoints" in converted.stdout
    ckpt = json.loads((tools.root / "ckpt/config.json").read_text())
    assert ckpt["architecture"] == "LlamaForCausalLM"
    assert ckpt["dtype"] == "bfloat16"  # auto: the Hugging Face torch_dtype
    assert ckpt["num_key_value_heads"] == 2
    assert ckpt["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1}
    assert ckpt["quantization"] == {"quant_algo": None, "kv_cache_quant_algo": None}
    assert sorted(p.name for p in (tools.root / "ckpt").glob("rank*")) == [
        "rank0.safetensors",
        "rank1.safetensors",
    ]

    built = tools.build("ckpt", "engine", "--max_batch_size", "8", "--gemm_plugin", "bfloat16")
    assert built.returncode == 0, built.stdout + built.stderr
    assert "Total time of building all engines" in built.stdout
    engine = json.loads((tools.root / "engine/config.json").read_text())
    assert engine["version"] == "1.2.0"
    assert engine["pretrained_config"] == ckpt
    assert engine["build_config"]["max_batch_size"] == 8
    assert engine["build_config"]["max_seq_len"] == 4096
    assert engine["build_config"]["plugin_config"]["gemm_plugin"] == "bfloat16"
    for rank in (0, 1):
        assert (tools.root / f"engine/rank{rank}.engine").stat().st_size == 256 * 1024


def test_a_rebuild_from_the_same_inputs_gives_the_same_bytes(tools: Tools) -> None:
    quant = ("--qformat", "fp8", "--kv_cache_dtype", "fp8")
    for out in ("ckpt_a", "ckpt_b"):
        assert tools.convert(out, *quant).returncode == 0
    ckpt = json.loads((tools.root / "ckpt_a/config.json").read_text())
    assert ckpt["quantization"] == {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
    assert tools.build("ckpt_a", "engine_a").returncode == 0
    assert tools.build("ckpt_b", "engine_b").returncode == 0
    assert tools.build("ckpt_a", "engine_v", TRTLLM_DOUBLE_VERSION="1.3.0").returncode == 0

    def read(path: str) -> bytes:
        return (tools.root / path).read_bytes()

    assert read("ckpt_a/rank0.safetensors") == read("ckpt_b/rank0.safetensors")
    assert read("engine_a/rank0.engine") == read("engine_b/rank0.engine")
    assert read("engine_a/config.json") == read("engine_b/config.json")
    assert read("engine_v/rank0.engine") != read("engine_a/rank0.engine")


def test_a_failure_on_demand_exits_1_with_the_marker(tools: Tools) -> None:
    assert tools.convert("ckpt").returncode == 0
    failed = tools.build("ckpt", "engine", TRTLLM_DOUBLE_FAIL="convert,build")
    assert failed.returncode == 1
    assert "[TensorRT-LLM][ERROR]" in failed.stdout
    assert "TEST DOUBLE: TRTLLM_DOUBLE_FAIL=build" in failed.stdout
    assert not (tools.root / "engine/rank0.engine").exists()

    missing = tools.build("nowhere", "engine")
    assert missing.returncode == 1
    assert "nowhere/config.json not found" in missing.stdout


def test_a_hung_step_ignores_sigterm_until_its_group_is_killed(tools: Tools) -> None:
    pids = tools.root / "child.pids"
    process = subprocess.Popen(
        [tools.bin / "trtllm-build", "--checkpoint_dir", "x", "--output_dir", "y"],
        cwd=tools.root,
        env=double_env(TRTLLM_DOUBLE_HANG="build", TRTLLM_DOUBLE_CHILD_PIDS=str(pids)),
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        child = int(wait_until(lambda: written(pids), 10, what="the child's pid"))
        os.killpg(process.pid, signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=0.5)
        assert running(child)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    wait_until(lambda: not running(child), 10, what="the hung step's child gone")


def written(path: Path) -> str | None:
    return path.read_text().strip() or None if path.exists() else None


def test_the_version_probe_prints_one_json_line_from_the_environment(tools: Tools) -> None:
    probed = run([tools.bin / "trtllm-versions"], tools.root, TRTLLM_DOUBLE_CC="10.0")
    assert probed.returncode == 0
    assert len(probed.stdout.splitlines()) == 1
    versions = json.loads(probed.stdout)
    assert versions["tensorrt_llm"] == "1.2.0"
    assert versions["compute_capability"] == "10.0"
    assert versions["gpu"] == "NVIDIA H200"

    failed = run([tools.bin / "trtllm-versions"], tools.root, TRTLLM_DOUBLE_FAIL="versions")
    assert failed.returncode == 1
    assert "TEST DOUBLE: TRTLLM_DOUBLE_FAIL=versions" in failed.stdout


# -- serve --------------------------------------------------------------------------------


@dataclass
class Upstream:
    """A stand-in OpenAI server: one fixed completion, and the bodies it was sent."""

    url: str
    bodies: list[dict] = field(default_factory=list)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            if body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for text in ("a", " b"):
                    chunk = {"choices": [{"text": text}], "model": "up"}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                return
            answer = json.dumps(UPSTREAM_ANSWER).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Upstream(f"http://127.0.0.1:{server.server_address[1]}", seen)
    server.shutdown()
    server.server_close()


@pytest.fixture
def serve(tools: Tools) -> Iterator:
    """Start `trtllm-serve` (the double) on a free port; its base URL once it listens."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str, **env: str) -> str:
        log = tools.root / f"serve{len(started)}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [tools.bin / "trtllm-serve", *args, "--port", "0"],
                cwd=tools.root,
                env=double_env(TRTLLM_DOUBLE_LOAD_S="0.1", **env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(process)

        def listening() -> str | None:
            if process.poll() is not None:
                raise RuntimeError(f"trtllm-serve exited {process.returncode}:\n{log_tail(log)}")
            found = re.search(r"Uvicorn running on (http://\S+)", log.read_text())
            return found.group(1) if found else None

        return wait_until(listening, 15, what="trtllm-serve listening")

    yield start
    for process in started:
        assert stop(process, grace=5) == 0  # SIGTERM: a clean exit


def test_serve_answers_like_trtllm_serve_and_generates_upstream(
    tools: Tools, upstream: Upstream, serve
) -> None:
    assert tools.convert("ckpt").returncode == 0
    assert tools.build("ckpt", "engine").returncode == 0
    url = serve(
        "engine",
        "--backend",
        "tensorrt",
        "--served_model_name",
        "llama-fp8",
        TRTLLM_DOUBLE_UPSTREAM=upstream.url,
        TRTLLM_DOUBLE_UPSTREAM_MODEL="tiny-llama",
    )
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    assert httpx.get(f"{url}/version", timeout=5).json() == {"version": "1.2.0"}
    models = httpx.get(f"{url}/v1/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == ["llama-fp8"]
    assert models["data"][0]["owned_by"] == "tensorrt_llm"

    request = {"model": "llama-fp8", "prompt": "x", "max_tokens": 4, "logprobs": 1}
    answer = httpx.post(f"{url}/v1/completions", json=request, timeout=5).json()
    assert upstream.bodies[-1]["model"] == "tiny-llama"
    assert answer == {**UPSTREAM_ANSWER, "model": "llama-fp8"}

    with httpx.stream(
        "POST", f"{url}/v1/completions", json={**request, "stream": True}, timeout=5
    ) as streamed:
        events = [line[6:] for line in streamed.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks] == ["a", " b"]
    assert {c["model"] for c in chunks} == {"llama-fp8"}


def test_serve_drifts_from_the_baseline_on_demand(tools: Tools, upstream: Upstream, serve) -> None:
    url = serve(str(tools.model), TRTLLM_DOUBLE_UPSTREAM=upstream.url, TRTLLM_DOUBLE_DRIFT="2")
    request = {"model": "hf", "prompt": "x", "max_tokens": 4, "logprobs": 1}
    choice = httpx.post(f"{url}/v1/completions", json=request, timeout=5).json()["choices"][0]
    assert choice["logprobs"]["tokens"] == ["a", " b", " drift", " drift"]
    assert choice["text"] == "a b drift drift"
    assert upstream.bodies[-1]["model"] == "hf"  # no TRTLLM_DOUBLE_UPSTREAM_MODEL: as sent


def test_serve_without_an_upstream_or_an_engine_says_why(tools: Tools, serve) -> None:
    url = serve(str(tools.model))
    refused = httpx.post(f"{url}/v1/completions", json={"prompt": "x"}, timeout=5)
    assert refused.status_code == 503
    assert refused.json()["object"] == "error"
    assert refused.json()["type"] == "ServiceUnavailableError"

    # A checkpoint is not an engine: trtllm-serve --backend tensorrt refuses it.
    assert tools.convert("ckpt").returncode == 0
    bad = run([tools.bin / "trtllm-serve", "ckpt", "--backend", "tensorrt"], tools.root)
    assert bad.returncode == 1
    assert "[TensorRT-LLM][ERROR]" in bad.stdout
