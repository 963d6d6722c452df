"""The playbook's console (tests/test_tui_operator_actions.py, tests/test_tui_diagnoses.py):
the recorded agent of cpu-1, whose tiny-trt is stale and tiny-vllm ready, and a real
gateway in front of model tiny, so the console's failovers are the gateway's jobs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from console.collect.recordings.replay import ReplayCollector
from console.core.config.load import parse_fleet
from console.core.snapshot import decode_snapshot
from console.tui.app import EngineroomApp
from tests.engines.servers import free_port, stop
from tests.support.fleet import deployment, fleet_toml, vllm_profile
from tests.test_hardening_clients import Gateway, start_gateway
from tests.tui_support import ROOT

DRILLS = ROOT / "tests" / "fixtures" / "snapshot-cpu-drills.json"


def playbook_fleet(gw_port: int, gw_state: Path | str, other: int, trt: int, vllm: int) -> str:
    """The nodes and the recorded agent of tests/tui_support.py: on cpu-1, tiny-trt's engine
    is stale and tiny-vllm is ready. A vLLM deployment on h200 is declared first; the
    standby, the one with a launch profile, is tiny-vllm."""
    return fleet_toml(
        fleet={"name": "recorded", "refresh_s": 0.5},
        gateway={"url": f"http://127.0.0.1:{gw_port}", "token_env": "T_ADMIN",
                 "state_dir": gw_state},
        nodes=[{"name": "h200", "agent": "http://127.0.0.1:1"},
               {"name": "cpu-1", "agent": "http://127.0.0.1:2"}],
        profiles={"tiny-standby": vllm_profile("cpu-1", "/models/tiny", vllm, None, args=None)},
        models=[{"name": "tiny", "deployments": [
            deployment("tiny-vllm-h200", "h200", "vllm", other, weight=0),
            deployment("tiny-trt", "cpu-1", "triton", trt, engine_model="ensemble", weight=100),
            deployment("tiny-vllm", "cpu-1", "vllm", vllm, weight=0, profile="tiny-standby"),
        ]}],
        drills={"tiny-bf16": {"model": "tiny", "deployment": "tiny-trt",
                              "checkpoint": "/models/tiny"}},
    )  # fmt: skip


@contextlib.contextmanager
def playbook_console(tmp_path: Path) -> Iterator[tuple[EngineroomApp, Gateway]]:
    """The console on playbook_fleet (cpu-1 as recorded, h200 silent) and the real gateway
    it names, stopped on the way out. The console's admin token (T_ADMIN) is the caller's
    to set."""
    gw_port = free_port()
    text = playbook_fleet(gw_port, tmp_path / "gw-state", free_port(), free_port(), free_port())
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    gateway = start_gateway(path, gw_port)
    try:
        fleet = parse_fleet(text)
        recorded = {"h200": None, "cpu-1": decode_snapshot(DRILLS.read_text())}
        yield EngineroomApp(fleet, collector=ReplayCollector(fleet, recorded)), gateway
    finally:
        stop(gateway.process, grace=5)
