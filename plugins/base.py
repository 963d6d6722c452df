"""What every plugin module shares: the interface (defined in console.core.plugin, where
every layer reads it) and small argv and URL helpers."""

from __future__ import annotations

import math

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
    "json_number",
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
    # Any local user's process can carry such a command line: "--port ²" is a digit to
    # str.isdigit but not to int(), and raised out of discovery, which kept the agent
    # from starting.
    if value is not None and value.isascii() and value.isdigit() and 0 < int(value) < 65536:
        return int(value)
    if default is not None and (not listening or default in listening):
        return default
    return listening[0] if listening else default


def json_number(value: object) -> float | None:
    """A number from an engine's JSON as a finite float; None (unknown) for anything else:
    a string, a bool, NaN or infinity, an integer past a float's range (`float()` of it
    raises)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
