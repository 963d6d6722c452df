"""Engine plugins, found through the entry-point group "engineroom.engines"."""

from __future__ import annotations

from importlib.metadata import entry_points

from plugins.base import EnginePlugin

GROUP = "engineroom.engines"


def load_plugins() -> dict[str, EnginePlugin]:
    """One instance of every registered engine plugin, by kind.

    The built-in plugins are always present, even from a source checkout without
    installed metadata; third-party plugins come from the entry points.
    """
    from plugins.triton import TritonPlugin
    from plugins.trtllm import TrtllmPlugin
    from plugins.vllm import VllmPlugin

    found: dict[str, EnginePlugin] = {
        p.kind: p for p in (VllmPlugin(), TritonPlugin(), TrtllmPlugin())
    }
    for ep in entry_points(group=GROUP):
        if ep.name in found:
            continue
        cls = ep.load()
        if isinstance(cls, type) and issubclass(cls, EnginePlugin):
            found[ep.name] = cls()
    return found


__all__ = ["GROUP", "EnginePlugin", "load_plugins"]
