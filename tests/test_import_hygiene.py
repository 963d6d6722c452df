"""The headless packages never import Textual: the agent runs on GPU nodes without it, and
the simulated fleet's agents are headless like the real ones."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEADLESS = [
    "console.core.config",
    "console.core.window",
    "console.agent.app",
    "console.agent.node",
    "console.collect",
    "console.collect.collector",
    "console.collect.view",
    "console.collect.check",
    "plugins.vllm",
    "plugins.triton",
    "plugins.trtllm",
    "console.cli",
]
SIMULATED = [
    "console.sim",
    "console.sim.load",
    "console.sim.nvml",
    "console.sim.engines",
    "console.sim.fleetfile",
    "console.sim.fleet",
    "console.sim.scale",
    "console.sim.__main__",
]


@pytest.mark.parametrize("modules", [HEADLESS, SIMULATED], ids=["headless", "sim"])
def test_headless_modules_do_not_import_textual(modules):
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "bad = sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.'))\n"
        + "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
