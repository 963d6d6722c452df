"""Prometheus' HTTP API as the console asks it: every call within a deadline and a cap on
its answer, and the answers of one refresh within a byte budget that its queries share.

The budget exists because a refresh holds every decoded answer until it ends, and a
decoded answer is about 8x its JSON: 14 answers under a per-answer cap alone were 14
caps (tens of GiB at the default). Each answer reserves its bytes as they arrive; the
one that would pass the budget is refused (its bytes given back), and the error names
its query.
"""

from __future__ import annotations

import asyncio
import base64
import math
import ssl

import aiohttp
import msgspec

from console.collect.clients import apiclient
from console.collect.prometheus.promql import ANSWER, Sample
from console.core.config.load import Fleet, MissingSecret, PrometheusSection
from console.core.units import exact_size_from_bytes

Answered = tuple[list[Sample], float]  # an instant query's samples, Prometheus' time
CHUNK = 256 * 1024


class PromError(Exception):
    """Why Prometheus gave no usable answer, worded for the header and `check`."""


class OverBudget(PromError):
    """An answer that would take its refresh past `max_refresh_bytes`."""


class Budget:
    """The bytes that the answers of one refresh (or one history read) may take together."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.left = total

    def take(self, size: int) -> None:
        if size > self.left:
            read = exact_size_from_bytes(self.total - self.left)
            raise OverBudget(
                f"refused: the refresh's answers would pass {exact_size_from_bytes(self.total)}"
                f" (max_refresh_bytes; {read} read by then)"
            )
        self.left -= size


class PromClient:
    """One HTTP client for a [prometheus] section; open it with `async with`."""

    def __init__(self, fleet: Fleet, section: PrometheusSection, timeout_s: float) -> None:
        self.section, self.timeout_s = section, timeout_s
        self.headers, self.auth_error = _auth(fleet, section)
        self._tls = _verify(section)
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> PromClient:
        # aiohttp, as the agents' streams: a sliced refresh at 10,000 nodes reads 13 MiB
        # of answers; fetching 6.3 MiB from a loopback server cost 20-25 ms of CPU through
        # httpx and 7-9 ms through aiohttp, the server's share in both. Nothing from the
        # environment (no proxy), and no decompression: asked for identity, anything
        # else is refused.
        self._http = aiohttp.ClientSession(
            headers={"Accept-Encoding": "identity", **self.headers},
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.close()

    async def ask(
        self, method: str, path: str, fields: dict[str, str], budget: Budget
    ) -> tuple[int, bytearray]:
        """One call, answered in full within the deadline, the size cap and `budget`:
        (status, body). A POST sends `fields` form-encoded, a GET as the query string."""
        assert self._http is not None, "use the client as an async context manager"
        url = self.section.url.rstrip("/") + path
        cap = self.section.max_response_bytes
        form, query = (fields, None) if method == "POST" else (None, fields)
        taken = 0
        body = bytearray()
        try:
            async with asyncio.timeout(self.timeout_s):
                asked = self._http.request(method, url, data=form, params=query, ssl=self._tls)
                async with asked as resp:
                    encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
                    if encoding != "identity":
                        raise PromError(f"answered compressed ({encoding}) though asked not to")
                    async for part in resp.content.iter_chunked(CHUNK):
                        if len(body) + len(part) > cap:
                            raise PromError(f"answered with over {exact_size_from_bytes(cap)}")
                        budget.take(len(part))  # reserved as it arrives
                        taken += len(part)
                        body += part
                    return resp.status, body
        except BaseException as exc:
            # A refused or failed answer holds nothing: its bytes go back to the budget,
            # and the part read is let go (the error's traceback keeps this frame, and
            # the refresh keeps the error until it ends: measured, 18 MiB under 5).
            budget.left += taken
            body.clear()
            worded = _worded(exc, self.timeout_s)
            if worded is None:
                raise
            raise worded from None

    async def instant(self, expr: str, at: float, budget: Budget) -> Answered:
        status, body = await self.ask(
            "POST",  # a slice's matcher can be longer than a proxy takes in a URL
            "/api/v1/query",
            {"query": expr, "time": f"{at:.3f}", "stats": "all"},
            budget,
        )
        return result(status, body)

    async def range(
        self, expr: str, start: float, end: float, step: float, budget: Budget
    ) -> list[Sample]:
        fields = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        status, body = await self.ask("GET", "/api/v1/query_range", fields, budget)
        return result(status, body)[0]


def _worded(exc: BaseException, timeout_s: float) -> PromError | None:
    """A failed call in the header's words (None: not a failure of the call; re-raised)."""
    if isinstance(exc, PromError):
        return exc
    if isinstance(exc, TimeoutError):
        return PromError(f"no answer within {timeout_s:g} s")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return PromError(f"cannot connect: {exc.os_error.strerror or exc}"[:200])
    if isinstance(exc, aiohttp.ClientError):
        return PromError(f"{exc.__class__.__name__}: {exc}".rstrip(": ")[:200])
    return None


def result(status: int, body: bytes | bytearray) -> Answered:
    """An answer's samples and Prometheus' own time, or PromError in Prometheus' words."""
    try:
        answer = ANSWER.decode(body)
    except msgspec.DecodeError:
        raise PromError(f"HTTP {status}, not a Prometheus answer: {bytes(body[:120])!r}") from None
    if answer.status != "success" or answer.data is None:
        raise PromError(
            f"HTTP {status}: {answer.errorType or 'error'}: {answer.error or '?'}"[:300]
        )
    took = 0.0
    timings = (answer.data.stats or {}).get("timings")
    if isinstance(timings, dict):
        total = timings.get("execTotalTime")
        if isinstance(total, float | int) and not isinstance(total, bool):
            # An int past a float's range, or a non-finite float, is no time.
            took = float(total) if abs(total) < 1e12 and not math.isnan(total) else 0.0
    return answer.data.result, took


def _auth(fleet: Fleet, s: PrometheusSection) -> tuple[dict[str, str], str | None]:
    try:
        if s.token_env:
            token = fleet.secret(s.token_env, ("prometheus", "token_env"))
            return {"Authorization": f"Bearer {token}"}, None
        if s.username_env and s.password_env:
            user = fleet.secret(s.username_env, ("prometheus", "username_env"))
            word = fleet.secret(s.password_env, ("prometheus", "password_env"))
            pair = base64.b64encode(f"{user}:{word}".encode()).decode()
            return {"Authorization": f"Basic {pair}"}, None
    except MissingSecret as exc:
        return {}, f"no credentials ({exc.short})"
    return {}, None


def _verify(section: PrometheusSection) -> ssl.SSLContext | bool:
    if not section.verify_tls:
        return False
    if section.ca_file:
        return ssl.create_default_context(cafile=section.ca_file)
    return apiclient.tls_context()
