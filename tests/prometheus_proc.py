"""A real Prometheus (Debian's `prometheus` package) on loopback, for the tests.

Plain functions and one class, no pytest, so a test module, a fixture or a benchmark can use
it:

    prom = start_prometheus(workdir, scrape_configs=[{...}])     # or config_text="..."
    prom.wait_targets_up(2, timeout=30)
    prom.query('engineroom_gpu_temperature_celsius')            # the result vector
    stop_prometheus(prom)

It never starts the packaged service: each call runs its own `prometheus` with a generated
configuration (1 s scrape and evaluation interval by default), its own TSDB directory and
its own port. Readiness is `/-/ready` answering 200, within a deadline. Its log is read
from a pipe into a bounded ring of lines (`LOG_LINES` lines of at most `LOG_LINE_BYTES`
bytes), so a chatty Prometheus cannot fill the disk or the test's memory; `log_tail()`
gives the tail for error messages.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from tests.engines.servers import free_port, stop, wait_until

LOG_LINES = 400
LOG_LINE_BYTES = 4096
READY_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 5.0


class PrometheusError(RuntimeError):
    """Prometheus is missing, exited, missed a deadline or answered an error."""


class LogRing:
    """The last `lines` lines of a stream, each cut at `line_bytes`; read by a thread."""

    def __init__(self, lines: int = LOG_LINES, line_bytes: int = LOG_LINE_BYTES) -> None:
        self.lines: deque[str] = deque(maxlen=lines)
        self.line_bytes = line_bytes
        self.dropped = 0  # lines pushed out of the ring
        self._lock = threading.Lock()

    def feed(self, stream: IO[bytes]) -> None:
        """Read `stream` to its end (blocking); run it in a thread."""
        for raw in iter(lambda: stream.readline(self.line_bytes), b""):
            if not raw.endswith(b"\n") and len(raw) == self.line_bytes:
                # The rest of an over-long line: skip to its end, so it is not a new line.
                while (more := stream.readline(self.line_bytes)) and not more.endswith(b"\n"):
                    pass
            with self._lock:
                if len(self.lines) == self.lines.maxlen:
                    self.dropped += 1
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def tail(self, n: int = 40) -> str:
        with self._lock:
            return "\n".join(list(self.lines)[-n:])


@dataclass
class PrometheusProc:
    """A running Prometheus: its process, URL, configuration and log."""

    process: subprocess.Popen[bytes]
    port: int
    url: str  # http://127.0.0.1:PORT
    config_path: Path
    data_dir: Path
    log: LogRing
    ready_s: float = 0.0
    _reader: threading.Thread | None = field(default=None, repr=False)

    def log_tail(self, n: int = 40) -> str:
        return self.log.tail(n)

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/PATH; the `data` of a success, else PrometheusError with the error."""
        try:
            resp = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=HTTP_TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise PrometheusError(f"GET {self.url}/api/v1/{path}: {exc}") from exc
        try:
            body = resp.json()
        except ValueError:
            raise PrometheusError(
                f"GET /api/v1/{path}: HTTP {resp.status_code}, not JSON: {resp.text[:200]!r}"
            ) from None
        if body.get("status") != "success":
            raise PrometheusError(
                f"GET /api/v1/{path} {params}: {body.get('errorType')}: {body.get('error')}"
            )
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result (a vector's samples; [] when nothing matches)."""
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: str) -> list[dict[str, Any]]:
        data = self.api("query_range", query=expr, start=str(start), end=str(end), step=step)
        result: list[dict[str, Any]] = data["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets, each with its `health`, `lastError` and labels."""
        active: list[dict[str, Any]] = self.api("targets")["activeTargets"]
        return active

    def wait_targets_up(self, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Wait until `count` targets are known and all of them are up; return them."""

        def all_up() -> list[dict[str, Any]] | None:
            self.check_alive()
            targets = self.targets()
            if len(targets) >= count and all(t["health"] == "up" for t in targets):
                return targets
            return None

        try:
            return wait_until(all_up, timeout, interval=0.2, what="Prometheus targets up")
        except TimeoutError as exc:
            raise PrometheusError(f"{exc}; targets: {self._targets_said()}") from None

    def wait_query(
        self,
        expr: str,
        timeout: float = 30.0,
        accept: Callable[[list[dict[str, Any]]], bool] = bool,
    ) -> list[dict[str, Any]]:
        """Wait until `expr` answers a result that `accept` takes (by default non-empty)."""

        def answered() -> list[dict[str, Any]] | None:
            self.check_alive()
            result = self.query(expr)
            return result if accept(result) else None

        try:
            return wait_until(answered, timeout, interval=0.2, what=f"query {expr!r}")
        except TimeoutError as exc:
            raise PrometheusError(f"{exc}; last answer: {self.query(expr)!r:.400}") from None

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise PrometheusError(
                f"prometheus exited with code {self.process.returncode}:\n{self.log_tail()}"
            )

    def _targets_said(self) -> str:
        try:
            return "; ".join(
                f"{t['scrapeUrl']} {t['health']} {t.get('lastError', '')}".strip()
                for t in self.targets()
            )
        except PrometheusError as exc:
            return str(exc)


def prometheus_binary() -> str:
    """The `prometheus` on PATH, else PrometheusError saying how to install it."""
    found = shutil.which("prometheus")
    if found is None:
        raise PrometheusError(
            "prometheus not found on PATH: run `make prometheus` (Debian package)"
        )
    return found


def promtool_binary() -> str:
    found = shutil.which("promtool")
    if found is None:
        raise PrometheusError("promtool not found on PATH: run `make prometheus` (Debian package)")
    return found


def config_text(
    scrape_configs: Sequence[dict[str, Any]],
    interval: str = "1s",
    rule_files: Sequence[str | Path] = (),
) -> str:
    """A prometheus.yml for `scrape_configs` (JSON is valid YAML, so no YAML library)."""
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": list(scrape_configs),
    }
    if rule_files:
        config["rule_files"] = [str(p) for p in rule_files]
    return json.dumps(config, indent=2) + "\n"


def start_prometheus(
    workdir: Path,
    scrape_configs: Sequence[dict[str, Any]] = (),
    *,
    config: str | None = None,
    data_dir: Path | None = None,
    extra_args: Sequence[str] = (),
    port: int | None = None,
    timeout: float = READY_TIMEOUT_S,
) -> PrometheusProc:
    """Start Prometheus with `config` (YAML text) or one built from `scrape_configs`.

    `data_dir` may hold blocks made beforehand (promtool tsdb create-blocks-from ...);
    by default a fresh directory under `workdir`. Ready when /-/ready answers 200.
    """
    binary = prometheus_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "prometheus.yml"
    config_path.write_text(config if config is not None else config_text(scrape_configs))
    data_dir = data_dir or workdir / "tsdb"
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    argv = [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={data_dir}",
        f"--web.listen-address=127.0.0.1:{port}",
        *extra_args,
    ]
    started = time.monotonic()
    process = subprocess.Popen(
        argv,
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log = LogRing()
    assert process.stdout is not None
    reader = threading.Thread(target=log.feed, args=(process.stdout,), daemon=True)
    reader.start()
    prom = PrometheusProc(
        process, port, f"http://127.0.0.1:{port}", config_path, data_dir, log, _reader=reader
    )

    def ready() -> bool:
        prom.check_alive()
        try:
            return httpx.get(f"{prom.url}/-/ready", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, timeout, interval=0.1, what="prometheus /-/ready")
    except TimeoutError as exc:
        stop_prometheus(prom)
        raise PrometheusError(f"{exc}; log:\n{prom.log_tail()}") from None
    except PrometheusError:
        stop_prometheus(prom)
        raise
    prom.ready_s = time.monotonic() - started
    return prom


def stop_prometheus(prom: PrometheusProc, grace: float = 10.0) -> int:
    """SIGTERM, then SIGKILL after `grace` s; joins the log reader. The exit code."""
    code = stop(prom.process, grace=grace)
    if prom._reader is not None:
        prom._reader.join(timeout=grace)
    return code


def promtool(
    *args: str, stdin: str | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """`promtool ARGS...`, its output captured (a deadline; never a shell)."""
    return subprocess.run(
        [promtool_binary(), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
