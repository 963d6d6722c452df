"""The GPUs this node had: what tells a GPU that fell off the bus after the agent (or the
node) restarted, when NVML no longer lists it at all.

Kept in the agent's state folder (STATE_DIR/NODE/gpus.json) across restarts: the UUIDs NVML
listed when the node had the most GPUs. While NVML lists fewer, the ones it no longer
lists are gone (the snapshot's `gpus_gone`, a GPU fault); once it lists as many again (a
GPU replaced, with a new UUID) or more, the file is the GPUs listed now. A GPU that is lost
while the agent runs keeps its place in NVML's list, its reads failing "GPU is lost"; that
one the GPU fault reads from the GPU's own errors.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from console.core.wire import GoneGpu, Gpu

log = logging.getLogger(__name__)

MAX_GPUS = 64  # kept in the file: a node has 16 at most today
MAX_FILE_BYTES = 64 * 1024


class GpuInventory:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.known: dict[str, GoneGpu] = self._load()

    def _load(self) -> dict[str, GoneGpu]:
        try:
            if self.path.stat().st_size > MAX_FILE_BYTES:
                raise ValueError(f"over {MAX_FILE_BYTES} bytes")
            data: Any = json.loads(self.path.read_text())
            gpus = [GoneGpu.model_validate(g) for g in data["gpus"][:MAX_GPUS]]
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Started over from what NVML lists now: said once, never fatal.
            log.warning("%s: not read (%s); the GPUs listed now are kept instead", self.path, exc)
            return {}
        return {g.uuid: g for g in gpus}

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            body = {"gpus": [g.model_dump() for g in self.known.values()]}
            tmp.write_text(json.dumps(body, indent=1))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("%s: not written (%s)", self.path, exc)

    def check(self, gpus: list[Gpu], now: float) -> list[GoneGpu]:
        """The GPUs the node had that NVML does not list now (only call it with a list NVML
        gave: no list is no evidence of anything)."""
        listed = {
            g.uuid: GoneGpu(uuid=g.uuid, index=g.index, name=g.name, last_seen=now)
            for g in gpus[:MAX_GPUS]
            if g.uuid
        }
        if len(listed) >= len(self.known):
            changed = listed.keys() != self.known.keys()
            self.known = listed
            if changed:
                self._save()
            return []
        for uuid, gpu in listed.items():
            if uuid in self.known:
                self.known[uuid] = gpu  # still here: seen now (in memory; saved on a change)
        return [g for uuid, g in self.known.items() if uuid not in listed]
