"""TEST DOUBLE of TensorRT-LLM's convert_checkpoint.py, quantize.py and trtllm-build.

They take the arguments a drill passes (anything else is accepted and ignored) and lay out
what the real tools would: a checkpoint `config.json` (architecture, dtype, mapping,
quantization) with `rank{i}.safetensors`, and an engine `config.json` in EngineConfig's
shape with `rank{i}.engine`, printing the real tools' progress lines. No weights are read,
converted, quantized or compiled: the files hold deterministic bytes derived from the
configs. The whole double: console/sim/trtllm_double.py.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from console.sim.trtllm_double_common import (
    canonical,
    elapsed,
    env_float,
    fill,
    inject_faults,
    read_json,
    say,
    version,
    write_json,
)

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
