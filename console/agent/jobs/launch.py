"""The agent's side of a launch: the profile's engine plugin builds the argv
(`EnginePlugin.launch`, over console.core.launch's checks of the overrides) and names the
log lines of its cold start (`ready_phases`). Nothing here knows an engine by name.

Used by the job runner (console.agent.jobs.runner) for `vllm.start` and `engine.restart`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from console.core.config.load import Profile
from console.core.launch import Launch, LaunchError
from console.core.plugin import Phases, plugin_kinds

__all__ = ["Launch", "LaunchError", "engine_launch", "ready_phases", "vllm_launch"]


def engine_launch(profile: Profile, overrides: Mapping[str, Any] | None = None) -> Launch:
    """The argv and environment that start `profile`, with `overrides` applied."""
    cls = plugin_kinds().get(profile.engine)
    if cls is None:
        raise LaunchError(f"engine: no engine plugin {profile.engine!r} is loaded")
    if not cls.can_launch:
        raise LaunchError(f"engine: the agent does not start {profile.engine} engines")
    return cls().launch(profile, overrides or {})


# The name the job runner calls it by: starts are vLLM's today, the plugin decides.
vllm_launch = engine_launch


def ready_phases(kind: str) -> Phases:
    """The cold-start phases an engine of `kind` logs, from its plugin (none: unknown)."""
    cls = plugin_kinds().get(kind)
    return cls.ready_phases if cls is not None else ()
