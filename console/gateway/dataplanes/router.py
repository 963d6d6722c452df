"""The vLLM router (PyPI `vllm-router`, Rust) as a data plane: workers added and removed
through its HTTP API.

The router has no weights. It spreads requests over the workers it has registered (we run
it with `--policy round_robin`), so a share maps onto which workers are registered:

    share of the target   0          1-99                        100
    registered            source     source and target (50/50)   target

A 10 % step therefore sends half the traffic to the target, not a tenth: the plan says so
(`describe`), and tests/test_dataplane_router.py counts where requests really went in each
step from the engines' own counters. The router refuses a second registration of one URL
(router.rs `add_worker`: "Worker ... already exists"), so finer shares would need the same
engine reachable under several URLs; we do not pretend to have them.

Its API (vllm-router 0.1.17, src/server.rs): `POST /add_worker?url=U` answers only once
U's /health passes (it retries until its --worker-startup-timeout-secs); `POST
/remove_worker?url=U` answers 200 whether or not U was registered, so every change is
checked with `GET /list_workers` (`{"urls": [...]}`). A removed worker's streams in flight
go on to their end: they are forwarded by a task that holds the upstream connection, not
the registry (docs/data-planes.md has the file and line). So a drain removes the worker,
then waits for the engine's own count of running requests to reach zero.

Verification: per-worker requests and failures from the router's Prometheus endpoint
(`--prometheus-port`; `vllm_router_processed_requests_total{worker}`,
`vllm_router_cb_outcomes_total{worker,outcome}`), TTFT and ITL from the engine's own
histograms (the router has no per-worker latency). Without `metrics_url`, the engine's
counters give the requests and failures too.

A router restarted with its command line comes back with its `--worker-urls`, not with the
workers this gateway left: every call compares the registered workers with what it left
and, when they differ, raises DataPlaneError saying so (the failover then fails and puts
back the routes from before the job, which re-registers them).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from console.core.config.load import DataPlaneSection, Deployment, Fleet
from console.core.fetch import FetchError, fetch
from console.core.metrics.promtext import MetricsGarbage, parse
from console.core.metrics.readings import ModelReading, values_by
from console.gateway.dataplanes.base import (
    Backend,
    DataPlane,
    DataPlaneError,
    DrainTimeout,
    Figures,
    Health,
)
from console.gateway.dataplanes.enginefigures import p95_since
from plugins import load_plugins
from plugins.base import EngineTarget, ProbeContext

log = logging.getLogger(__name__)

MAX_ANSWER = 1024 * 1024  # one answer of the router's API; its lists are small
MAX_METRICS = 8 * 1024 * 1024  # a /metrics page, the router's or an engine's
ADD_TIMEOUT_S = 5.0  # add_worker answers after the worker's health check: allow for it
DRAIN_POLL_S = 0.1
# The engine's own count can read 0 between two batches while the router still forwards
# requests it picked the worker for before remove_worker (seen in CI: a drain that
# succeeded with 4 requests running after it). A drain is done when the count, running
# and waiting, stays 0 this long.
DRAIN_QUIET_S = 1.0
PROCESSED = "vllm_router_processed_requests_total"
OUTCOMES = "vllm_router_cb_outcomes_total"


@dataclass(slots=True)
class Mark:
    """The start of a verification window: the router's and the engine's counters then."""

    router: dict[str, float] | None  # requests, failures; None: no router metrics
    engine: ModelReading | None
    at: float = field(default_factory=time.monotonic)


class RouterPlane(DataPlane):
    kind = "vllm-router"
    has_weights = False

    def __init__(self, section: DataPlaneSection, fleet: Fleet, store: Any) -> None:
        assert section.url is not None  # fleet.toml validation requires it
        self.name = section.name
        self.url = section.url.rstrip("/")
        self.metrics_url = section.metrics_url
        self.timeout_s = section.timeout_s
        token = os.environ.get(section.token_env) if section.token_env else None
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.store = store
        self.models = {m.name: m for m in fleet.models if m.dataplane == section.name}
        self.http: aiohttp.ClientSession | None = None
        self.left: dict[
            str, frozenset[str]
        ] = {}  # model -> the URLs registered after our last change

    async def start(self, http: aiohttp.ClientSession) -> None:
        self.http = http

    # -- what the plan screen says ------------------------------------------------------

    def describe(self) -> str:
        return (
            f"vLLM router at {self.url}: no weights, workers added and removed; a share "
            "between 1 and 99 % registers source and target (round robin: equal shares, "
            "50/50 with two), 100 % registers the target alone"
        )

    def figures_from(self, model: str) -> str:
        return (
            "requests and failures from the vLLM router's /metrics (per worker), TTFT and "
            "ITL from the engine's /metrics"
            if self.metrics_url
            else "the engine's /metrics (no metrics_url for the vLLM router)"
        )

    # -- the router's API ---------------------------------------------------------------

    async def _call(self, method: str, path: str, url: str | None = None,
                    timeout_s: float | None = None) -> tuple[int, str]:  # fmt: skip
        """One call to the router's API within a deadline, its answer read up to MAX_ANSWER."""
        assert self.http is not None, "start() first"
        deadline = timeout_s or self.timeout_s
        what = f"vLLM router {self.url}: {method} {path}" + (f"?url={url}" if url else "")
        try:
            async with (
                asyncio.timeout(deadline),
                self.http.request(
                    method, self.url + path, params={"url": url} if url else None,
                    headers=self.headers,
                ) as resp,
            ):  # fmt: skip
                body = b""
                while len(body) <= MAX_ANSWER and (part := await resp.content.read(65536)):
                    body += part
                if len(body) > MAX_ANSWER:
                    raise DataPlaneError(f"{what}: answer over {MAX_ANSWER} bytes")
                return resp.status, body.decode("utf-8", errors="replace")
        except TimeoutError:
            raise DataPlaneError(f"{what}: no answer within {deadline:g} s") from None
        except aiohttp.ClientConnectorError as exc:
            raise DataPlaneError(f"{what}: not reachable ({exc.os_error or exc})") from None
        except aiohttp.ClientError as exc:
            raise DataPlaneError(f"{what}: {exc.__class__.__name__}: {exc}") from None

    async def workers(self) -> list[str]:
        """The worker URLs registered in the router now."""
        status, text = await self._call("GET", "/list_workers")
        if status != 200:
            raise DataPlaneError(
                f"vLLM router {self.url}: GET /list_workers answered {status}: {text[:200]}"
            )
        try:
            urls = json.loads(text)["urls"]
            return [str(u).rstrip("/") for u in urls]
        except (ValueError, KeyError, TypeError):
            raise DataPlaneError(
                f"vLLM router {self.url}: GET /list_workers: not the expected "
                f'{{"urls": [...]}}: {text[:200]}'
            ) from None

    async def _add(self, url: str) -> None:
        status, text = await self._call(
            "POST", "/add_worker", url, max(self.timeout_s, ADD_TIMEOUT_S)
        )
        if status != 200 and "already exists" not in text:
            raise DataPlaneError(
                f"vLLM router {self.url}: add_worker {url} refused ({status}): {text[:300]}"
            )

    async def _remove(self, url: str) -> None:
        status, text = await self._call("POST", "/remove_worker", url)
        if status != 200:
            raise DataPlaneError(
                f"vLLM router {self.url}: remove_worker {url} refused ({status}): {text[:300]}"
            )

    # -- helpers ------------------------------------------------------------------------

    def _deps(self, model: str) -> dict[str, Deployment]:
        if model not in self.models:
            raise DataPlaneError(f"model {model!r} is not carried by data plane {self.name!r}")
        return {d.id: d for d in self.models[model].deployments}

    def _registered(self, model: str, urls: list[str]) -> frozenset[str]:
        """The model's deployments registered among `urls`."""
        return frozenset(d for d, dep in self._deps(model).items() if dep.endpoint in urls)

    def _check_left(self, model: str, now: frozenset[str]) -> None:
        """Raise if the router's workers are not what our last change left (a restart)."""
        before = self.left.get(model)
        if before is not None and before != now:
            del self.left[model]  # said once; the rollback or the operator may set them again
            raise DataPlaneError(
                f"vLLM router {self.url} has {sorted(now) or 'no worker'} registered for "
                f"{model}, not {sorted(before)} as this gateway left it: it restarted (it comes "
                "back with its --worker-urls) or someone changed it; nothing was changed now"
            )

    async def _read_back(self, model: str) -> frozenset[str] | None:
        """After a change, even one that failed half way, what is registered now becomes
        what this gateway left, so the next call does not take it for a restart. None
        (and nothing to compare the next time) when the router cannot be read."""
        try:
            after = self._registered(model, await self.workers())
        except DataPlaneError:
            self.left.pop(model, None)
            return None
        self.left[model] = after
        return after

    @staticmethod
    def _shares(
        registered: frozenset[str] | set[str], deps: dict[str, Deployment]
    ) -> dict[str, int]:
        n = len(registered)
        return {d: (round(100 / n) if d in registered else 0) for d in deps}

    # -- DataPlane ----------------------------------------------------------------------

    async def health(self) -> Health:
        try:
            status, text = await self._call("GET", "/liveness")
            urls = await self.workers()
        except DataPlaneError as exc:
            return Health(False, str(exc))
        if status != 200:
            return Health(
                False, f"vLLM router {self.url}: /liveness answered {status}: {text[:200]}"
            )
        return Health(True, f"vLLM router {self.url} answers; {len(urls)} workers registered")

    async def weights(self, model: str) -> dict[str, int]:
        deps = self._deps(model)
        return self._shares(self._registered(model, await self.workers()), deps)

    async def set_weights(self, model: str, weights: dict[str, int], who: str, why: str) -> None:
        deps = self._deps(model)
        unknown = sorted(set(weights) - set(deps))
        if unknown:
            raise DataPlaneError(
                f"{model} has no deployment {', '.join(unknown)} (data plane {self.name})"
            )
        now = self._registered(model, await self.workers())
        self._check_left(model, now)
        wanted = {d for d in deps if weights.get(d, 100 if d in now else 0) > 0}
        if not wanted:
            raise DataPlaneError(
                f"vLLM router {self.url}: these weights leave {model} with no worker; refused"
            )
        try:
            for d in sorted(wanted - now):  # raise before lowering: never a moment with none
                await self._add(deps[d].endpoint)
            for d in sorted(now - wanted):
                await self._remove(deps[d].endpoint)
        except DataPlaneError as exc:
            left = await self._read_back(model)  # what a change that failed half way left
            self.store.audit(
                who, "data plane workers: change failed",
                {"dataplane": self.name, "model": model, "asked": weights, "why": why},
                {"error": str(exc), "registered": None if left is None else sorted(left)},
            )  # fmt: skip
            raise
        after = await self._read_back(model)
        if after is None:
            raise DataPlaneError(f"vLLM router {self.url}: changed {model}'s workers, then "
                                 "could not read them back")  # fmt: skip
        shares = self._shares(after, deps)
        self.store.audit(
            who, "data plane workers",
            {"dataplane": self.name, "model": model, "asked": weights, "why": why},
            {"registered": sorted(after), "share": shares},
        )  # fmt: skip
        if after != wanted:
            raise DataPlaneError(
                f"vLLM router {self.url}: asked for {sorted(wanted)} registered for {model}, "
                f"it has {sorted(after)}"
            )

    async def drain(self, model: str, deployment: str, timeout_s: float) -> None:
        deps = self._deps(model)
        if deployment not in deps:
            raise DataPlaneError(f"{model} has no deployment {deployment!r}")
        deadline = time.monotonic() + timeout_s
        now = self._registered(model, await self.workers())
        self._check_left(model, now)
        if deployment in now:
            if now == {deployment}:
                raise DataPlaneError(
                    f"vLLM router {self.url}: {deployment} is {model}'s only worker; "
                    "draining it would leave none"
                )
            try:
                await self._remove(deps[deployment].endpoint)
            except DataPlaneError:
                await self._read_back(model)
                raise
            after = await self._read_back(model)
            if after is None or deployment in after:
                raise DataPlaneError(
                    f"vLLM router {self.url}: {deployment} "
                    + ("not seen gone" if after is None else "still registered")
                    + " after remove_worker"
                )
        quiet_since: float | None = None
        while True:
            reading, state = await self._engine(model, deps[deployment])
            running = None if reading is None else reading.requests_running
            if state == "down":  # refused: a stopped engine runs nothing
                return
            waiting = None if reading is None else reading.requests_waiting
            if running == 0 and not waiting:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= DRAIN_QUIET_S:
                    return
            else:
                quiet_since = None
            if time.monotonic() >= deadline:
                raise DrainTimeout(
                    f"{deployment}: {'?' if running is None else f'{running:g}'} requests still "
                    f"running on the engine after {timeout_s:g} s (its own count)",
                    {deployment: None if running is None else int(running)},
                )
            await asyncio.sleep(DRAIN_POLL_S)

    async def backends(self, model: str) -> dict[str, Backend]:
        deps = self._deps(model)
        status, text = await self._call("GET", "/workers")
        listed: dict[str, bool | None] = {}
        if status == 200:
            try:
                for w in json.loads(text).get("workers", []):
                    listed[str(w["url"]).rstrip("/")] = w.get("is_healthy")
            except (ValueError, KeyError, TypeError, AttributeError):
                listed = {u: None for u in await self.workers()}
        else:
            listed = {u: None for u in await self.workers()}
        registered = frozenset(d for d, dep in deps.items() if dep.endpoint in listed)
        shares = self._shares(registered, deps)
        readings = await asyncio.gather(*(self._engine(model, dep) for dep in deps.values()))
        out = {}
        for (d, dep), (reading, state) in zip(deps.items(), readings, strict=True):
            running = (
                None
                if reading is None or reading.requests_running is None
                else int(reading.requests_running)
            )
            if state == "down":
                running = 0  # refused: nothing runs there
            up = listed.get(dep.endpoint) if d in registered else state == "ready"
            out[d] = Backend(
                deployment=d,
                weight=shares[d],
                up=up,
                draining=None if running is None else (d not in registered and running > 0),
                inflight=running,
                reason=None if state == "ready" else f"engine {state}",
            )
        return out

    async def snapshot(self, model: str, deployment: str) -> Mark:
        dep = self._deps(model)[deployment]
        router, (engine, _) = await asyncio.gather(
            self._router_counts(dep), self._engine(model, dep)
        )
        return Mark(router, engine)

    async def figures(self, model: str, deployment: str, since: Any) -> Figures:
        assert isinstance(since, Mark)
        dep = self._deps(model)[deployment]
        router, (engine, _) = await asyncio.gather(
            self._router_counts(dep), self._engine(model, dep)
        )
        requests = failures = None
        sources = []
        if (
            router is not None
            and since.router is not None
            and router["requests"] >= since.router["requests"]
        ):
            requests = int(router["requests"] - since.router["requests"])
            failures = int(router["failures"] - since.router["failures"])
            sources.append("vLLM router /metrics (requests, failures)")
        old = since.engine
        if engine is not None and old is not None:
            if requests is None and "requests" in engine.counters and "requests" in old.counters:
                requests = int(engine.counters["requests"] - old.counters["requests"])
                failures = int(engine.counters.get("errors", 0) - old.counters.get("errors", 0))
                sources.append("engine /metrics (requests, failures)")
            sources.append("engine /metrics (TTFT, ITL)")
        ttft = p95_since(engine, old, "ttft")
        itl = p95_since(engine, old, "itl")
        return Figures(
            requests=requests,
            failures=failures,
            error_rate=None if not requests or failures is None else failures / requests,
            ttft_p95_s=ttft,
            itl_p95_s=itl,
            source="; ".join(sources) or "nothing readable",
        )

    async def started(self, model: str, deployment: str) -> int | None:
        """Requests the router has sent to the deployment's worker so far (its per-worker
        counter of routing decisions); None without the router's metrics."""
        counts = await self._router_counts(self._deps(model)[deployment])
        return None if counts is None else int(counts["requests"])

    # -- reading counters ---------------------------------------------------------------

    async def _router_counts(self, dep: Deployment) -> dict[str, float] | None:
        """This worker's requests and failures in the router's /metrics; None: unreadable."""
        if self.metrics_url is None or self.http is None:
            return None
        try:
            page = await fetch(
                self.http, self.metrics_url, timeout=self.timeout_s, max_bytes=MAX_METRICS
            )
            exp = parse(page.text(), ("vllm_router_",))
        except (FetchError, MetricsGarbage) as exc:
            log.warning("vLLM router metrics %s: %s", self.metrics_url, exc)
            return None
        return {
            "requests": values_by(exp, PROCESSED, "worker").get(dep.endpoint, 0.0),
            "failures": values_by(exp, OUTCOMES, "worker", outcome="failure").get(
                dep.endpoint, 0.0
            ),
        }

    async def _engine(self, model: str, dep: Deployment) -> tuple[ModelReading | None, str]:
        """The engine's own reading of the model, through its plugin, and its state."""
        plugin = load_plugins().get(dep.engine)
        if plugin is None or self.http is None:
            return None, "unknown"
        name = dep.engine_model or model
        target = EngineTarget(dep.id, dep.engine, dep.endpoint, dep.metrics_endpoint, [name])
        reading = await plugin.probe(target, ProbeContext(self.http, self.timeout_s, MAX_METRICS))
        found = next((m for m in reading.models if m.name == name), None)
        return found, reading.state
