"""From a launch profile and validated overrides to an argv list and environment.

The agent runs only what fleet.toml declares. A console sends a profile name and
overrides; this module accepts an override only where the profile marks it overridable
(or, for extra engine flags, lists it in `allowed_args`), checks its type, and builds
the argv itself. Nothing here goes through a shell. A request outside the profile raises
LaunchError with the key and the reason, and the agent answers 422 with it.

An override must not be able to add a flag the profile does not name (issue 13):

- every flag with a value is ONE argument, `--flag=value`, so a value can never be read
  as the next flag, whatever it holds;
- an override's string may not start with `-` (nor hold control characters), so even a
  parser that re-splits values sees no flag in it;
- true/false is accepted only where the profile's own value is a boolean: a boolean
  adds or drops the bare flag, and `{"args.host": false}` would otherwise drop `--host`
  and leave the engine listening on every interface.

Used by the job runner (console.agent.jobs) for `vllm.start` and `engine.restart`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from console.core.config import ArgValue, Profile

DEFAULT_VLLM_COMMAND = ("vllm", "serve")
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


def _flag(name: str) -> str:
    if not _ARG_NAME.match(name):
        raise LaunchError(f"args.{name}: not a flag name (lowercase letters, digits, _)")
    return "--" + name.replace("_", "-")


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


def _apply(
    profile: Profile, overrides: dict[str, Any]
) -> tuple[int, list[int], int, dict[str, ArgValue]]:
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
            _flag(name)
            if name in AGENT_FLAGS:
                raise LaunchError(
                    f"{key}: the agent sets {_flag(name)} itself from the profile's {name}"
                    + (f"; override {name!r} instead" if name in TOP_LEVEL else "")
                )
            args[name] = _check_type(key, value, profile.args.get(name))
        else:
            raise LaunchError(f"{key}: not something a launch can override ({TOP_LEVEL})")
    if gpus and tp > len(gpus):
        raise LaunchError(
            f"tensor_parallel_size {tp} needs {tp} GPUs, the launch has {len(gpus)} ({gpus})"
        )
    return port, gpus, tp, args


def vllm_launch(profile: Profile, overrides: dict[str, Any] | None = None) -> Launch:
    """The argv and environment that start `profile`, with `overrides` applied."""
    if profile.engine != "vllm":
        raise LaunchError(f"engine: this builds vLLM launches, the profile is {profile.engine!r}")
    port, gpus, tp, args = _apply(profile, overrides or {})
    command = list(profile.command or DEFAULT_VLLM_COMMAND)
    # `vllm serve MODEL` takes the model as its argument; the module entry point as --model.
    argv = (
        [*command, profile.model]
        if command[-1] == "serve"
        else [*command, f"--model={profile.model}"]
    )
    argv += [f"--served-model-name={profile.served_model_name}", f"--port={port}"]
    if tp > 1:
        argv.append(f"--tensor-parallel-size={tp}")
    if "shutdown_timeout" not in args:
        # SIGTERM drains in-flight requests for this long, inside the agent's stop grace.
        args["shutdown_timeout"] = max(1, int(profile.stop_grace_s) - 5)
    for name, value in args.items():
        if value is True:
            argv.append(_flag(name))
        elif value is not False:
            argv.append(f"{_flag(name)}={value}")  # one argument: the value is never a flag
    env = dict(profile.env)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    return Launch(tuple(argv), env, port, tuple(gpus), dict(args))
