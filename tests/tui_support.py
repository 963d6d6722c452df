"""Support for the TUI tests: a console over recorded, real agent snapshots.

ReplayCollector (console/collect/recordings/replay.py) stands in for the network side of the
collector only: it replays snapshots that real agents printed (on the H200s and over real
vLLM + Triton), so the screens render the same way every run. The real polling and
streaming paths, against real agents, are tested in tests/test_collector.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from console.collect.recordings.replay import ReplayCollector
from console.core.config.load import parse_fleet
from console.core.snapshot import decode_snapshot
from console.tui.app import EngineroomApp
from tools.screenshots import key_names

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "docs" / "evidence" / "h200x2-agent-once.json"
CPU = ROOT / "tests" / "fixtures" / "snapshot-cpu-vllm-triton.json"

FLEET = """\
[fleet]
name = "recorded"
environment = "staging"
refresh_s = 0.2

[[nodes]]
name = "h200"
agent = "http://127.0.0.1:1"

[[nodes]]
name = "cpu-1"
agent = "http://127.0.0.1:2"

[[nodes]]
name = "gone"
agent = "http://127.0.0.1:3"

[[models]]
name = "tiny"
slo = { ttft_p95_ms = 500, itl_p95_ms = 60 }

  [[models.deployments]]
  id = "tiny-trt"
  node = "cpu-1"
  engine = "triton"
  endpoint = "http://127.0.0.1:8000"
  engine_model = "ensemble"
  weight = 100

  [[models.deployments]]
  id = "tiny-vllm"
  node = "cpu-1"
  engine = "vllm"
  endpoint = "http://127.0.0.1:8001"
  weight = 0
"""


def recorded_app(fleet_text: str = FLEET, read_only: bool = False) -> EngineroomApp:
    fleet = parse_fleet(fleet_text)
    snapshots = {
        "h200": decode_snapshot(H200.read_text()),
        "cpu-1": decode_snapshot(CPU.read_text()),
        "gone": None,
    }
    return EngineroomApp(fleet, read_only=read_only, collector=ReplayCollector(fleet, snapshots))


def keys(text: str) -> list[str]:
    """Key names for typing `text` with pilot.press."""
    return key_names(text)


async def until(
    pilot: Any, predicate: Callable[[], T], timeout: float = 20.0, what: str = "condition"
) -> T:
    """Wait for `predicate` to return something truthy, and return it; fail after
    `timeout` s. A screen that was just pushed is not yet mounted, and its widgets get
    their values on mount: wait on the state the test reads, never on time."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            break
        await pilot.pause(0.05)
    raise AssertionError(f"{what}: not met within {timeout} s")


S = TypeVar("S")


async def on_top(
    pilot: Any, app: Any, kind: type[S], timeout: float = 20.0, what: str = "condition"
) -> S:
    """The screen on top, once it is a `kind` (see until)."""
    return await until(
        pilot, lambda: app.screen if isinstance(app.screen, kind) else None, timeout, what
    )
