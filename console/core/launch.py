"""From a launch profile and its overrides to the engine flags, checked: the part of every
engine's launch that is not the engine's own. A plugin's `launch()` turns the result into
its argv (plugins/vllm.py); the agent runs it (console.agent.jobs.launch,
console.agent.jobs.runner).

The agent runs only what fleet.toml declares. A console sends a profile name and
overrides; an override is accepted only where the profile marks it overridable (or, for
extra engine flags, lists it in `allowed_args`), its type is checked, and the argv is
built here and in the plugin, never through a shell. A request outside the profile raises
LaunchError with the key and the reason, and the agent answers 422 with it.

An override must not be able to add a flag the profile does not name (issue 13):

- every flag with a value is ONE argument, `--flag=value`, so a value can never be read
  as the next flag, whatever it holds;
- an override's string may not start with `-` (nor hold control characters), so even a
  parser that re-splits values sees no flag in it;
- true/false is accepted only where the profile's own value is a boolean: a boolean
  adds or drops the bare flag, and `{"args.host": false}` would otherwise drop `--host`
  and leave the engine listening on every interface.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from console.core.config.model import ArgValue, Profile

_ARG_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# Overrides a profile may mark overridable, besides "args.NAME".
TOP_LEVEL = ("port", "gpus", "tensor_parallel_size")
# Flags the agent sets itself from the profile: an override through args.NAME would get
# past the checks made on them (a second --port after the one the preflight checked wins).
AGENT_FLAGS = ("model", "served_model_name", "port", "tensor_parallel_size")
MAX_VALUE_CHARS = 4096
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class LaunchError(ValueError):
    """A launch request outside its profile; str() names the key and says why."""


@dataclass(frozen=True, slots=True)
class Launch:
    argv: tuple[str, ...]
    env: dict[str, str]
    port: int
    gpus: tuple[int, ...]
    # The engine flags as launched, overrides applied (the preflight reads
    # gpu_memory_utilization and host from here, not from the profile).
    args: Mapping[str, ArgValue] = field(default_factory=dict)


@dataclass(slots=True)
class Applied:
    """A profile with its overrides applied and checked: what a plugin builds argv from."""

    port: int
    gpus: list[int]
    tensor_parallel_size: int
    args: dict[str, ArgValue]


def flag(name: str) -> str:
    """`max_model_len` -> `--max-model-len`; LaunchError for a name that is not a flag."""
    if not _ARG_NAME.match(name):
        raise LaunchError(f"args.{name}: not a flag name (lowercase letters, digits, _)")
    return "--" + name.replace("_", "-")


def flag_args(args: Mapping[str, ArgValue]) -> list[str]:
    """Engine flags as argv: true adds the bare flag, false drops it, a value is one
    `--flag=value` argument (never a separate one that could read as a flag)."""
    out: list[str] = []
    for name, value in args.items():
        if value is True:
            out.append(flag(name))
        elif value is not False:
            out.append(f"{flag(name)}={value}")
    return out


def gpu_env(profile: Profile, gpus: list[int]) -> dict[str, str]:
    env = dict(profile.env)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    return env


def _check_type(key: str, value: Any, like: ArgValue | None) -> ArgValue:
    """An override's value against the profile's own value for the flag (None: untyped)."""
    if isinstance(value, bool) or isinstance(like, bool):
        if not isinstance(like, bool):
            has = "sets no value" if like is None else f"sets {like!r}"
            raise LaunchError(
                f"{key}: true/false only where the profile's own value is a boolean "
                f"(the profile {has}); a boolean adds or drops the flag itself"
            )
        if not isinstance(value, bool):
            raise LaunchError(f"{key}: wants true or false, got {value!r}")
        return value
    if like is None:
        if not isinstance(value, str | int | float):
            raise LaunchError(f"{key}: wants a string or a number, got {value!r}")
    elif isinstance(like, int) and not isinstance(value, int):
        raise LaunchError(f"{key}: wants an integer, got {value!r}")
    elif isinstance(like, float) and not isinstance(value, int | float):
        raise LaunchError(f"{key}: wants a number, got {value!r}")
    elif isinstance(like, str) and not isinstance(value, str):
        raise LaunchError(f"{key}: wants a string, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise LaunchError(f"{key}: wants a finite number, got {value!r}")
    if isinstance(value, str):
        _check_text(key, value)
    return value


def _check_text(key: str, value: str) -> None:
    if value.startswith("-"):
        raise LaunchError(f"{key}: a value may not start with '-' (it would read as a flag)")
    if _CONTROL.search(value):
        raise LaunchError(f"{key}: a value may not hold control characters (newline, NUL, ...)")
    if len(value) > MAX_VALUE_CHARS:
        raise LaunchError(f"{key}: longer than {MAX_VALUE_CHARS} characters")


def apply_overrides(profile: Profile, overrides: Mapping[str, Any]) -> Applied:
    """The profile's port, GPUs, TP size and flags with `overrides` applied; LaunchError
    for any override the profile does not allow or whose value does not fit."""
    port, gpus, tp = profile.port, list(profile.gpus), profile.tensor_parallel_size
    args: dict[str, ArgValue] = dict(profile.args)
    for key, value in overrides.items():
        name = key.removeprefix("args.")
        is_arg = key.startswith("args.")
        allowed = key in profile.overridable or (is_arg and name in profile.allowed_args)
        if not allowed:
            marked = ", ".join(profile.overridable + [f"args.{a}" for a in profile.allowed_args])
            raise LaunchError(
                f"{key}: the profile does not allow overriding it "
                f"(overridable: {marked or 'nothing'})"
            )
        if key == "port":
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
                raise LaunchError(f"port: wants a TCP port 1-65535, got {value!r}")
            port = value
        elif key == "gpus":
            if not isinstance(value, list) or not all(
                isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in value
            ):
                raise LaunchError(f"gpus: wants a list of GPU indexes, got {value!r}")
            gpus = list(value)
        elif key == "tensor_parallel_size":
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LaunchError(f"tensor_parallel_size: wants an integer >= 1, got {value!r}")
            tp = value
        elif is_arg:
            flag(name)
            if name in AGENT_FLAGS:
                raise LaunchError(
                    f"{key}: the agent sets {flag(name)} itself from the profile's {name}"
                    + (f"; override {name!r} instead" if name in TOP_LEVEL else "")
                )
            args[name] = _check_type(key, value, profile.args.get(name))
        else:
            raise LaunchError(f"{key}: not something a launch can override ({TOP_LEVEL})")
    if gpus and tp > len(gpus):
        raise LaunchError(
            f"tensor_parallel_size {tp} needs {tp} GPUs, the launch has {len(gpus)} ({gpus})"
        )
    return Applied(port, gpus, tp, args)
