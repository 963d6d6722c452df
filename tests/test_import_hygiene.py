"""The headless packages never import Textual: the agent runs on GPU nodes without it."""

from __future__ import annotations

import subprocess
import sys

HEADLESS = [
    "console.core.config",
    "console.core.window",
    "console.agent.app",
    "console.agent.node",
    "console.collect",
    "plugins.vllm",
    "plugins.triton",
    "plugins.trtllm",
    "console.cli",
]


def test_headless_modules_do_not_import_textual():
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in HEADLESS)
        + "bad = sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.'))\n"
        + "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
