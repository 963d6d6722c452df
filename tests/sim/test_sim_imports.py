"""console.sim never imports Textual: the demo's agents are headless like the real ones."""

from __future__ import annotations

import subprocess
import sys

MODULES = [
    "console.sim",
    "console.sim.load",
    "console.sim.nvml",
    "console.sim.engines",
    "console.sim.fleetfile",
    "console.sim.fleet",
    "console.sim.scale",
    "console.sim.__main__",
]


def test_console_sim_does_not_import_textual():
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in MODULES)
        + "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] == 'textual')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
