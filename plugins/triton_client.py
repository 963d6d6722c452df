"""tritonclient's aio client, bounded: a per-call timeout and a body size cap.

Kept apart from plugins.triton so that tritonclient, aiohttp and gevent load only on
nodes that run Triton.
"""

from __future__ import annotations

import aiohttp
from tritonclient._client import InferenceServerClientBase
from tritonclient.http.aio import InferenceServerClient

from console.core.fetch import FetchError


class _CappedResponse(aiohttp.ClientResponse):
    """Reads at most `max_bytes` of a body, so a lying server cannot fill the agent's memory."""

    max_bytes = 8 * 1024 * 1024

    async def read(self) -> bytes:
        if self._body is None:
            chunks = []
            size = 0
            async for chunk in self.content.iter_chunked(64 * 1024):
                size += len(chunk)
                if size > self.max_bytes:
                    self.close()
                    raise FetchError(f"response too large (over {self.max_bytes} bytes)")
                chunks.append(chunk)
            self._body = b"".join(chunks)
        return self._body


class BoundedClient(InferenceServerClient):
    """tritonclient's aio client with a per-call timeout and a body size cap.

    It sets up the same fields as InferenceServerClient.__init__ (tritonclient 2.5x-2.7x),
    but with our own aiohttp session, so no session is left unclosed.
    """

    def __init__(self, netloc: str, timeout: float, max_bytes: int) -> None:
        InferenceServerClientBase.__init__(self)
        capped = type("Capped", (_CappedResponse,), {"max_bytes": max_bytes})
        self._url = f"http://{netloc}"
        self._conn = aiohttp.TCPConnector(limit=4)
        self._stub = aiohttp.ClientSession(
            connector=self._conn,
            timeout=aiohttp.ClientTimeout(total=timeout),
            auto_decompress=False,
            response_class=capped,
            trust_env=False,  # never a proxy from the environment
        )
        self._verbose = False
