"""HTTP clients for the agents' and the gateway's APIs (httpx; no Textual here).

They carry operator and admin tokens, so they are explicit about where they go: nothing
comes from the environment (`trust_env=False`: no HTTP(S)_PROXY or ALL_PROXY, no .netrc,
no SSL_CERT_FILE), and a token reaches exactly the URL the fleet file names. Every call
has a total deadline (httpx's own timeout is per read, so a trickling server could hold a
call forever) and a cap on the answer's size; answers are asked for uncompressed, so the
cap counts what is held.
"""

from __future__ import annotations

import asyncio
import functools
import json as _json
import ssl
import time
from typing import Any

import httpx

from console.core.units import exact_size_from_bytes

MAX_ANSWER_BYTES = 8 * 1024 * 1024  # an answer here is a job, a plan or a job list: KBs
_HEADERS = {"Accept-Encoding": "identity"}


class NoAnswer(Exception):
    """No usable answer: str() says why (`no answer within 10 s`, `ConnectError: ...`,
    `answered with over 8 MiB`)."""


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for every client: each new one loads the whole certificate store
    (28 ms and 0.8 MiB), which `engineroom jobs` across 1,000 nodes paid 1,000 times."""
    return httpx.create_ssl_context(trust_env=False)


def _settings(
    base_url: str,
    headers: dict[str, str],
    timeout: float,
    verify: ssl.SSLContext | bool | None = None,
) -> dict[str, Any]:
    """What every client here is built with: nothing from the environment. `verify`: a
    context of the caller's (its own CA), False (a fleet file said so), or the shared one."""
    return {
        "base_url": base_url,
        "headers": {**_HEADERS, **headers},
        "timeout": timeout,
        "trust_env": False,
        "verify": tls_context() if verify is None or verify is True else verify,
    }


def async_client(
    base_url: str,
    headers: dict[str, str],
    timeout: float,
    verify: ssl.SSLContext | bool | None = None,
) -> httpx.AsyncClient:
    return httpx.AsyncClient(**_settings(base_url, headers, timeout, verify))


def client(base_url: str, headers: dict[str, str], timeout: float) -> httpx.Client:
    return httpx.Client(**_settings(base_url, headers, timeout))


async def request(
    http: httpx.AsyncClient,
    method: str,
    path: str,
    *,
    json: object = None,
    params: dict[str, str | int] | None = None,
    form: dict[str, str] | None = None,
    deadline_s: float,
    max_bytes: int = MAX_ANSWER_BYTES,
) -> tuple[int, bytes]:
    """One call, answered in full within `deadline_s` and `max_bytes`: (status, body).
    `form` is sent as the body, form-encoded."""
    try:
        async with asyncio.timeout(deadline_s):
            async with http.stream(method, path, json=json, params=params, data=form) as resp:
                return resp.status_code, await _body(resp, max_bytes)
    except TimeoutError:
        raise NoAnswer(f"no answer within {deadline_s:g} s") from None
    except httpx.HTTPError as exc:
        raise NoAnswer(f"{exc.__class__.__name__}: {exc}".rstrip(": ")[:200]) from None


def call(
    http: httpx.Client,
    method: str,
    path: str,
    *,
    json: object = None,
    deadline_s: float,
    max_bytes: int = MAX_ANSWER_BYTES,
) -> tuple[int, bytes]:
    """`request` for a blocking client (the CLI): the same deadline and cap. The deadline
    is checked between reads; each read is bounded by the client's own timeout."""
    end = time.monotonic() + deadline_s
    try:
        with http.stream(method, path, json=json) as resp:
            _check_encoding(resp)
            body = bytearray()
            for chunk in resp.iter_raw():
                body += chunk
                if len(body) > max_bytes:
                    raise NoAnswer(f"answered with over {exact_size_from_bytes(max_bytes)}")
                if time.monotonic() > end:
                    raise NoAnswer(f"no answer within {deadline_s:g} s")
            return resp.status_code, bytes(body)
    except httpx.HTTPError as exc:
        raise NoAnswer(f"{exc.__class__.__name__}: {exc}".rstrip(": ")[:200]) from None


def json_object(body: bytes) -> dict[str, object] | None:
    """An answer's body as a JSON object, or None (not JSON, or not an object: a proxy's
    HTML 502, say)."""
    try:
        data = _json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


async def _body(resp: httpx.Response, max_bytes: int) -> bytes:
    _check_encoding(resp)
    body = bytearray()
    async for chunk in resp.aiter_raw():
        body += chunk
        if len(body) > max_bytes:
            raise NoAnswer(f"answered with over {exact_size_from_bytes(max_bytes)}")
    return bytes(body)


def _check_encoding(resp: httpx.Response) -> None:
    # Asked for identity: a compressed answer could be any size once inflated.
    encoding = resp.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        raise NoAnswer(f"answered compressed ({encoding}) though asked not to")
