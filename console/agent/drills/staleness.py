"""Is each TensorRT-LLM engine still right for this node? ("rebuild required" detection)

An engine built by a drill carries a manifest (console.agent.drills.manifest): the versions it
was built with, the GPU, and the weights' hash. Every REFRESH_S the agent compares each
TensorRT-LLM deployment's manifest with the node as it is now (NVML, and the drill's
version probe, re-run every PROBE_EVERY_S): "current", "stale" with the reasons, or
"unknown". `what_if` answers the same for a hypothetical node (a driver upgrade, another
GPU), with the time its last drill took.

Each deployment runs one of TensorRT-LLM's two backends (`backend_of`): the engine
backend serves an engine trtllm-build compiled, so a change makes it rebuild; the PyTorch
backend loads the checkpoint with no build, so a change makes it re-validate (against
the baseline, its warm-up and compile caches cold).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import time
from pathlib import Path
from typing import Any, Literal

from console.agent.api.auth import child_env
from console.agent.drills import manifest
from console.agent.drills.plan import plan, values
from console.agent.jobs.kinds import JobHost
from console.agent.supervise.processes import capped_output
from console.core.config.load import Deployment, Drill, Model
from console.core.drills.trtllm_releases import ENGINE_BACKEND_LAST, has_engine_backend
from console.core.wire import TrtEngine

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 120.0
PROBE_MAX_BYTES = 1 << 20  # a version probe prints one JSON line
PROBE_EVERY_S = 600.0  # the staleness check re-runs a drill's version probe this often
REFRESH_S = 10.0  # and compares manifests with the node this often

Backend = Literal["engine", "pytorch"]


class TrtStaleness:
    def __init__(self, host: JobHost, root: Path) -> None:
        self.host = host
        self.agent = host.agent
        self.hasher = manifest.WeightsHasher(root / "weights-hashes.json")
        self.probed: dict[str, tuple[float, dict[str, Any]]] = {}  # drill -> (when, output)
        self.engines: list[TrtEngine] = []
        self._task: asyncio.Task[None] | None = None

    # -- what this node has ---------------------------------------------------------

    def drills(self) -> dict[str, Drill]:
        """The fleet's drills whose deployment is on this node."""
        out = {}
        for name, drill in self.agent.fleet.drills.items():
            found = self.agent.fleet.deployment(drill.deployment)
            if found is not None and found[1].node == self.agent.node:
                out[name] = drill
        return out

    def trt_deployments(self) -> list[tuple[Model, Deployment]]:
        targets = {d.deployment for d in self.drills().values()}
        return [
            (m, d)
            for m, d in self.agent.fleet.deployments_on(self.agent.node)
            if d.engine == "trtllm" or d.engine_dir is not None or d.id in targets
        ]

    def drill_for(self, deployment: str) -> tuple[str, Drill] | None:
        return next(((n, d) for n, d in self.drills().items() if d.deployment == deployment), None)

    def backend_of(self, deployment: str, built: dict[str, Any] | None) -> Backend | None:
        """The backend a deployment runs, "engine" or "pytorch": the pipeline its manifest
        was built by, else its drill's; None when neither says."""
        pipeline = (built or {}).get("pipeline")
        if pipeline == "engine":
            return "engine"
        if pipeline == "pytorch":
            return "pytorch"
        drill = self.drill_for(deployment)
        return drill[1].pipeline if drill is not None else None

    async def facts(self, probed: dict[str, Any]) -> tuple[dict[str, str | None], dict[str, str]]:
        """The node's facts: NVML where it answers, else what the probe printed."""
        gpus, status = await self.agent.fresh_gpus()
        gpu = gpus[0] if gpus else None
        nvml: dict[str, str | None] = {
            "driver": self.agent.gpu.driver_version if status == "ok" else None,
            "gpu": gpu.name if gpu else None,
            "compute_capability": gpu.compute_capability if gpu else None,
        }
        facts: dict[str, str | None] = {}
        sources: dict[str, str] = {}
        for key in manifest.FACTS:
            from_probe = probed.get(key)
            if key == "cuda":  # the runtime's CUDA first, else the driver's
                value = from_probe or (
                    self.agent.gpu.cuda_driver_version if status == "ok" else None
                )
                source = "probe" if from_probe else "nvml"
            elif nvml.get(key) is not None:
                value, source = nvml[key], "nvml"
            else:
                value, source = from_probe, "probe"
            facts[key] = None if value is None else str(value)
            if value is not None:
                sources[key] = source
        return facts, sources

    # -- staleness ------------------------------------------------------------------

    def start(self) -> None:
        if self.trt_deployments():
            self._task = asyncio.create_task(self._refresh_loop(), name="trt-staleness")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _refresh_loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:
                log.exception("staleness check failed")
            await asyncio.sleep(REFRESH_S)

    async def _probe(self, name: str, drill: Drill) -> dict[str, Any] | None:
        """The drill's version probe, cached for PROBE_EVERY_S."""
        known = self.probed.get(name)
        if known is not None and time.time() - known[0] < PROBE_EVERY_S:
            return known[1]
        found = values(drill, "", Path("/nonexistent"), Path("/nonexistent"), "")
        argv = plan(drill, found)["preflight"].argv
        if argv is None:
            return None
        env = child_env(self.agent.fleet, drill.env)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except OSError:
            return None
        out = await capped_output(proc, PROBE_MAX_BYTES, PROBE_TIMEOUT_S)
        if out is None:
            log.warning(
                "drill %s: the version probe ran over %g s or wrote over %d bytes; killed",
                name,
                PROBE_TIMEOUT_S,
                PROBE_MAX_BYTES,
            )
            return None
        probed = last_json(out.decode(errors="replace"))
        if probed is not None:
            self.probed[name] = (time.time(), probed)
        return probed

    async def current_facts(self, deployment: str) -> tuple[dict[str, str | None], str | None]:
        """What the node is now, for a deployment's engine; and why a part is unknown."""
        found = self.drill_for(deployment)
        probed: dict[str, Any] = {}
        note = None
        if found is not None:
            probed = await self._probe(*found) or {}
            if not probed:
                note = f"drill {found[0]}'s version probe gave no answer"
        else:
            note = "no drill for this deployment declares a version probe"
        facts, _ = await self.facts(probed)
        return facts, note

    async def check(self, model: Model, dep: Deployment) -> TrtEngine:
        entry = TrtEngine(
            deployment=dep.id, model=model.name, engine_dir=dep.engine_dir, state="unknown"
        )
        entry.last_drill = self._last_drill(dep.id)
        entry.backend = self.backend_of(dep.id, None)
        if dep.engine_dir is None:
            entry.reasons = ["unknown provenance: the deployment has no engine_dir in fleet.toml"]
            return entry
        engine_dir = Path(dep.engine_dir).expanduser()
        found = await asyncio.to_thread(manifest.read_manifest, engine_dir)
        entry.backend = self.backend_of(dep.id, found)
        if found is None:
            entry.reasons = [f"unknown provenance: no engineroom manifest in {engine_dir}"]
            return entry
        facts, note = await self.current_facts(dep.id)
        checkpoint = Path(found.get("model", {}).get("checkpoint", ""))
        try:
            facts["weights_sha256"] = await asyncio.to_thread(self.hasher.hash, checkpoint)
        except OSError as exc:
            facts["weights_sha256"] = None
            note = f"{note}; " if note else ""
            note += f"weights not checked: {exc}"
        entry.build_key = found.get("build_key")
        entry.built = found.get("built")
        gpu = found.get("gpu", {})
        entry.built_with = {
            **found.get("versions", {}),
            "gpu": gpu.get("name"),
            "compute_capability": gpu.get("compute_capability"),
        }
        entry.reasons = manifest.stale_reasons(found, facts)
        entry.unchecked = manifest.unknown_facts(facts, entry.backend)
        entry.note = note
        if entry.reasons:
            entry.state = "stale"
        elif entry.unchecked:  # nothing wrong found, but not all of it could be looked at
            entry.state = "unknown"
            entry.reasons = [
                f"could not check {', '.join(entry.unchecked)}" + (f" ({note})" if note else "")
            ]
        else:
            entry.state = "current"
        return entry

    async def refresh(self) -> list[TrtEngine]:
        self.engines = [await self.check(m, d) for m, d in self.trt_deployments()]
        return self.engines

    def view(self) -> list[TrtEngine]:
        return list(self.engines)

    def _last_drill(self, deployment: str) -> dict[str, Any] | None:
        for record in self.host.store.jobs(500, ("drill.run",)):
            if record.state not in ("succeeded", "failed"):
                continue
            stored = (record.result or {}).get("result", {})
            if stored.get("deployment") != deployment:
                continue
            return {
                "job_id": record.id,
                "state": record.state,
                "ended": record.updated,
                "total_s": round(record.updated - record.created, 1),
                "time_to_rebuild_s": stored.get("time_to_rebuild_s"),
            }
        return None

    def _last_success(self, deployment: str) -> float | None:
        for record in self.host.store.jobs(500, ("drill.run",)):
            stored = (record.result or {}).get("result", {})
            if (
                record.state == "succeeded"
                and stored.get("deployment") == deployment
                and isinstance(stored.get("time_to_rebuild_s"), int | float)
            ):
                return float(stored["time_to_rebuild_s"])
        return None

    async def what_if(self, change: dict[str, Any]) -> list[dict[str, Any]]:
        """Each TensorRT-LLM deployment against a hypothetical node (driver, cuda,
        tensorrt, tensorrt_llm, gpu, compute_capability), with its backend and the time
        its last drill took: still serves ("serves"); on the engine backend, serves from
        the cache ("cache") or needs a rebuild ("rebuild"); on the PyTorch backend, needs
        no build but a validation against the baseline, caches cold ("re-validate");
        "unknown" where a fact the change leaves alone could not be read."""
        unknown = sorted(set(change) - set(manifest.FACTS))
        if unknown:
            raise ValueError(f"unknown keys {unknown} (known: {', '.join(manifest.FACTS)})")
        change = {k: str(v) for k, v in change.items() if v is not None}
        if "gpu" in change and "compute_capability" not in change:
            cc = manifest.compute_capability_of(change["gpu"])
            change["compute_capability"] = cc or f"unknown for {change['gpu']}"
        out = []
        for model, dep in self.trt_deployments():
            row: dict[str, Any] = {
                "node": self.agent.node,
                "deployment": dep.id,
                "model": model.name,
            }
            found = (
                manifest.read_manifest(Path(dep.engine_dir).expanduser())
                if dep.engine_dir
                else None
            )
            backend = row["backend"] = self.backend_of(dep.id, found)
            estimate = self._last_success(dep.id)
            row["estimated_rebuild_s"] = estimate
            if found is None:  # nothing says how it was built: no verdict, not a rebuild
                row.update(
                    verdict="unknown",
                    why=["unknown provenance: no manifest to compare; a drill records one"],
                )
                out.append(row)
                continue
            facts, _ = await self.current_facts(dep.id)
            try:
                facts["weights_sha256"] = await asyncio.to_thread(
                    self.hasher.hash, Path(found["model"]["checkpoint"])
                )
            except (OSError, KeyError):
                facts["weights_sha256"] = None
            now_reasons = manifest.stale_reasons(found, facts)
            facts.update(change)
            reasons = manifest.stale_reasons(found, facts)
            row["why"] = reasons
            row["stale_now"] = bool(now_reasons)
            unchecked = manifest.unknown_facts(facts, backend)
            if not reasons and unchecked:
                row["verdict"] = "unknown"
                row["why"] = [f"could not check {', '.join(unchecked)}"]
            elif not reasons:
                row["verdict"] = "serves"
            elif backend == "pytorch":  # no engine to build: the new stack is validated
                row["verdict"] = "re-validate"
            else:
                release = change.get("tensorrt_llm")
                if release is not None and has_engine_backend(release) is False:
                    row["why"] = [
                        *reasons,
                        f"TensorRT-LLM {release} has no engine backend (removed after "
                        f'{ENGINE_BACKEND_LAST}): its drill must move to pipeline = "pytorch"',
                    ]
                inputs = manifest.manifest_inputs(found)
                inputs.update({k: facts.get(k) for k in manifest.FACTS})
                if facts.get("weights_sha256"):
                    inputs["weights_sha256"] = facts["weights_sha256"]
                key = manifest.build_key(inputs)
                drill = self.drill_for(dep.id)
                roots = {Path(dep.engine_dir).expanduser().resolve().parent}  # type: ignore[arg-type]
                if drill is not None:
                    roots.add(Path(drill[1].engine_cache).expanduser())
                hit = next((r / key for r in roots if manifest.read_manifest(r / key)), None)
                row["build_key"] = key
                row["verdict"] = "cache" if hit else "rebuild"
                if hit:
                    row["cached"] = str(hit)
            out.append(row)
        return out


# -- helpers ------------------------------------------------------------------------


def last_json(output: str) -> dict[str, Any] | None:
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                data = json.loads(line)
                if isinstance(data, dict):
                    return data
    return None
