"""HAProxy as a data plane, driven through its runtime API on the admin stats socket.

- weights: `set server BACKEND/SERVER weight N` (the target raised before the source is
  lowered: lowered first, the backend has no server for a moment), and `state ready` for a
  server that was drained; no reload, no connection dropped. Each change is audited as it
  is made, then written back into the configuration file
  (console.gateway.dataplanes.haproxy_config),
  so a restarted HAProxy keeps it; a change that fails half way, or a write-back that
  fails, is audited too and fails the job saying what HAProxy routes now.
- drain: `set server ... state drain`, then `show stat` until the server's current
  sessions (`scur`) are 0.
- figures: requests (`stot`) and failures (`hrsp_5xx`, `eresp`, `econ`) from `show stat`
  deltas, with which counter each came from and how many requests HAProxy redispatched to
  another server (`wredis`; such a client may have seen no error); TTFT and ITL p95 from
  the engine's own metrics (HAProxy measures neither).
- restarts: the process id and start time from `show info` are checked on every change and
  window against those the job began with (`begin`, per model) and the window's start (in
  its Mark): a different HAProxy fails the job, saying so. Only a job sets what it checks
  against; readers (the plan screen, another model's job, the routes) never do.

Every socket call has a deadline (the data plane's `timeout_s`) and reads at most
MAX_ANSWER_BYTES; the socket is one command per connection (HAProxy's non-interactive
mode), so no state is left between calls.
"""

from __future__ import annotations

import asyncio
import csv
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from console.core.atomicfile import replace_text
from console.core.config.load import ConfigError, DataPlaneSection, Deployment, Fleet, Model
from console.gateway.dataplanes import enginefigures, haproxy_config
from console.gateway.dataplanes.base import (
    Backend,
    DataPlane,
    DataPlaneError,
    DrainTimeout,
    Figures,
    Health,
)
from console.gateway.routing.routes import GatewayStore

MAX_ANSWER_BYTES = 4 * 1024 * 1024
FIGURES_FROM = (
    "HAProxy's show stat (requests, errors, in flight); the engine's metrics (TTFT, ITL p95)"
)
DRAIN_POLL_S = 0.1


class RuntimeAPI:
    """One command per connection to HAProxy's stats socket, with a deadline and a cap."""

    def __init__(self, socket_path: str, timeout: float) -> None:
        self.path = socket_path
        self.timeout = timeout

    async def call(self, command: str) -> str:
        if "\n" in command or ";" in command:
            raise ValueError(f"one command, no separators: {command!r}")
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_unix_connection(self.path)
                try:
                    writer.write(command.encode() + b"\n")
                    await writer.drain()
                    data = await reader.read(MAX_ANSWER_BYTES + 1)
                    answer = data
                    while data and len(answer) <= MAX_ANSWER_BYTES:
                        data = await reader.read(MAX_ANSWER_BYTES + 1 - len(answer))
                        answer += data
                finally:
                    writer.close()
        except TimeoutError:
            raise DataPlaneError(
                f"HAProxy's admin socket {self.path}: no answer to {command!r} within "
                f"{self.timeout:g} s"
            ) from None
        except OSError as exc:
            raise DataPlaneError(
                f"HAProxy's admin socket {self.path}: {exc.strerror or exc} (is HAProxy running?)"
            ) from None
        if len(answer) > MAX_ANSWER_BYTES:
            raise DataPlaneError(
                f"HAProxy's admin socket {self.path}: the answer to {command!r} is over "
                f"{MAX_ANSWER_BYTES} bytes; not read"
            )
        return answer.decode("utf-8", "replace")

    async def change(self, command: str) -> None:
        """A command that answers nothing when it worked; anything else is its refusal."""
        answer = (await self.call(command)).strip()
        if answer:
            raise DataPlaneError(f"HAProxy refused {command!r}: {answer.splitlines()[0]}")


# show stat's failure counters, and what each counts, in a job's words.
FAILURE_COUNTERS = {
    "hrsp_5xx": ("5xx answer", "5xx answers"),
    "eresp": ("response error", "response errors"),
    "econ": ("connection error", "connection errors"),
}
REDISPATCHES = ("redispatch", "redispatches")  # wredis: sent on to another server


@dataclass(slots=True)
class ServerStat:
    status: str  # UP, DOWN, DRAIN, MAINT, no check, ...
    weight: int | None
    scur: int | None
    stot: int | None
    backup: bool
    counts: dict[str, int | None]  # FAILURE_COUNTERS and wredis, as HAProxy gives them

    @property
    def failures(self) -> int | None:
        found = [self.counts.get(k) for k in FAILURE_COUNTERS]
        return None if None in found else sum(n or 0 for n in found)


@dataclass(slots=True)
class Mark:
    identity: tuple[str, str]
    stats: dict[str, ServerStat]
    engine: Any
    at: float


class HAProxyPlane(DataPlane):
    kind = "haproxy"
    max_weight = 256  # HAProxy's weights run from 0 to 256

    def __init__(self, section: DataPlaneSection, fleet: Fleet, store: GatewayStore) -> None:
        assert section.admin_socket is not None  # the fleet check requires it
        self.name = section.name
        self.section = section
        self.fleet = fleet
        self.store = store
        self.api = RuntimeAPI(section.admin_socket, section.timeout_s)
        self.config = Path(section.config).expanduser() if section.config else None
        self.http: aiohttp.ClientSession | None = None
        # model -> (pid, start time) of the HAProxy its running job began on; set by the
        # job alone (begin), so no reader can hide a restart from it.
        self.began: dict[str, tuple[str, str]] = {}
        self._lock = asyncio.Lock()  # one change at a time, and its write-back

    async def start(self, http: aiohttp.ClientSession) -> None:
        self.http = http

    # -- names -------------------------------------------------------------------------

    def _model(self, model: str) -> Model:
        return next(m for m in self.fleet.models if m.name == model)

    def _dep(self, model: str, deployment: str) -> Deployment:
        return next(d for d in self._model(model).deployments if d.id == deployment)

    def _backend(self, model: str) -> str:
        return haproxy_config.backend_name(self._model(model))

    def _server(self, model: str, deployment: str) -> str:
        return haproxy_config.server_name(self._dep(model, deployment))

    def describe(self) -> str:
        conf = f", configuration {self.config}" if self.config else ""
        return f"HAProxy {self.name!r} via its admin socket {self.api.path}{conf}"

    def figures_from(self, model: str) -> str:
        return FIGURES_FROM

    # -- reading -----------------------------------------------------------------------

    async def _identity(self) -> tuple[str, str]:
        info: dict[str, str] = {}
        for line in (await self.api.call("show info")).splitlines():
            key, sep, value = line.partition(":")
            if sep:
                info[key.strip()] = value.strip()
        if "Pid" not in info:
            raise DataPlaneError(f"HAProxy's admin socket {self.api.path}: show info has no Pid")
        started = info.get("Start_time_sec") or str(
            round(time.time() - float(info.get("Uptime_sec", "0")))
        )
        return info["Pid"], started

    async def begin(self, model: str) -> None:
        self.began[model] = await self._identity()

    async def _same_haproxy(
        self, model: str, since: tuple[str, str] | None = None
    ) -> tuple[str, str]:
        """The HAProxy answering now; DataPlaneError if it is not the one `model`'s job
        began on, nor (`since`) the one a verification window began on."""
        now = await self._identity()
        for before in (self.began.get(model), since):
            if before is not None and before != now:
                raise DataPlaneError(
                    f"HAProxy restarted (pid {before[0]} -> {now[0]}): it routes by its "
                    f"configuration file{f' {self.config}' if self.config else ''}, which "
                    "holds the weights of the last completed change; check them and start again"
                )
        return now

    async def _stats(self, model: str) -> dict[str, ServerStat]:
        backend = self._backend(model)
        text = await self.api.call(f"show stat {backend} 4 -1")
        rows = list(csv.DictReader(text.lstrip("# ").splitlines()))
        out: dict[str, ServerStat] = {}
        for row in rows:
            if row.get("pxname") != backend or not row.get("svname"):
                continue
            out[row["svname"]] = ServerStat(
                status=row.get("status") or "?",
                weight=_int(row.get("weight")),
                scur=_int(row.get("scur")),
                stot=_int(row.get("stot")),
                backup=row.get("bck") == "1",
                counts={k: _int(row.get(k)) for k in (*FAILURE_COUNTERS, "wredis")},
            )
        if not out:
            raise DataPlaneError(
                f"HAProxy has no backend {backend!r} with servers (model {model}): render the "
                "configuration, or name its backend in fleet.toml ([[models]] backend)"
            )
        return out

    def _rows(self, stats: dict[str, ServerStat], model: str, deployment: str) -> list[ServerStat]:
        server = self._server(model, deployment)
        return [
            s
            for name, s in stats.items()
            if name in (server, server + haproxy_config.BACKUP_SUFFIX)
        ]

    async def health(self) -> Health:
        try:
            pid, _ = await self._identity()
        except DataPlaneError as exc:
            return Health(False, str(exc))
        return Health(True, f"HAProxy (pid {pid}) answers on {self.api.path}")

    async def weights(self, model: str) -> dict[str, int]:
        stats = await self._stats(model)
        out = {}
        for dep in self._model(model).deployments:
            row = stats.get(haproxy_config.server_name(dep))
            if row is None:
                raise self._missing(model, dep)
            draining = row.status.startswith(("DRAIN", "MAINT"))
            out[dep.id] = 0 if draining or row.weight is None else row.weight
        return out

    def _missing(self, model: str, dep: Deployment) -> DataPlaneError:
        return DataPlaneError(
            f"HAProxy's backend {self._backend(model)!r} has no server "
            f"{haproxy_config.server_name(dep)!r} (deployment {dep.id})"
        )

    async def backends(self, model: str) -> dict[str, Backend]:
        stats = await self._stats(model)
        weights = await self.weights(model)
        out = {}
        for dep in self._model(model).deployments:
            rows = self._rows(stats, model, dep.id)
            main = stats[haproxy_config.server_name(dep)]
            inflight = [r.scur for r in rows]
            out[dep.id] = Backend(
                dep.id,
                weights[dep.id],
                None
                if main.status in ("no check", "?")
                else main.status.startswith(("UP", "DRAIN")),
                main.status.startswith("DRAIN"),
                None if any(n is None for n in inflight) else sum(n or 0 for n in inflight),
                None if main.status.startswith("UP") else main.status,
            )
        return out

    # -- changing ----------------------------------------------------------------------

    async def set_weights(self, model: str, weights: dict[str, int], who: str, why: str) -> None:
        async with self._lock:
            await self._same_haproxy(model)
            before = await self.weights(model)
            backend = self._backend(model)
            raise_first = sorted(weights.items(), key=lambda kv: kv[1] <= before.get(kv[0], 0))
            stats = await self._stats(model)
            what = {"model": model, "weights": weights, "why": why, "dataplane": self.name}
            # Audited before it is made: a live change never goes unrecorded, even if the
            # gateway dies during it.
            self.store.audit(who, "routes set", what, {"before": before})
            commands = []
            for deployment, weight in raise_first:
                server = self._server(model, deployment)
                commands.append(f"set server {backend}/{server} weight {weight}")
                if weight > 0:  # undo a drain: one that is down reads DOWN, not DRAIN
                    commands += [
                        f"set server {backend}/{name} state ready"
                        for name in (server, server + haproxy_config.BACKUP_SUFFIX)
                        if name in stats and _maybe_drained(stats[name].status)
                    ]
            await self._change(model, commands, who, what)
            await self._write_back(model, {**before, **weights}, who, what)

    async def _change(
        self, model: str, commands: list[str], who: str, what: dict[str, Any]
    ) -> None:
        """Run `commands` on the socket; one refused or unanswered is audited with what
        HAProxy routes after it (so far as it can be read) and fails the change."""
        try:
            for command in commands:
                await self.api.change(command)
        except DataPlaneError as exc:
            try:
                now: dict[str, int] | str = await self.weights(model)
            except DataPlaneError as unread:
                now = f"unknown: {unread}"
            self.store.audit(who, "routes set: failed", what, {"error": str(exc), "now": now})
            raise DataPlaneError(f"{exc}; HAProxy routes {model} now: {now}") from None

    async def _write_back(
        self, model: str, weights: dict[str, int], who: str, what: dict[str, Any]
    ) -> None:
        if self.config is None:
            return
        backend = self._backend(model)
        named = {(backend, self._server(model, d)): w for d, w in weights.items()}
        config = self.config

        def write() -> None:
            text = haproxy_config.read_config(config)
            replace_text(config, haproxy_config.with_weights(text, named))

        try:
            await asyncio.to_thread(write)
        except (OSError, UnicodeDecodeError, ConfigError) as exc:
            error = (
                f"HAProxy routes {model} as asked ({weights}; audited), but writing that "
                f"back to {config} failed: {exc}. A restarted HAProxy would route by the "
                "file's old weights: let the gateway write that file (docs/haproxy.md), or "
                "put the weights in it by hand"
            )
            self.store.audit(
                who,
                "routes set: not written back",
                what,
                {"config": str(config), "error": str(exc)},
            )
            raise DataPlaneError(error) from None

    async def drain(self, model: str, deployment: str, timeout_s: float) -> None:
        backend, server = self._backend(model), self._server(model, deployment)
        async with self._lock:
            await self._same_haproxy(model)
            stats = await self._stats(model)
            what = {"model": model, "weights": {deployment: 0}, "why": f"drain {deployment}",
                    "dataplane": self.name}  # fmt: skip
            self.store.audit("gateway", "routes set", what, {"before": "drain"})
            commands = [
                f"set server {backend}/{name} state drain"
                for name in (server, server + haproxy_config.BACKUP_SUFFIX)
                if name in stats
            ]
            await self._change(model, commands, "gateway", what)
            await self._write_back(model, {deployment: 0}, "gateway", what)
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self._rows(await self._stats(model), model, deployment)
            left = [r.scur for r in rows]
            if all(n == 0 for n in left):
                return
            if time.monotonic() >= deadline:
                count = None if any(n is None for n in left) else sum(n or 0 for n in left)
                raise DrainTimeout(
                    f"{deployment}: {'?' if count is None else count} still in flight on "
                    f"HAProxy after {timeout_s:g} s",
                    {deployment: count},
                )
            await asyncio.sleep(DRAIN_POLL_S)

    # -- verification ------------------------------------------------------------------

    async def _engine(self, model: str, deployment: str) -> Any:
        if self.http is None:
            return None
        return await enginefigures.read_engine(
            self.http, model, self._dep(model, deployment), self.section.timeout_s
        )

    async def snapshot(self, model: str, deployment: str) -> Any:
        identity = await self._same_haproxy(model)
        return Mark(identity, await self._stats(model), await self._engine(model, deployment),
                    time.monotonic())  # fmt: skip

    async def figures(self, model: str, deployment: str, since: Any) -> Figures:
        assert isinstance(since, Mark)
        # The window's counters are of one process or none: a restart resets them.
        await self._same_haproxy(model, since.identity)
        now = await self._stats(model)
        engine = await self._engine(model, deployment)
        rows, before = (
            self._rows(now, model, deployment),
            self._rows(since.stats, model, deployment),
        )
        requests = _delta(rows, before, lambda r: r.stot)
        failures = _delta(rows, before, lambda r: r.failures)
        return Figures(
            requests,
            failures,
            None if not requests or failures is None else failures / requests,
            enginefigures.p95_since(engine, since.engine, "ttft"),
            enginefigures.p95_since(engine, since.engine, "itl"),
            FIGURES_FROM,
            _failures_detail(rows, before) if failures else None,
        )

    async def started(self, model: str, deployment: str) -> int | None:
        rows = self._rows(await self._stats(model), model, deployment)
        counts = [r.stot for r in rows]
        return None if any(n is None for n in counts) else sum(n or 0 for n in counts)


def _maybe_drained(status: str) -> bool:
    """Whether a server may be in drain, which `state ready` undoes. HAProxy shows DRAIN only
    while the server's checks pass: a drained server whose engine restarted reads DOWN (or
    `DOWN 1/2` as it comes back) and stays drained once up. Not one an operator put in
    maintenance (MAINT: engineroom never does), nor one up and serving (UP, NOLB)."""
    return not status.startswith(("UP", "NOLB", "MAINT"))


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def _failures_detail(now: list[ServerStat], then: list[ServerStat]) -> str:
    """Which of HAProxy's counters the window's failures came from: "2 response errors
    (eresp), 2 redispatches (wredis)"."""
    parts = []
    for key, (one, many) in (*FAILURE_COUNTERS.items(), ("wredis", REDISPATCHES)):
        n = _delta(now, then, lambda r, k=key: r.counts.get(k))  # type: ignore[misc]
        if n is None:
            parts.append(f"{many} ({key}) ?")
        elif n:
            parts.append(f"{n} {one if n == 1 else many} ({key})")
    return "HAProxy: " + ", ".join(parts)


def _delta(
    now: list[ServerStat], then: list[ServerStat], value: Callable[[ServerStat], int | None]
) -> int | None:
    """The change in `value` summed over the rows; None if any row cannot say."""
    a = [value(r) for r in now]
    b = [value(r) for r in then]
    if None in a or None in b or len(a) != len(b):
        return None
    return sum(a) - sum(b)  # type: ignore[arg-type]
