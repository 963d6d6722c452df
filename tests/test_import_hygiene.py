"""The headless packages never import Textual: the agent runs on GPU nodes without it, and
the simulated fleet's agents are headless like the real ones."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

HEADLESS = [
    "console.core.config.load",
    "console.core.metrics.window",
    "console.agent.api.app",
    "console.agent.snapshot.node",
    "console.collect",
    "console.collect.sources.collector",
    "console.collect.views.view",
    "console.collect.views.check",
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
    "console.sim.trtllm_double",
    "console.sim.trtllm_double_build",
    "console.sim.trtllm_double_serve",
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
    ("console/commands", ["tests"], "the command line's verbs may call any layer"),
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


# The command line is the top: no layer below imports a verb or the parser.
BELOW_THE_COMMAND_LINE = [f"console/{layer}" for layer in (*CONSOLE_LAYERS, "core")] + ["plugins"]
# The verbs that open the TUI, and only inside their run: `engineroom --help`, the agent
# and the headless verbs never load it.
OPENS_THE_TUI = {"tui.py", "replay.py", "serve.py"}


@pytest.mark.parametrize("package", BELOW_THE_COMMAND_LINE)
def test_no_layer_imports_the_command_line(package):
    assert layer_violations(package, ["console.cli", "console.commands"]) == []


def test_the_verbs_import_the_tui_only_when_they_open_it():
    wrong = []
    for path in sorted((ROOT / "console" / "commands").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        in_a_function = {id(inner) for f in functions for inner in ast.walk(f)}
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if not any(n == "console.tui" or n.startswith("console.tui.") for n in names):
                continue
            if path.name not in OPENS_THE_TUI or id(node) not in in_a_function:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert wrong == []


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


# -- import circles and module size (issue 29) -------------------------------------------
# Every import counts, a lazy one or one under TYPE_CHECKING too: a back-reference to a
# parent goes through a small protocol, never the concrete class's module.

MAX_MODULE_LINES = 600


def _module_names(root: Path, package: str) -> dict[str, Path]:
    names = {}
    for path in sorted((root / package).rglob("*.py")):
        dotted = ".".join(path.relative_to(root).with_suffix("").parts)
        names[dotted.removesuffix(".__init__")] = path
    return names


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Each module of `package` and the modules of `package` it imports: `from a.b import c`
    is an edge to a.b.c where that is a module, else to a.b."""
    names = _module_names(root, package)
    graph: dict[str, set[str]] = {name: set() for name in names}
    for name, path in names.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base
                    for alias in node.names
                ]
            graph[name] |= {t for t in targets if t in names and t != name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
    return circles


@pytest.mark.parametrize("package", ["console", "plugins"])
def test_no_module_imports_itself_through_a_circle(package):
    assert import_circles(import_graph(ROOT, package)) == []


def test_the_circle_check_sees_a_circle_through_a_lazy_import(tmp_path):
    pkg = tmp_path / "console" / "feature"
    pkg.mkdir(parents=True)
    (tmp_path / "console" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from console.feature import b\n")
    (pkg / "b.py").write_text("def f():\n    from .c import g\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from console.feature.a import A\n")  # fmt: skip
    (pkg / "d.py").write_text("from console.feature import c\n")
    assert import_circles(import_graph(tmp_path, "console")) == [
        ["console.feature.a", "console.feature.b", "console.feature.c"]
    ]


@pytest.mark.parametrize("package", ["console", "plugins", "bench"])
def test_no_module_is_over_600_lines(package):
    long = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for path in sorted((ROOT / package).rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert long == []
