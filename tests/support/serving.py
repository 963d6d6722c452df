"""A server the test started as its own process is up: it answers as it should, and if it
exits meanwhile the test fails at once with the tail of its log, not at the deadline."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.engines.servers import log_tail, wait_until


def wait_serving(
    process: subprocess.Popen[bytes],
    log: Path,
    answers: Callable[[], bool],
    what: str,
    timeout: float = 30,
) -> None:
    """Wait until `answers()` is true (an HTTP error: not yet); `what` exited: its log."""

    def up() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited {process.returncode}:\n{log_tail(log)}")
        try:
            return answers()
        except httpx.HTTPError:
            return False

    wait_until(up, timeout, what=what)
