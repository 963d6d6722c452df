"""What every plugin module shares: the interface (defined in console.core.plugin, where
every layer reads it) and small argv and URL helpers."""

from __future__ import annotations

from console.core.plugin import (
    Discovered,
    EnginePlugin,
    EngineTarget,
    Phases,
    ProbeContext,
    PromSeries,
)

__all__ = [
    "Discovered",
    "EnginePlugin",
    "EngineTarget",
    "Phases",
    "ProbeContext",
    "PromSeries",
    "flag_value",
    "local_url",
    "port_from",
]


def flag_value(cmdline: list[str], *names: str) -> str | None:
    """The value of `--name V` or `--name=V` in an argv list."""
    for i, arg in enumerate(cmdline):
        for name in names:
            if arg == name and i + 1 < len(cmdline):
                return cmdline[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def local_url(host: str | None, port: int) -> str:
    """A URL the agent can reach for a server bound to `host`."""
    if not host or host in ("0.0.0.0", "::", "[::]", "localhost"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def port_from(
    cmdline: list[str], names: tuple[str, ...], listening: list[int], default: int | None
) -> int | None:
    value = flag_value(cmdline, *names)
    if value is not None and value.isdigit():
        return int(value)
    if default is not None and (not listening or default in listening):
        return default
    return listening[0] if listening else default
