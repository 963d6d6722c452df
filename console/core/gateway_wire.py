"""The gateway's admin API on the wire: request bodies the gateway validates and answers the
console reads, one definition for both (console.gateway.http.admin,
console.collect.clients.gateway_client).

Errors are `{"error": "what, where"}` (AdminError); the OpenAI front door keeps OpenAI's
own error shape. Answers allow keys this console does not know (a newer gateway may add
some); request bodies do not (a misspelt key is an error, not ignored).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from console.core.wire import whole

FailoverMode = Literal["planned", "emergency"]
JOB_FINAL = ("succeeded", "failed", "cancelled")
# Strict: true is not a weight; a whole float is (console.core.wire.whole).
Weight = Annotated[StrictInt, BeforeValidator(whole), Field(ge=0)]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- requests ------------------------------------------------------------------------------


class WeightsUpdate(_Body):
    """PUT /admin/routes/{model}: new weights for some of the model's deployments."""

    weights: dict[str, Weight] = Field(min_length=1)
    why: StrictStr = ""


MAX_WHY = 500  # characters of a who or a why kept in a rollout's record and audit


class RolloutRequest(_Body):
    """POST /admin/rollouts: run `plan`, a rollout plan document (docs/rollouts.md) as
    `engineroom rollout plan --json` writes it; `who` and `why` go into its record and the
    audit."""

    plan: dict[str, Any]
    who: Annotated[StrictStr, Field(max_length=MAX_WHY)] = ""
    why: Annotated[StrictStr, Field(max_length=MAX_WHY)] = ""


class RolloutSteer(_Body):
    """POST /admin/rollouts/{id}/pause, /resume or /abort: who asks, and why."""

    who: Annotated[StrictStr, Field(max_length=MAX_WHY)] = ""
    why: Annotated[StrictStr, Field(max_length=MAX_WHY)] = ""


class FailoverRequest(_Body):
    """POST /admin/failover: one move of `model`'s weights, as a job (docs/gateway.md):

    - `to`: all of the model to that deployment; a fail-back (the weights from before the
      last move, the other replicas' included) when that move took the traffic off it;
    - `drain`: that deployment to 0, its weight spread over the others that have weight,
      in proportion; with `to`, all of its weight to `to`;
    - `restore_before`: the weights from before that job.

    The same body to POST /admin/failover/plan: the move and its preflight alone."""

    model: StrictStr
    to: StrictStr | None = None
    drain: StrictStr | None = None
    restore_before: StrictStr | None = None
    mode: FailoverMode = "planned"
    why: StrictStr = ""

    @field_validator("to", "drain", "restore_before", mode="before")
    @classmethod
    def _not_null(cls, value: object) -> object:
        if value is None:  # absent means absent: null is not a deployment
            raise ValueError("a string, or leave it out")
        return value

    @model_validator(mode="after")
    def _one_move(self) -> FailoverRequest:
        if self.restore_before is not None and (self.to is not None or self.drain is not None):
            raise ValueError("restore_before takes neither to nor drain")
        if self.restore_before is None and self.to is None and self.drain is None:
            raise ValueError("name the move: to, drain or restore_before")
        return self


# -- answers -------------------------------------------------------------------------------


class AdminError(_Answer):
    error: str


class DeploymentRoute(_Answer):
    id: str
    engine: str
    node: str | None = None
    endpoint: str
    weight: int
    up: bool
    reason: str | None = None
    inflight: int


class ModelRoutes(_Answer):
    """GET /admin/routes answers {model: ModelRoutes}."""

    auto_failover: bool
    failover_job: str | None = None  # the running failover's job id
    deployments: list[DeploymentRoute]


class Plan(_Answer):
    """POST /admin/failover/plan: the move and its preflight; changes nothing."""

    ok: bool
    detail: str
    op: str | None = None  # failover, drain or restore
    summary: str | None = None  # what moves where, and why these weights
    weights_before: dict[str, int] | None = None  # the data plane's weights now
    weights_after: dict[str, int] | None = None  # what the job would leave
    targets: list[str] = Field(default_factory=list)  # gain traffic: checked, verified
    sources: list[str] = Field(default_factory=list)  # lose traffic
    dataplane: str | None = None
    figures_from: str | None = None


class JobStep(_Answer):
    name: str
    state: str
    started: float | None = None
    ended: float | None = None
    detail: str | None = None


class FailoverJob(_Answer):
    """A failover job, running or ended (GET /admin/jobs/{id}, POST /admin/failover)."""

    id: str
    kind: str
    state: str
    who: str
    created: float
    updated: float | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    steps: list[JobStep] = Field(default_factory=list)
    plan: dict[str, Any] | None = None  # the move it set out to make (Plan's fields)
    before: dict[str, int] | None = None
    after: dict[str, int] | None = None
    error: str | None = None


class RolloutStep(_Answer):
    """One deployment's turn in a rollout (console.gateway.rollouts.steps)."""

    model: str
    deployment: str
    node: str
    operation: str
    wave: int
    state: str  # pending | running | done | halted | interrupted | aborted
    phase: str | None = None  # the phase under way: baseline, drain, stop, operation, ...
    details: dict[str, str] = Field(default_factory=dict)  # each phase done, in one line


class ModelCapacity(_Answer):
    """One model's capacity in a rollout, read from the gateway's route table when the
    record is asked for (console.gateway.rollouts.runner `capacity`): None is unknown, never 0."""

    ready: int | None = None  # its deployments up and with weight now
    deployments: int | None = None  # how many it has in the route table
    keeps: int | None = None  # the fewest ready the plan leaves it (never none)
    max_unavailable: int | None = None  # the plan's, per model
    unknown: str | None = None  # why `ready` is None

    @property
    def below(self) -> bool:
        """Fewer ready than the plan keeps (known on both sides)."""
        return self.ready is not None and self.keeps is not None and self.ready < self.keeps

    def words(self) -> str:
        """`1 of 2 ready and in rotation, the plan keeps 1`, "?" where unknown (with why)."""

        def n(value: int | None) -> str:
            return "?" if value is None else str(value)

        said = (f"{n(self.ready)} of {n(self.deployments)} ready and in rotation, "
                f"the plan keeps {n(self.keeps)}")  # fmt: skip
        if self.below:
            said += ": below it"
        return said + (f" ({self.unknown or 'not known'})" if self.ready is None else "")


def capacity_head(capacity: Mapping[str, ModelCapacity | dict[str, Any] | None] | None) -> str:
    """The line above each model's `ModelCapacity.words()`: `capacity now (the plan takes 1
    out at most per model)`, or that the gateway did not say. Each model's capacity as read
    (a RolloutRecord's) or as recorded (its fields)."""
    if capacity is None:
        return "capacity now: ? (the gateway did not say)"
    most = {c.max_unavailable if isinstance(c, ModelCapacity) else (c or {}).get("max_unavailable")
            for c in capacity.values()} - {None}  # fmt: skip
    if not most:
        return "capacity now"
    return f"capacity now (the plan takes {most.pop()} out at most per model)"


class RolloutRecord(_Answer):
    """A rollout, open or ended (GET /admin/rollouts/{id}, POST /admin/rollouts)."""

    id: str
    who: str
    status: str  # running | paused | halted | interrupted | succeeded | aborted
    operation: str
    current: int  # the step under way (or next), an index of `steps`
    steps: list[RolloutStep]
    events: list[dict[str, Any]] = Field(default_factory=list)
    error: str | None = None
    weights_seen: dict[str, Any] | None = None  # after an interruption, read back
    capacity: dict[str, ModelCapacity] | None = None  # per model; None: the gateway did not say


def problems(exc: ValidationError) -> str:
    """A validation error in one line: each problem with where it is (`weights.a: ...`)."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "the body"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)
