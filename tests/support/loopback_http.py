"""The test doubles' HTTP servers: a real server on a free loopback port, in a thread of
the test process, from the `with` block's start to its end."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that keeps its access log off the test's stderr."""

    def log_message(self, *args: Any) -> None:
        pass


class LoopbackHttp:
    """Serves `handler` at `url` (127.0.0.1:`port`) while in its `with` block; a TEST
    DOUBLE's base."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)
