"""Engine manifests, the engine cache and "rebuild required".

A TensorRT-LLM engine's `config.json` records the TensorRT-LLM version but not the
TensorRT version or the GPU it was built for (EngineConfig.to_dict in TensorRT-LLM's
tensorrt_llm/builder.py, github.com/NVIDIA/TensorRT-LLM, 1.2 releases): TensorRT
only refuses a mismatched plan when it deserializes it. So a drill's build step writes a
sidecar, `engineroom-manifest.json`, into the engine directory:

    {"schema": 1, "build_key", "drill", "job_id", "built", "build_s",
     "model": {"name", "checkpoint", "weights_sha256"},
     "pipeline", "precision", "tp_size", "shapes": {...},
     "versions": {"tensorrt_llm", "tensorrt", "cuda", "driver"},
     "gpu": {"name", "compute_capability"},
     "files": {"config.json": SHA256, "rank0.engine": SHA256, ...}}

The build key is a hash of everything an engine is tied to: model weights, pipeline,
precision, shapes, tensor parallelism, the TensorRT-LLM / TensorRT / CUDA versions, the
driver, the GPU and its compute capability. The cache is a directory of engines named by
key (`CACHE/KEY/`), each with its manifest; promoting is a rename into it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "engineroom-manifest.json"
MAX_MANIFEST_BYTES = 4 * 2**20  # a manifest lists files and versions: kilobytes
FACTS = ("driver", "cuda", "tensorrt", "tensorrt_llm", "gpu", "compute_capability")
FACT_NAMES = {
    "driver": "driver",
    "cuda": "CUDA",
    "tensorrt": "TensorRT",
    "tensorrt_llm": "TensorRT-LLM",
    "gpu": "GPU",
    "compute_capability": "compute capability",
}

# For what-if questions about a GPU the node does not have (NVIDIA's CUDA GPUs table).
COMPUTE_CAPABILITY = {
    "A10": "8.6",
    "A10G": "8.6",
    "A100": "8.0",
    "A30": "8.0",
    "L4": "8.9",
    "L40": "8.9",
    "L40S": "8.9",
    "H100": "9.0",
    "H200": "9.0",
    "GH200": "9.0",
    "B200": "10.0",
    "GB200": "10.0",
    "B300": "10.3",
    "RTX 6000 ADA": "8.9",
}


def compute_capability_of(gpu: str) -> str | None:
    name = gpu.upper().replace("NVIDIA", "").strip()
    best = None
    for sku, cc in COMPUTE_CAPABILITY.items():
        fits = name == sku or name.startswith((sku + " ", sku + "-"))
        if fits and (best is None or len(sku) > len(best[0])):
            best = (sku, cc)
    return best[1] if best else None


# -- weights --------------------------------------------------------------------------

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def weight_files(checkpoint: Path) -> list[Path]:
    found = [
        p
        for p in sorted(checkpoint.rglob("*"))
        if p.is_file() and (p.suffix in WEIGHT_SUFFIXES or p.name in SMALL_FILES)
    ]
    return found


def fingerprint(checkpoint: Path) -> str:
    """Cheap: names, sizes and modification times of the weight files."""
    h = hashlib.sha256()
    for path in weight_files(checkpoint):
        st = path.stat()
        h.update(f"{path.relative_to(checkpoint)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class WeightsHasher:
    """The content hash of a checkpoint's weights, recomputed only when its fingerprint
    (names, sizes, mtimes) changes; remembered in a JSON file across agent restarts."""

    def __init__(self, cache_file: Path) -> None:
        self.cache_file = cache_file
        self._lock = threading.Lock()  # the staleness loop and a drill may hash at once
        try:
            self.known: dict[str, dict[str, str]] = json.loads(cache_file.read_text())
        except (OSError, ValueError):
            self.known = {}

    def hash(self, checkpoint: Path) -> str:
        if not (checkpoint / "config.json").is_file():
            raise FileNotFoundError(f"{checkpoint}: no config.json (not a checkpoint directory)")
        key = str(checkpoint.resolve())
        fp = fingerprint(checkpoint)
        entry = self.known.get(key)
        if entry and entry.get("fingerprint") == fp:
            return entry["sha256"]
        h = hashlib.sha256()
        for path in weight_files(checkpoint):
            h.update(f"{path.relative_to(checkpoint)}\0{sha256_file(path)}\n".encode())
        digest = h.hexdigest()
        with self._lock, contextlib.suppress(OSError):
            self.known[key] = {"fingerprint": fp, "sha256": digest}
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.cache_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.known))
            os.replace(tmp, self.cache_file)
        return digest

    def cached(self, checkpoint: Path) -> str | None:
        """The hash if the fingerprint still matches what was hashed; never reads weights."""
        entry = self.known.get(str(checkpoint.resolve()))
        try:
            if entry and entry.get("fingerprint") == fingerprint(checkpoint):
                return entry["sha256"]
        except OSError:
            return None
        return None


# -- build keys and manifests ---------------------------------------------------------


def key_inputs(
    model: str,
    weights_sha256: str,
    pipeline: str,
    precision: str,
    tp_size: int,
    shapes: Mapping[str, Any],
    facts: Mapping[str, str | None],
) -> dict[str, Any]:
    return {
        "model": model,
        "weights_sha256": weights_sha256,
        "pipeline": pipeline,
        "precision": precision,
        "tp_size": tp_size,
        "shapes": dict(sorted(shapes.items())),
        **{k: facts.get(k) for k in FACTS},
    }


def build_key(inputs: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    return f"{inputs['precision']}-{digest[:16]}"


def manifest_inputs(manifest: dict[str, Any]) -> dict[str, Any]:
    """The build-key inputs a manifest records."""
    facts = {**manifest.get("versions", {}), **manifest.get("gpu", {})}
    facts["gpu"] = manifest.get("gpu", {}).get("name")
    return key_inputs(
        manifest["model"]["name"],
        manifest["model"]["weights_sha256"],
        manifest["pipeline"],
        manifest["precision"],
        manifest["tp_size"],
        manifest["shapes"],
        facts,
    )


def write_manifest(engine_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Checksum the engine's files and write the manifest beside them, atomically."""
    files = {
        str(p.relative_to(engine_dir)): sha256_file(p)
        for p in sorted(engine_dir.rglob("*"))
        if p.is_file() and p.name != MANIFEST and not p.name.endswith(".tmp")
    }
    full = {**manifest, "files": files}
    tmp = engine_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(full, indent=1, sort_keys=True))
    os.replace(tmp, engine_dir / MANIFEST)
    return full


def read_manifest(engine_dir: Path) -> dict[str, Any] | None:
    """The engine's manifest; None when there is none, or it is not one engineroom wrote:
    over MAX_MANIFEST_BYTES, not JSON, nested too deep, or of another schema."""
    try:
        with open(engine_dir / MANIFEST, "rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
        if len(raw) > MAX_MANIFEST_BYTES:
            return None
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) and data.get("schema") == 1 else None


def verify_files(engine_dir: Path, manifest: dict[str, Any]) -> list[str]:
    """Files that are missing or whose checksum changed since the build."""
    bad = []
    for name, digest in (manifest.get("files") or {}).items():
        path = engine_dir / name
        if not path.is_file():
            bad.append(f"{name} is missing")
        elif sha256_file(path) != digest:
            bad.append(f"{name} changed since the build (checksum)")
    return bad


# -- staleness ------------------------------------------------------------------------


def stale_reasons(manifest: dict[str, Any], facts: dict[str, str | None]) -> list[str]:
    """Why an engine built as `manifest` says no longer fits a node with `facts`.

    `facts` holds driver, cuda, tensorrt, tensorrt_llm, gpu, compute_capability and
    weights_sha256; a fact that is None (unknown) is not a reason, and is listed by
    `unknown_facts` instead.
    """
    built = {**manifest.get("versions", {})}
    built["gpu"] = manifest.get("gpu", {}).get("name")
    built["compute_capability"] = manifest.get("gpu", {}).get("compute_capability")
    reasons = []
    for key in facts_of(manifest.get("pipeline")):
        was, now = built.get(key), facts.get(key)
        if was is not None and now is not None and str(was) != str(now):
            reasons.append(f"{FACT_NAMES[key]} {was} → {now}")
    was_w, now_w = manifest.get("model", {}).get("weights_sha256"), facts.get("weights_sha256")
    if was_w and now_w and was_w != now_w:
        reasons.append(f"weights changed ({was_w[:12]} → {now_w[:12]})")
    return reasons


def unknown_facts(facts: dict[str, str | None], pipeline: str | None = None) -> list[str]:
    keys = (*facts_of(pipeline), "weights_sha256")
    return [FACT_NAMES.get(k, k) for k in keys if facts.get(k) is None]


def facts_of(pipeline: str | None) -> tuple[str, ...]:
    """The facts of FACTS an engine built by `pipeline` is tied to. The PyTorch backend
    runs no TensorRT engine, and TensorRT-LLM releases without the engine backend do not
    install TensorRT at all: its version is no fact of a PyTorch-backend deployment."""
    return tuple(k for k in FACTS if k != "tensorrt") if pipeline == "pytorch" else FACTS


# -- the cache ------------------------------------------------------------------------


@dataclass
class EngineCache:
    root: Path
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def open(cls, root: Path) -> EngineCache:
        cache = cls(root)
        cache.scan()
        return cache

    def scan(self) -> None:
        self.entries = {}
        if not self.root.is_dir():
            return
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            manifest = read_manifest(entry)
            if manifest is not None and manifest.get("build_key") == entry.name:
                self.entries[entry.name] = manifest

    def path(self, key: str) -> Path:
        return self.root / key

    def staging(self, job_id: str) -> Path:
        return self.root / ".staging" / job_id

    def promote(self, staged: Path, key: str) -> tuple[Path, bool]:
        """Rename a staged engine into the cache: (its path, False if the key was there)."""
        target = self.path(key)
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(staged, target)
        except OSError:
            if read_manifest(target) is not None:
                return target, False  # built twice; the first stays
            raise
        self.scan()
        return target, True


def point_link(link: Path, target: Path) -> str:
    """Re-point `link` at `target` atomically. A real directory there is left alone."""
    if link.exists() and not link.is_symlink():
        return f"{link} is a directory, not a link: left as it is; the engine is at {target}"
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.{os.getpid()}.{time.monotonic_ns()}")
    os.symlink(target, tmp)
    os.replace(tmp, link)
    return f"{link} → {target}"
