"""The headless packages never import Textual: the agent runs on GPU nodes without it, and
the simulated fleet's agents are headless like the real ones."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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


# -- layering -------------------------------------------------------------------------
# Which package may import which: the headless core is the bottom layer, plugins sit on
# it, the agent, the data layer (collect) and the gateway on both, the TUI on top. A rule
# is checked on every import statement in the package's files, function-level ones too
# (a lazy import is still a dependency).

ROOT = Path(__file__).resolve().parent.parent
CONSOLE_LAYERS = ("agent", "collect", "gateway", "tui", "sim")

# (package directory, forbidden module prefixes, why)
LAYER_RULES = [
    (
        "console/core",
        [f"console.{layer}" for layer in CONSOLE_LAYERS] + ["plugins", "tests"],
        "the core is the bottom layer: it imports no other console layer, and finds plugins "
        "through entry points",
    ),
    (
        "console/collect",
        ["console.tui", "console.agent", "console.sim", "tests"],
        "the console's data layer runs without the TUI and without the agent",
    ),
    ("console/sim", ["tests"], "the simulated fleet ships; the tests do not"),
    (
        "plugins",
        [f"console.{layer}" for layer in CONSOLE_LAYERS] + ["console.cli", "tests"],
        "an engine plugin needs only the core",
    ),
    (
        "console/gateway",
        ["console.agent", "console.tui", "tests"],
        "the gateway runs apart from the agent (its SQLite store is the core's)",
    ),
]


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def layer_violations(package: str, forbidden: list[str]) -> list[str]:
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, module in _imports(path):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                out.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return out


@pytest.mark.parametrize(
    ("package", "forbidden", "why"), LAYER_RULES, ids=[rule[0] for rule in LAYER_RULES]
)
def test_each_layer_imports_only_the_layers_below_it(package, forbidden, why):
    assert layer_violations(package, forbidden) == [], why


def test_the_layering_check_sees_a_lazy_import(tmp_path, monkeypatch):
    """The rule reads function-level imports too: the core's old lazy import of the agent's
    drill templates (config.py) is what it must catch."""
    core = tmp_path / "console" / "core"
    core.mkdir(parents=True)
    (core / "config.py").write_text(
        "def check():\n    from console.agent.drill_plan import template_problems\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert layer_violations("console/core", ["console.agent"]) == [
        "console/core/config.py:2 imports console.agent.drill_plan"
    ]
