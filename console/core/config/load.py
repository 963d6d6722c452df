"""fleet.toml: loading and validation.

A bad file gets one clear message that names the file, the line and what is wrong, and
nothing starts. The typed model the file is read into, and the errors, live in
console.core.config.model (the modules this one checks a file with import it); the names
a fleet's readers use are re-exported here, so `from console.core.config.load import Fleet,
load_fleet` stays one line.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from console.core.config.model import (
    DEFAULT_ADMIN_ENV,
    DEFAULT_GATEWAY_VIEWER_ENV,
    DEFAULT_OPERATOR_ENV,
    DEFAULT_VIEWER_ENV,
    AgentSection,
    ArgValue,
    ConfigError,
    DataPlaneSection,
    Deployment,
    Drill,
    DrillStep,
    Fleet,
    GatewaySection,
    MissingSecret,
    Model,
    Node,
    Profile,
    PrometheusSection,
    Slo,
)
from console.core.config.tomlpos import Path as KeyPath
from console.core.config.tomlpos import format_path, key_lines, line_of
from console.core.drills.templates import template_problems
from console.core.drills.trtllm_releases import drill_release_problems

__all__ = [
    "DEFAULT_ADMIN_ENV",
    "DEFAULT_GATEWAY_VIEWER_ENV",
    "DEFAULT_OPERATOR_ENV",
    "DEFAULT_VIEWER_ENV",
    "AgentSection",
    "ArgValue",
    "ConfigError",
    "DataPlaneSection",
    "Deployment",
    "Drill",
    "DrillStep",
    "Fleet",
    "GatewaySection",
    "MissingSecret",
    "Model",
    "Node",
    "Profile",
    "PrometheusSection",
    "Slo",
    "load_fleet",
    "parse_fleet",
]


def load_fleet(path: str | os.PathLike[str]) -> Fleet:
    """Read and validate a fleet file. Raises ConfigError with `path:line: what`."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such fleet file") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text ({exc.reason})") from None
    return parse_fleet(text, source)


def parse_fleet(text: str, source: Path = Path("fleet.toml")) -> Fleet:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        what = re.sub(r"\s*\(at (line .*|end of document)\)$", "", str(exc))
        # tomllib says "at end of document" for the last line when it has no newline.
        line = match.group(1) if match else max(1, len(text.splitlines()))
        where = f"{source}:{line}"
        raise ConfigError(f"{where}: not valid TOML: {what}") from None
    lines = key_lines(text)
    try:
        fleet = Fleet.model_validate({**raw, "source": source, "lines": lines})
    except ValidationError as exc:
        raise ConfigError(_explain(exc, source, lines, raw)) from None
    problems = _cross_check(fleet)
    if problems:
        raise ConfigError(_join(problems))
    return fleet


def _join(problems: list[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    return (
        f"{problems[0]}\n"
        + "\n".join(problems[1:6])
        + (f"\n... and {len(problems) - 6} more" if len(problems) > 6 else "")
    )


def _explain(exc: ValidationError, source: Path, lines: dict[KeyPath, int], raw: Any) -> str:
    problems = []
    for error in exc.errors():
        loc: KeyPath = tuple(error["loc"])
        line = line_of(lines, loc)
        where = f"{source}:{line}" if line else str(source)
        problems.append(f"{where}: {format_path(loc)}: {_what(error, loc, raw)}")
    return _join(problems)


def _what(error: Any, loc: KeyPath, raw: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        allowed = _allowed_keys(loc[:-1], raw)
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown key {key!r}{hint} (allowed: {', '.join(allowed)})"
    if kind == "missing":
        return f"missing required key {str(loc[-1])!r}"
    if kind == "value_error":
        return str(error.get("ctx", {}).get("error", error["msg"]))
    got = error.get("input")
    return f"{error['msg'].rstrip('.')}; got {got!r}" if got is not None else error["msg"]


def _allowed_keys(parent: KeyPath, raw: Any) -> list[str]:
    """The keys the schema allows at `parent`, found by walking the models."""
    model: Any = Fleet
    for part in parent:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part)
        if field is None:
            # a dict of models, keyed by a user's name (profiles.NAME)
            continue
        model = _inner_model(field.annotation)
    if model is None or not hasattr(model, "model_fields"):
        return []
    return [f.alias or k for k, f in model.model_fields.items() if not f.exclude]


def _inner_model(annotation: Any) -> Any:
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _engine_plugins() -> dict[str, Any]:
    """The loaded engine plugin classes by kind, and why each failed one did not load."""
    # Here, not at the top: the plugin interface brings aiohttp, which `engineroom --help`
    # and every import of this module would otherwise pay for (0.2-0.7 s).
    from console.core.plugin import plugin_failures, plugin_kinds

    return {**plugin_kinds(), **{f.kind: f for f in plugin_failures()}}


def _engine_problem(kind: str, plugins: dict[str, Any]) -> str | None:
    found = plugins.get(kind)
    if found is None:
        have = sorted(k for k, v in plugins.items() if isinstance(v, type))
        return f"unknown engine {kind!r} (have: {have})"
    if not isinstance(found, type):
        return f"engine {kind!r}: its plugin did not load ({found.error})"
    return None


def _cross_check(fleet: Fleet) -> list[str]:
    problems: list[str] = []

    def add(path: KeyPath, what: str) -> None:
        problems.append(f"{fleet.where(path)}: {format_path(path)}: {what}")

    seen_nodes: set[str] = set()
    for i, node in enumerate(fleet.nodes):
        if node.name in seen_nodes:
            add(("nodes", i, "name"), f"duplicate node name {node.name!r}")
        seen_nodes.add(node.name)
        if node.agent and node.ssh:
            add(("nodes", i), "a node needs exactly one of 'agent' (URL) or 'ssh' (user@host)")
        elif not node.agent and not node.ssh and fleet.prometheus is None:
            # With [prometheus], a node may be only a name: read from Prometheus, no actions.
            add(("nodes", i), 'needs agent = "http://HOST:PORT" or ssh = "user@host"')
        if node.agent and not node.agent.startswith(("http://", "https://")):
            add(("nodes", i, "agent"), f"must be an http:// or https:// URL, got {node.agent!r}")

    plugins = _engine_plugins()
    seen_models: set[str] = set()
    seen_deployments: set[str] = set()
    for m, model in enumerate(fleet.models):
        if model.name in seen_models:
            add(("models", m, "name"), f"duplicate model name {model.name!r}")
        seen_models.add(model.name)
        for d, dep in enumerate(model.deployments):
            here: KeyPath = ("models", m, "deployments", d)
            if dep.id in seen_deployments:
                add((*here, "id"), f"duplicate deployment id {dep.id!r}")
            seen_deployments.add(dep.id)
            if dep.node not in seen_nodes and not (fleet.prometheus and fleet.prometheus.discover):
                add((*here, "node"), f"names node {dep.node!r}, which is not in [[nodes]]")
            if (problem := _engine_problem(dep.engine, plugins)) is not None:
                add((*here, "engine"), problem)
            if dep.profile is not None and dep.profile not in fleet.profiles:
                add((*here, "profile"), f"names profile {dep.profile!r}, which is not declared")

    _check_dataplanes(fleet, add)

    for name, profile in fleet.profiles.items():
        here = ("profiles", name)
        if profile.node not in seen_nodes:
            add((*here, "node"), f"names node {profile.node!r}, which is not in [[nodes]]")
        if (problem := _engine_problem(profile.engine, plugins)) is not None:
            add((*here, "engine"), problem)

    for name, drill in fleet.drills.items():
        problems.extend(_check_drill(fleet, name, drill, plugins))
    return problems


DATAPLANE_NEEDS = {"haproxy": ("admin_socket",), "vllm-router": ("url",)}


def _check_dataplanes(fleet: Fleet, add: Callable[[KeyPath, str], None]) -> None:
    names = {"gateway"}
    for i, plane in enumerate(fleet.dataplanes):
        here: KeyPath = ("dataplanes", i)
        if plane.name in names:
            add((*here, "name"), f"duplicate data plane name {plane.name!r}")
        names.add(plane.name)
        if plane.kind not in DATAPLANE_NEEDS:
            add((*here, "kind"), f"unknown kind {plane.kind!r} (have: haproxy, vllm-router)")
            continue
        for key in DATAPLANE_NEEDS[plane.kind]:
            if getattr(plane, key) is None:
                add(here, f"a {plane.kind} data plane needs {key!r}")
    for m, model in enumerate(fleet.models):
        if model.dataplane not in names:
            add(
                ("models", m, "dataplane"),
                f"names data plane {model.dataplane!r}, which is not in [[dataplanes]] "
                f"(have: {', '.join(sorted(names))})",
            )


def _check_drill(fleet: Fleet, name: str, drill: Drill, plugins: dict[str, Any]) -> list[str]:
    def can(kind: str, flag: str) -> bool:
        found = plugins.get(kind)
        return isinstance(found, type) and bool(getattr(found, flag, False))

    here: KeyPath = ("drills", name)
    problems: list[str] = []

    def add(key: str, what: str) -> None:
        path = (*here, key) if key else here
        problems.append(f"{fleet.where(path)}: {format_path(path)}: {what}")

    model = next((m for m in fleet.models if m.name == drill.model), None)
    if model is None:
        add("model", f"names model {drill.model!r}, which is not in [[models]]")
        return problems
    ids = [d.id for d in model.deployments]
    target = next((d for d in model.deployments if d.id == drill.deployment), None)
    if target is None:
        add("deployment", f"{drill.deployment!r} is not a deployment of {drill.model} ({ids})")
    elif not can(target.engine, "serves_trtllm_engines"):
        add("deployment", f"{target.id} runs {target.engine}; a drill rebuilds a TensorRT-LLM one")
    if drill.baseline is not None and drill.baseline not in ids:
        add("baseline", f"{drill.baseline!r} is not a deployment of {drill.model} ({ids})")
    baselines = [d for d in model.deployments if can(d.engine, "drill_baseline")]
    if drill.baseline is None and not baselines:
        add("baseline", f"model {drill.model} has no vLLM deployment to validate against; name one")
    for step, what in template_problems(drill):
        problems.append(
            f"{fleet.where((*here, 'steps', step))}: {format_path((*here, 'steps', step))}: {what}"
        )
    if drill.pins.tensorrt_llm is not None:  # the release it is planned against
        for key, what in drill_release_problems(drill, drill.pins.tensorrt_llm):
            path = (*here, *key)
            problems.append(f"{fleet.where(path)}: {format_path(path)}: {what}")
    return problems
