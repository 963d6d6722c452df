"""The data-plane interface: what a failover needs from whatever carries a model's traffic.

A data plane is the proxy in front of a model's deployments: the built-in gateway
(console.gateway.dataplanes.builtin, the default), HAProxy (.haproxy), the vLLM router
(.router). The failover jobs (console.gateway.failover.job) are written once against this
interface, the way the console reads engines only through console.core.plugin; fleet.toml
names each model's data plane (`[[dataplanes]]`, `[[models]] dataplane = NAME`).

What a data plane does for a failover:

- `weights` / `set_weights`: a share per deployment (0-100, the route table's unit). An
  implementation orders its changes so that the model is never left with no deployment
  taking traffic (raise the target before lowering the source); a weight above 0 makes a
  drained deployment take traffic again. A data plane without weights (`has_weights` False,
  the vLLM router adds and removes workers) maps a share onto what it has and says how in
  `describe`.
- `drain`: the deployment takes no new request; wait, within a deadline, until its
  in-flight count is zero (DrainTimeout says what is left).
- `backends`: per deployment, what the data plane sees now: weight, up, in flight (None
  where it cannot tell: unknown is never 0).
- `snapshot` / `figures`: the verification window. `snapshot` marks its start; `figures`
  gives requests, failures and TTFT/ITL p95 since then, from the data plane's own figures
  where it has them and the engines' metrics where it does not; `Figures.source` says
  which, and so does `figures_from` before a job starts (the plan screen shows it).
- `health`: can it be reached and changed now.
- `begin`: a job of the model starts; what the data plane remembers for the job (to tell
  a restart) belongs to that job alone, never reset by a reader.

Every call has a deadline; trouble with the data plane itself (not reachable, refused a
change, restarted) raises DataPlaneError with what failed and where, which fails the
failover job clearly.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import aiohttp

BUILTIN = "gateway"  # the name (and kind) of the built-in data plane


class DataPlaneError(Exception):
    """The data plane could not be reached, or refused or lost a change; the message says
    which data plane, what was asked and why it failed."""


class DrainTimeout(DataPlaneError):
    def __init__(self, message: str, left: dict[str, int | None]) -> None:
        super().__init__(message)
        self.left = left  # deployment -> requests still in flight (None: unknown)


@dataclass(slots=True)
class Backend:
    """One deployment as the data plane sees it now. None: the data plane cannot tell."""

    deployment: str
    weight: int | None = None
    up: bool | None = None
    draining: bool | None = None
    inflight: int | None = None
    reason: str | None = None  # why it is down, in the data plane's words


@dataclass(slots=True)
class Figures:
    """What a deployment served in a verification window (since a snapshot)."""

    requests: int | None
    failures: int | None
    error_rate: float | None  # failures / requests; None with no request
    ttft_p95_s: float | None
    itl_p95_s: float | None
    source: str  # where these figures come from, e.g. "HAProxy show stat; engine metrics"
    # What the failures were, in the data plane's words ("2 response errors (eresp), 2
    # redispatches (wredis)"); None where it gives only a count.
    failures_detail: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "failures": self.failures,
            "failures_detail": self.failures_detail,
            "error_rate": self.error_rate,
            "ttft_p95_s": self.ttft_p95_s,
            "itl_p95_s": self.itl_p95_s,
            "source": self.source,
        }


@dataclass(slots=True)
class Health:
    ok: bool
    detail: str  # what was seen: "HAProxy 2.6.12 answers on /run/haproxy.sock", or why not


class DataPlane(abc.ABC):
    """One data plane, carrying the traffic of the models that name it in fleet.toml."""

    kind: ClassVar[str]
    #: It has per-deployment weights (a 10/50/100 shift is exact); False: mapped (describe).
    has_weights: ClassVar[bool] = True
    #: The largest weight it takes (HAProxy: 256); None: no limit. A failover scales its
    #: weights down, in proportion, to fit.
    max_weight: ClassVar[int | None] = None
    #: Its verification figures count the canaries a failover sends straight to a target
    #: (the built-in gateway records them in its measures); False: they are added to them.
    counts_canaries: ClassVar[bool] = False

    name: str  # the fleet.toml name ([[dataplanes]] name, or "gateway")

    async def start(self, http: aiohttp.ClientSession) -> None:  # noqa: B027 - optional hook
        """Called once inside the gateway's event loop, with its HTTP client session
        (for engine metrics and data-plane APIs)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and tasks."""

    async def begin(self, model: str) -> None:  # noqa: B027 - optional hook
        """A failover job of `model` begins: remember what the data plane runs on now
        (HAProxy's pid), so the job's later calls can tell it restarted behind them. Only
        the job calls this: readers (the plan screen, the routes, another model's job)
        never change what a running job checks against."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for the plan screen and the job: what it is and where it is reached,
        e.g. "HAProxy via /run/haproxy/admin.sock (backend be_llama)"."""

    @abc.abstractmethod
    def figures_from(self, model: str) -> str:
        """Where the verification figures for `model` come from, in words: the data
        plane's own (which) or the engines' metrics."""

    @abc.abstractmethod
    async def health(self) -> Health:
        """Reachable and able to take changes now? Never raises."""

    @abc.abstractmethod
    async def weights(self, model: str) -> dict[str, int]:
        """The share of each of `model`'s deployments in force now (deployment id -> 0-100)."""

    @abc.abstractmethod
    async def set_weights(self, model: str, weights: dict[str, int], who: str, why: str) -> None:
        """Set the shares of the deployments named (others keep theirs), raising before
        lowering; audited with `who` and `why`. Raises DataPlaneError if any change failed."""

    @abc.abstractmethod
    async def drain(self, model: str, deployment: str, timeout_s: float) -> None:
        """No new request to `deployment`; return when nothing is in flight on it. Raises
        DrainTimeout (with what is left) at the deadline."""

    @abc.abstractmethod
    async def backends(self, model: str) -> dict[str, Backend]:
        """Each of `model`'s deployments as the data plane sees it now."""

    @abc.abstractmethod
    async def snapshot(self, model: str, deployment: str) -> Any:
        """Mark the start of a verification window (an opaque value for `figures`)."""

    @abc.abstractmethod
    async def figures(self, model: str, deployment: str, since: Any) -> Figures:
        """What `deployment` served since `snapshot` returned `since`."""

    async def started(self, model: str, deployment: str) -> int | None:
        """Requests the data plane has sent to `deployment` so far (a counter), for the
        emergency failover's cutover time (command to the target's first request); None
        where it cannot tell."""
        return None


# The kinds fleet.toml's [[dataplanes]] may name, and the class that drives each. A class
# is built as `cls(section, fleet, store)`: its fleet.toml section
# (console.core.config.load.DataPlaneSection), the fleet (models, deployments, `Model.backend`,
# `Deployment.server`) and the gateway's store (console.gateway.routing.routes.GatewayStore), where
# it audits every change.
KINDS = {
    "haproxy": "console.gateway.dataplanes.haproxy:HAProxyPlane",
    "vllm-router": "console.gateway.dataplanes.router:RouterPlane",
}


def plane_class(kind: str) -> Callable[..., DataPlane]:
    """The class for a `kind` of KINDS; call it with (section, fleet, store)."""
    import importlib

    module, _, name = KINDS[kind].partition(":")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, DataPlane)
    return cast(Callable[..., DataPlane], cls)
