"""The playbook's console (tests/test_tui_operator_actions.py, tests/test_tui_diagnoses.py):
the recorded agent of cpu-1, whose tiny-trt is stale and tiny-vllm ready, and a real
gateway in front of model tiny, so the console's failovers are the gateway's jobs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from console.collect.replay import ReplayCollector
from console.core.config import parse_fleet
from console.core.snapshot import decode_snapshot
from console.tui.app import EngineroomApp
from tests.engines.servers import free_port, stop
from tests.test_hardening_clients import Gateway, start_gateway
from tests.tui_support import ROOT

DRILLS = ROOT / "tests" / "fixtures" / "snapshot-cpu-drills.json"

# The nodes and the recorded agent of tests/tui_support.py: on cpu-1, tiny-trt's engine is
# stale and tiny-vllm is ready. A vLLM deployment on h200 is declared first; the standby,
# the one with a launch profile, is tiny-vllm.
PLAYBOOK_FLEET = """\
[fleet]
name = "recorded"
refresh_s = 0.5

[gateway]
url = "http://127.0.0.1:{gw_port}"
token_env = "T_ADMIN"
state_dir = "{gw_state}"

[[nodes]]
name = "h200"
agent = "http://127.0.0.1:1"

[[nodes]]
name = "cpu-1"
agent = "http://127.0.0.1:2"

[profiles.tiny-standby]
engine = "vllm"
node = "cpu-1"
model = "/models/tiny"
served_model_name = "tiny"
port = {vllm}

[[models]]
name = "tiny"

  [[models.deployments]]
  id = "tiny-vllm-h200"
  node = "h200"
  engine = "vllm"
  endpoint = "http://127.0.0.1:{other}"
  weight = 0

  [[models.deployments]]
  id = "tiny-trt"
  node = "cpu-1"
  engine = "triton"
  endpoint = "http://127.0.0.1:{trt}"
  engine_model = "ensemble"
  weight = 100

  [[models.deployments]]
  id = "tiny-vllm"
  node = "cpu-1"
  engine = "vllm"
  endpoint = "http://127.0.0.1:{vllm}"
  weight = 0
  profile = "tiny-standby"

[drills.tiny-bf16]
model = "tiny"
deployment = "tiny-trt"
checkpoint = "/models/tiny"
"""


@contextlib.contextmanager
def playbook_console(tmp_path: Path) -> Iterator[tuple[EngineroomApp, Gateway]]:
    """The console on PLAYBOOK_FLEET (cpu-1 as recorded, h200 silent) and the real gateway
    it names, stopped on the way out. The console's admin token (T_ADMIN) is the caller's
    to set."""
    gw_port = free_port()
    text = PLAYBOOK_FLEET.format(
        gw_port=gw_port, gw_state=tmp_path / "gw-state", other=free_port(), trt=free_port(),
        vllm=free_port(),
    )  # fmt: skip
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    gateway = start_gateway(path, gw_port)
    try:
        fleet = parse_fleet(text)
        recorded = {"h200": None, "cpu-1": decode_snapshot(DRILLS.read_text())}
        yield EngineroomApp(fleet, collector=ReplayCollector(fleet, recorded)), gateway
    finally:
        stop(gateway.process, grace=5)
