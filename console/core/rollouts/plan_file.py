"""A rollout plan as a file (issue 31): its typed model, the fleet digest it is tied to,
and how it is written (JSON, or TOML) and read back.

A plan is made by console.core.rollouts.planner from fleet.toml and read later, maybe after a
review in git, by `engineroom rollout check` and one day `rollout run`. So the file is
strict: every key is known, the version is the one this engineroom reads, and a file that
is not a plan is refused with the file and what is wrong, never half read. Whether a plan
that reads well still fits the fleet (its deployments, the digest, the rules) is
console.core.rollouts.planner's `check_plan`. The format, key by key: docs/rollouts.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from console.core.atomicfile import replace_text
from console.core.config.model import Fleet
from console.core.config.tomlpos import Path as KeyPath
from console.core.config.tomlpos import format_path, key_lines, line_of

VERSION: Final = 1
KIND: Final = "engineroom-rollout-plan"
MAX_PLAN_BYTES = 64 * 2**20  # 10,000 deployments take about 2 MB of JSON
DEFAULT_TOLERANCE = 1.2  # p95 TTFT and ITL after the operation over the baseline before it
MAX_SHOWN_PROBLEMS = 6  # a refusal lists this many problems, then counts the rest

Operation = Literal["restart", "profile", "drill"]
# A step's operation: the plan's own, or the standby started before a model's canary.
StepOperation = Literal["restart", "profile", "drill", "start-standby"]


class PlanError(Exception):
    """A plan file that cannot be used, worded for the operator: `FILE: what is wrong`."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


Ratio = Annotated[float, Field(ge=1.0, le=100.0)]


class Tolerance(_Strict):
    """How much slower than its own baseline a deployment may come back: its p95 TTFT and
    ITL over the verification window, divided by the same before the drain."""

    ttft_p95_ratio: Ratio = DEFAULT_TOLERANCE
    itl_p95_ratio: Ratio = DEFAULT_TOLERANCE


class Selection(_Strict):
    """What the operator asked for (the plan's waves are what it came to): kept so a
    reviewer sees why each deployment is in the plan."""

    models: list[str] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list)
    deployments: list[str] = Field(default_factory=list)
    what_if: dict[str, str] = Field(default_factory=dict)  # the hypothetical node's facts


class Step(_Strict):
    """One deployment's turn in a wave."""

    model: str
    deployment: str
    node: str
    engine: str
    operation: StepOperation
    canary: bool = False
    profile: str | None = None  # operation "profile": the new one; "start-standby": its own
    drill: str | None = None  # operation "drill": the drill that rebuilds this deployment

    @model_validator(mode="after")
    def _keys_of_its_operation(self) -> Step:
        if (self.profile is not None) != (self.operation in ("profile", "start-standby")):
            raise ValueError(
                f"a {self.operation} step names a profile exactly when it moves "
                "to one or starts a standby from it"
            )
        if (self.drill is not None) != (self.operation == "drill"):
            raise ValueError(f"a {self.operation} step names a drill exactly when it runs one")
        if self.canary and self.operation == "start-standby":
            raise ValueError("a standby's start is no canary")
        return self


class Wave(_Strict):
    steps: list[Step]


class Plan(_Strict):
    kind: Literal["engineroom-rollout-plan"] = KIND
    version: Literal[1] = VERSION
    fleet: str  # [fleet] name
    fleet_digest: Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
    operation: Operation
    profile: str | None = None  # operation "profile": the launch profile moved to
    tolerance: Tolerance = Tolerance()
    max_unavailable: Annotated[int, Field(ge=1)]
    canary: Annotated[int, Field(ge=1)]
    allow_standby: bool = False
    selection: Selection = Selection()
    waves: list[Wave]

    @model_validator(mode="after")
    def _profile_of_its_operation(self) -> Plan:
        if (self.profile is not None) != (self.operation == "profile"):
            raise ValueError('profile is set exactly when the operation is "profile"')
        return self

    def steps(self) -> list[tuple[int, int, Step]]:
        """(wave index, step index, step), in order."""
        return [
            (w, s, step) for w, wave in enumerate(self.waves) for s, step in enumerate(wave.steps)
        ]


def fleet_digest(fleet: Fleet) -> str:
    """A digest of the fleet's models and deployments as fleet.toml declares them (ids,
    nodes, engines, weights, profiles, endpoints): a plan made on one set is refused on
    another, since its waves were cut for those weights."""
    shape = [
        [model.name, [dep.model_dump(mode="json") for dep in model.deployments]]
        for model in fleet.models
    ]
    text = json.dumps(shape, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


# -- writing ----------------------------------------------------------------------------


def is_toml(path: str | os.PathLike[str]) -> bool:
    return Path(path).suffix.lower() == ".toml"


def to_data(plan: Plan) -> dict[str, Any]:
    """The plan as plain data; unset optional keys are left out (TOML has no null)."""
    return plan.model_dump(mode="json", exclude_none=True)


def to_json(plan: Plan) -> str:
    return json.dumps(to_data(plan), indent=1, ensure_ascii=True) + "\n"


def to_toml(plan: Plan) -> str:
    """The plan as TOML: the settings, [tolerance], [selection], then one [[waves]] each
    with its steps one a line. Written here, not through a TOML library: the shape is fixed,
    and tomlkit took 6 s for 10,000 steps (bench.rollout_plan)."""
    data = to_data(plan)
    waves = data.pop("waves")
    lines = [
        "# engineroom rollout plan (docs/rollouts.md)",
        "# check it against the fleet: engineroom rollout check FILE",
    ]
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in data.items() if k not in tables]
    for name, table in tables.items():
        lines += ["", f"[{_toml_key(name)}]"]
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items()]
    for number, wave in enumerate(waves, 1):
        lines += ["", "[[waves]]", f"# wave {number}", "steps = ["]
        lines += [f"    {_toml_value(step)}," for step in wave["steps"]]
        lines.append("]")
    return "\n".join(lines) + "\n"


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").isalnum() and key.isascii() else _toml_string(key)


def _toml_string(text: str) -> str:
    # JSON's escapes (\" \\ \n \t \uXXXX for the other controls) are TOML's basic string's;
    # TOML also wants DEL escaped, which JSON leaves.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)  # finite: every number in a plan is bounded
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    raise TypeError(f"no TOML for {type(value).__name__}")


def write_plan(plan: Plan, path: str | os.PathLike[str]) -> Path:
    """Write the plan whole or not at all (console.core.atomicfile): TOML when the name ends
    in .toml, else JSON. OSError says what failed."""
    return replace_text(path, to_toml(plan) if is_toml(path) else to_json(plan))


# -- reading ----------------------------------------------------------------------------


def read_plan(path: str | os.PathLike[str]) -> Plan:
    """Read a plan file; PlanError names the file and what is wrong (unreadable, too big,
    not JSON or TOML, another version, an unknown key, a value of the wrong type)."""
    source = Path(path)
    try:
        with source.open("rb") as f:
            raw = f.read(MAX_PLAN_BYTES + 1)
    except OSError as exc:
        raise PlanError(f"{source}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_PLAN_BYTES:
        raise PlanError(f"{source}: over {MAX_PLAN_BYTES} bytes: not a rollout plan")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError(f"{source}: not UTF-8 text ({exc.reason})") from None
    return parse_plan(text, source)


def parse_plan(text: str, source: Path) -> Plan:
    lines: dict[KeyPath, int] = {}
    try:
        if is_toml(source):
            data: Any = tomllib.loads(text)
            lines = key_lines(text)
        else:
            data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError and JSONDecodeError too
        form = "TOML" if is_toml(source) else "JSON"
        raise PlanError(f"{source}: not valid {form}: {_one_line(exc)}") from None
    if not isinstance(data, dict):
        raise PlanError(f"{source}: not a rollout plan (a {type(data).__name__}, not a table)")
    if data.get("kind") != KIND:
        raise PlanError(
            f"{source}: not a rollout plan (kind is {data.get('kind')!r}, not {KIND!r})"
        )
    if data.get("version") != VERSION or isinstance(data.get("version"), bool):
        raise PlanError(
            f"{_where(source, lines, ('version',))}: version {data.get('version')!r}: this "
            f"engineroom reads rollout plans of version {VERSION}"
        )
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        raise PlanError(_explain(exc, source, lines)) from None


def join_problems(problems: list[str]) -> str:
    """Problems one a line, the first MAX_SHOWN_PROBLEMS of them, then how many more."""
    shown = problems[:MAX_SHOWN_PROBLEMS]
    more = len(problems) - len(shown)
    return "\n".join(shown + ([f"... and {more} more"] if more > 0 else []))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _where(source: Path, lines: dict[KeyPath, int], path: KeyPath) -> str:
    line = line_of(lines, path) if lines else None
    return f"{source}:{line}" if line else str(source)


def _explain(exc: ValidationError, source: Path, lines: dict[KeyPath, int]) -> str:
    problems = []
    for error in exc.errors():
        loc: KeyPath = tuple(error["loc"])
        if error["type"] == "extra_forbidden":
            allowed = ", ".join(_allowed_keys(loc[:-1]))
            what = f"unknown key {str(loc[-1])!r} (allowed: {allowed})"
        elif error["type"] == "missing":
            what = f"missing required key {str(loc[-1])!r}"
        elif error["type"] == "value_error":
            what = str(error.get("ctx", {}).get("error", error["msg"]))
        else:
            got = error.get("input")
            what = error["msg"].rstrip(".")
            if got is not None and not isinstance(got, dict | list):
                what += f"; got {got!r}"
        problems.append(f"{_where(source, lines, loc)}: {format_path(loc)}: {what}")
    return join_problems(problems)


def _allowed_keys(parent: KeyPath) -> list[str]:
    """The keys a plan allows at `parent`: the models' fields, walked down by name."""
    model: type[BaseModel] = Plan
    for part in parent:
        if isinstance(part, int):
            continue
        inner: dict[str, type[BaseModel]] = {
            "waves": Wave,
            "steps": Step,
            "tolerance": Tolerance,
            "selection": Selection,
        }
        if part not in inner:
            return []
        model = inner[part]
    return list(model.model_fields)
