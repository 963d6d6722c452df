"""Engine plugins, one module per engine kind, found through the entry-point group
"engineroom.engines" by console.core.plugin (the one place they are loaded)."""

from __future__ import annotations

from console.core.plugin import GROUP, EnginePlugin, load_plugins, plugin_failures, plugin_kinds

__all__ = ["GROUP", "EnginePlugin", "load_plugins", "plugin_failures", "plugin_kinds"]
