"""The gateway's admin API on the wire: request bodies the gateway validates and answers the
console reads, one definition for both (console.gateway.admin, console.collect.gateway_client).

Errors are `{"error": "what, where"}` (AdminError); the OpenAI front door keeps OpenAI's
own error shape. Answers allow keys this console does not know (a newer gateway may add
some); request bodies do not (a misspelt key is an error, not ignored).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
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


class FailoverRequest(_Body):
    """POST /admin/failover: move `model`'s traffic to its deployment `to`; the same body
    to POST /admin/failover/plan, the planned failover's preflight alone."""

    model: StrictStr
    to: StrictStr
    mode: FailoverMode = "planned"
    why: StrictStr = ""


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
    ok: bool
    detail: str


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
    before: dict[str, int] | None = None
    after: dict[str, int] | None = None
    error: str | None = None


def problems(exc: ValidationError) -> str:
    """A validation error in one line: each problem with where it is (`weights.a: ...`)."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "the body"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)
