"""Engine plugins: loaded in one place, a broken one costs only its own kind, and each
owns what the console knows of its engine (launch argv, cold-start phases, capabilities)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

from console.core.config.load import parse_fleet
from console.core.plugin import BUILTIN, load_from, plugin_kinds
from console.core.wire import COLD_START_PHASES
from tests.test_agent_api import FLEET as AGENT_FLEET  # a local agent's fleet

ROOT = Path(__file__).resolve().parent.parent


def _install_broken_plugin(site: Path) -> None:
    """A third-party engine plugin, registered through real package metadata, whose
    module raises on import (a missing dependency on this node, say)."""
    (site / "sglang_engine.py").write_text(
        "raise RuntimeError('sglang_engine needs the sglang package, not installed here')\n"
    )
    dist = site / "sglang_engine-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-engine\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[engineroom.engines]\nsglang = sglang_engine:SglangPlugin\n"
    )


FLEET_USING = """
[fleet]
name = "t"
[[nodes]]
name = "gpu-a1"
agent = "http://127.0.0.1:9410"
[[models]]
name = "llama"
[[models.deployments]]
id = "llama-{kind}"
engine = "{kind}"
node = "gpu-a1"
endpoint = "http://127.0.0.1:8001"
"""

PROBE = """
import json, sys
from console.core.config.load import ConfigError, parse_fleet
from plugins import load_plugins, plugin_failures
found = {"loaded": sorted(load_plugins()), "failed": [str(f) for f in plugin_failures()]}
parse_fleet(sys.argv[1].format(kind="vllm"))  # a fleet that does not use it loads
try:
    parse_fleet(sys.argv[1].format(kind="sglang"))
except ConfigError as exc:
    found["config_error"] = str(exc)
print(json.dumps(found))
"""


def test_a_plugin_that_raises_on_import_is_named_and_the_console_carries_on(tmp_path):
    _install_broken_plugin(tmp_path)
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, FLEET_USING],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["loaded"] == ["triton", "trtllm", "vllm"]
    assert found["failed"] == [
        "engine plugin 'sglang' (sglang_engine:SglangPlugin) did not load: RuntimeError: "
        "sglang_engine needs the sglang package, not installed here"
    ]
    # A fleet that uses the broken kind says which plugin and why, at its line.
    where = "fleet.toml:11: models[0].deployments[0].engine: engine 'sglang': its plugin "
    assert where in found["config_error"]
    assert "RuntimeError: sglang_engine needs the sglang package" in found["config_error"]
    assert "engine plugin 'sglang'" in result.stderr  # logged, one line, no traceback
    assert "Traceback" not in result.stderr


def test_a_registered_object_that_is_not_a_plugin_is_refused_by_name(tmp_path, monkeypatch):
    (tmp_path / "not_a_plugin.py").write_text("class Engine:\n    kind = 'odd'\n")
    (tmp_path / "wrong_kind.py").write_text(
        "from plugins.vllm import VllmPlugin\nclass Renamed(VllmPlugin):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    found = load_from(
        [
            EntryPoint("odd", "not_a_plugin:Engine", "engineroom.engines"),
            EntryPoint("other", "wrong_kind:Renamed", "engineroom.engines"),
            # A third party cannot replace a built-in engine by registering its kind.
            EntryPoint("vllm", "not_a_plugin:Engine", "engineroom.engines"),
        ]
    )
    assert sorted(found.loaded) == sorted(BUILTIN)
    assert sorted(found.failed) == ["odd", "other"]
    assert "not_a_plugin:Engine is not an EnginePlugin subclass" in str(found.failed["odd"])
    assert "its kind is 'vllm', registered as 'other'" in str(found.failed["other"])


def test_an_unknown_engine_kind_lists_the_loaded_ones():
    try:
        parse_fleet(FLEET_USING.format(kind="sglang"))
    except Exception as exc:
        assert "unknown engine 'sglang' (have: ['triton', 'trtllm', 'vllm'])" in str(exc)
    else:
        raise AssertionError("a fleet naming an engine no plugin serves loaded")


def test_each_engine_says_what_it_can_do():
    kinds = plugin_kinds()
    assert [k for k, p in kinds.items() if p.can_launch] == ["vllm"]
    assert [k for k, p in kinds.items() if p.needs_translation] == ["triton"]
    assert sorted(k for k, p in kinds.items() if p.serves_trtllm_engines) == ["triton", "trtllm"]
    for kind, plugin in kinds.items():
        unknown = [phase for phase, _ in plugin.ready_phases if phase not in COLD_START_PHASES]
        assert unknown == [], f"{kind}'s ready_phases name phases the wire does not carry"
        assert plugin.ready_phases or not plugin.can_launch, f"{kind} starts without phases"


def test_an_agent_with_a_broken_plugin_serves_and_says_which(agent_factory, tmp_path):
    """The node's agent starts with the plugins that load, and its snapshot says which
    did not (the node screen and `check --json` show a snapshot's `missing`)."""
    _install_broken_plugin(tmp_path)
    agent = agent_factory(AGENT_FLEET, PYTHONPATH=str(tmp_path))
    missing = agent.snapshot()["missing"]
    assert missing == [
        "sglang engines: engine plugin 'sglang' (sglang_engine:SglangPlugin) did not load: "
        "RuntimeError: sglang_engine needs the sglang package, not installed here"
    ]
