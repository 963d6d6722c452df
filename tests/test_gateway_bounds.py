"""The gateway's bounds: how much a misbehaving client or engine can make it hold, and for
how long.

The real gateway (`engineroom gateway`, its own process) runs in front of the engines that
misbehave on purpose in tests/hostile_engine.py (test doubles of broken engines: endless
streams and bodies, a header line that never ends); the misbehaving clients are raw
sockets. Memory is the gateway process's RSS (psutil); every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import re
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import ROOT, agent_env
from tests.engines.servers import free_port, free_ports, log_tail, stop, wait_until
from tests.support.fleet import deployment, fleet_model, fleet_toml

ADMIN = "admin-token-bounds-0123"
MiB = 1024 * 1024
RSS_LIMIT = 100 * MiB  # what one misbehaving peer may add to the gateway's memory

# model name -> (the engine double's mode, the engine kind the gateway speaks to it)
MODELS = {
    "flood": ("flood", "vllm"),
    "endless": ("endless", "vllm"),
    "endless-head": ("endless-head", "vllm"),
    "one-line": ("one-line", "triton"),
    "slow": ("slow", "vllm"),
    "sick": ("enormous-health", "vllm"),  # its /health answer never ends
    "broken": ("endless-500", "vllm"),  # its error answer never ends
    "trickle-head": ("trickle-head", "vllm"),
    "trickle-body": ("trickle-body", "vllm"),
}


def fleet_text(port: int, state: Path, engines: dict[str, int], **settings: object) -> str:
    """The gateway on `port` with `settings`, and one model per entry of MODELS on node
    "local", served by its engine double (`engines`: mode -> port)."""
    return fleet_toml(
        fleet={"name": "bounds"},
        gateway={"url": f"http://127.0.0.1:{port}", "state_dir": state, "health_interval_s": 0.5,
                 **settings},
        nodes=[{"name": "local", "agent": "http://127.0.0.1:9"}],
        models=[
            fleet_model(name, deployment(f"{name}-engine", "local", engine, engines[mode],
                                         engine_model="m"))
            for name, (mode, engine) in MODELS.items()
        ],
    )  # fmt: skip


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    """One misbehaving engine per mode of MODELS, in one process: mode -> port."""
    modes = sorted({mode for mode, _ in MODELS.values()})
    ports = dict(zip(modes, free_ports(len(modes)), strict=True))
    log = tmp_path_factory.mktemp("engines") / "hostile.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "hostile_engine.py"),
             *(f"{m}:{p}" for m, p in ports.items())],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    wait_until(lambda: "listening" in log.read_text(), 20, what="the engine doubles")
    yield ports
    stop(process, grace=2)


@dataclass
class Gateway:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def admin(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)

    def metric(self, name: str) -> float:
        """The sum of a /metrics series over its labels (0 when absent)."""
        total = 0.0
        for line in self.admin("/metrics").text.splitlines():
            if re.match(rf"{name}(\{{|\s)", line):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def inflight(self) -> int:
        return int(self.metric("engineroom_gateway_inflight"))

    def rss(self) -> int:
        return psutil.Process(self.process.pid).memory_info().rss

    def log_lines(self, text: str) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if text in line]


@pytest.fixture
def gateway(tmp_path: Path, engines: dict[str, int]) -> Iterator[Callable[..., Gateway]]:
    started: list[Gateway] = []

    def start(**settings: object) -> Gateway:
        port = free_port()
        settings = {"read_timeout_s": 10.0, **settings}
        fleet = tmp_path / "fleet.toml"
        fleet.write_text(fleet_text(port, tmp_path / "state", engines, **settings))
        log = tmp_path / f"gateway-{len(started)}.log"
        env = {**agent_env(), "ENGINEROOM_ADMIN_TOKEN": ADMIN}
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "console.cli", "gateway", "--fleet", str(fleet)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True,
            )  # fmt: skip
        gw = Gateway(process, port, log)
        started.append(gw)

        def healthy() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"the gateway exited: {log_tail(log)}")
            with contextlib.suppress(httpx.HTTPError):
                routes = gw.admin("/admin/routes").json()
                return all(
                    d["up"]
                    for name, m in routes.items()
                    if name != "sick"
                    for d in m["deployments"]
                )
            return False

        wait_until(healthy, 30, what="the gateway and its deployments")
        return gw

    yield start
    for gw in started:
        stop(gw.process, grace=5)


# -- raw clients ----------------------------------------------------------------------------


def completion_request(model: str, stream: bool, chunked: bool = False) -> bytes:
    body = b'{"model":"%s","prompt":"x","max_tokens":5,"stream":%s}' % (
        model.encode(),
        b"true" if stream else b"false",
    )
    if chunked:  # a chunked upload: the front door hands it to the admin server
        framing, body = b"Transfer-Encoding: chunked", b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    else:
        framing = b"Content-Length: %d" % len(body)
    return b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\n%s\r\n\r\n%s" % (framing, body)


def connect(gw: Gateway, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:  # a small window: the gateway's writes back up sooner
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", gw.port))
    return sock


def read_answer(sock: socket.socket, deadline_s: float = 10) -> tuple[int, bytes]:
    """A whole (Content-Length) answer from a raw socket: (status, body)."""
    data = b""
    deadline = time.monotonic() + deadline_s
    while True:
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            if length and len(body) >= int(length.group(1)):
                return int(head.split(b" ", 2)[1]), body[: int(length.group(1))]
        assert time.monotonic() < deadline, f"no whole answer within {deadline_s} s: {data!r}"
        chunk = sock.recv(65536)
        assert chunk, f"the gateway closed before a whole answer: {data!r}"
        data += chunk


def closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> float | None:
    """Send `trickle` a byte every 0.2 s until the gateway closes the connection; how long
    that took, or None if it was still open after `seconds`."""
    started = time.monotonic()
    for byte in (trickle[i : i + 1] for i in range(len(trickle))):
        if time.monotonic() - started > seconds:
            return None
        try:
            sock.send(byte)
        except OSError:
            return time.monotonic() - started
        readable, _, _ = select.select([sock], [], [], 0.2)
        if readable and _eof(sock):
            return time.monotonic() - started
    readable, _, _ = select.select([sock], [], [], max(0.0, seconds - (time.monotonic() - started)))
    return time.monotonic() - started if readable and _eof(sock) else None


def _eof(sock: socket.socket) -> bool:
    try:
        return sock.recv(65536) == b""
    except OSError:
        return True


def watch_rss(gw: Gateway, done: Callable[[], bool], timeout: float) -> int:
    """Poll the gateway's RSS until `done()`; fail at once if it grows past RSS_LIMIT over
    where it started (so a gateway that buffers without bound never eats the machine).
    Returns the largest growth seen."""
    base = gw.rss()
    grown = 0
    deadline = time.monotonic() + timeout
    while not done():
        grown = max(grown, gw.rss() - base)
        assert grown < RSS_LIMIT, f"the gateway grew by {grown / MiB:.0f} MiB"
        assert time.monotonic() < deadline, f"not done within {timeout} s"
        time.sleep(0.05)
    return max(grown, gw.rss() - base)


# -- a client that stops reading ---------------------------------------------------------------


@pytest.mark.parametrize("path", ["front door", "handed over"])
def test_a_client_that_never_reads_a_flood_is_cut_and_the_gateway_stays_small(gateway, path):
    gw = gateway(write_timeout_s=2.0)
    sock = connect(gw, rcvbuf=4096)
    sock.sendall(completion_request("flood", stream=True, chunked=path == "handed over"))
    started = time.monotonic()
    wait_until(lambda: gw.inflight() == 1, 10, interval=0.05, what="the stream under way")
    grown = watch_rss(gw, lambda: gw.inflight() == 0, timeout=20)
    cut_after = time.monotonic() - started
    print(f"\n{path}: cut after {cut_after:.1f} s, the gateway grew {grown / MiB:.1f} MiB")
    assert cut_after < 2.0 + 8  # the write deadline, with room for a loaded machine
    assert gw.metric("engineroom_gateway_client_stalled_total") == 1
    (line,) = gw.log_lines("stopped reading")  # logged once, without a traceback
    assert "flood" in line and "Traceback" not in gw.log.read_text()
    sock.close()


def test_a_slow_reader_is_paced_by_backpressure_not_cut(gateway):
    """The engine's flood is read only as fast as the client reads: the client keeps
    reading slowly past the write deadline, and is neither cut nor buffered for."""
    gw = gateway(write_timeout_s=2.0)
    sock = connect(gw, rcvbuf=4096)
    sock.sendall(completion_request("flood", stream=True))
    got = 0
    base = gw.rss()
    until = time.monotonic() + 6.0  # three write deadlines
    while time.monotonic() < until:
        chunk = sock.recv(16384)
        assert chunk, f"the stream was cut after {got} bytes"
        got += len(chunk)
        assert gw.rss() - base < RSS_LIMIT, f"the gateway grew by {(gw.rss() - base) / MiB} MiB"
        time.sleep(0.01)  # a reader slower than the engine, by far
    assert got > 64 * 1024 and gw.inflight() == 1
    assert gw.metric("engineroom_gateway_client_stalled_total") == 0
    sock.close()
    wait_until(lambda: gw.inflight() == 0, 10, interval=0.05, what="in flight back to 0")


# -- engines that never end -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "what"),
    [("endless", "an answer over 1048576 bytes"), ("endless-head", "a head over 65536 bytes")],
)
def test_an_answer_that_never_ends_gets_a_502_past_the_cap(gateway, model, what):
    gw = gateway(max_response_bytes=MiB)
    answer: list[httpx.Response] = []
    body = {"model": model, "prompt": "x", "max_tokens": 5}
    client = threading.Thread(
        target=lambda: answer.append(httpx.post(gw.url + "/v1/completions", json=body, timeout=30)),
        daemon=True,
    )
    client.start()
    grown = watch_rss(gw, lambda: bool(answer), timeout=20)
    print(f"\n{model}: the gateway grew {grown / MiB:.1f} MiB")
    (resp,) = answer
    assert resp.status_code == 502, resp.text
    message = resp.json()["error"]["message"]
    assert f"{model}-engine" in message and what in message, message
    assert "max_response_bytes" in message or "head" in what
    wait_until(lambda: gw.inflight() == 0, 10, interval=0.05, what="in flight back to 0")
    assert gw.metric("engineroom_gateway_failures_total") == 1


@pytest.mark.parametrize("model", ["trickle-head", "trickle-body"])
def test_an_engine_that_trickles_its_answer_is_cut_at_read_timeout(gateway, model):
    """read_timeout_s bounds a whole answer (or a stream's head), not only each gap: an
    engine that sends a byte every 0.1 s held the request for ever."""
    gw = gateway(read_timeout_s=1.0)
    started = time.monotonic()
    body = {"model": model, "prompt": "x", "max_tokens": 5}
    resp = httpx.post(gw.url + "/v1/completions", json=body, timeout=30)
    took = time.monotonic() - started
    assert resp.status_code == 503, resp.text
    message = resp.json()["error"]["message"]
    assert f"{model}-engine" in message and "read_timeout_s" in message, message
    assert took < 1.0 + 4, took
    wait_until(lambda: gw.inflight() == 0, 10, interval=0.05, what="in flight back to 0")


def test_a_body_nested_past_the_parser_s_depth_is_a_400_not_a_500(gateway):
    gw = gateway()
    resp = httpx.post(gw.url + "/v1/completions", content=b"[" * 100_000, timeout=10)
    assert resp.status_code == 400, resp.text
    assert "not JSON" in resp.json()["error"]["message"]
    headers = {"Authorization": f"Bearer {ADMIN}"}
    for path in ("/admin/failover", "/admin/failover/plan"):
        resp = httpx.post(gw.url + path, content=b"[" * 100_000, headers=headers, timeout=10)
        assert resp.status_code == 400, (path, resp.text)
    resp = httpx.put(
        gw.url + "/admin/routes/flood", content=b"[" * 100_000, headers=headers, timeout=10
    )
    assert resp.status_code == 422, resp.text
    assert "Traceback" not in gw.log.read_text()


def test_a_triton_stream_line_that_never_ends_is_cut_with_an_error_event(gateway):
    """The SSE line is capped, and the stream the engine broke ends for the client: the
    error event, then the end of the chunked body (it used to wait for the idle close)."""
    gw = gateway(max_response_bytes=MiB)
    body = {"model": "one-line", "prompt": "x", "max_tokens": 5, "stream": True}
    events: list[str] = []
    ended: list[bool] = []

    def client() -> None:
        with httpx.stream("POST", gw.url + "/v1/completions", json=body, timeout=30) as resp:
            events.extend(line for line in resp.iter_lines() if line)
        ended.append(True)

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    watch_rss(gw, lambda: not thread.is_alive(), timeout=20)
    assert ended and len(events) == 1 and "one-line-engine" in events[0], events
    assert "an SSE line over 1048576 bytes" in events[0], events
    wait_until(lambda: gw.inflight() == 0, 10, interval=0.05, what="in flight back to 0")


def test_an_engine_whose_health_answer_never_ends_costs_no_memory(gateway):
    gw = gateway()
    rounds = gw.metric("engineroom_gateway_health_checks_total")
    grown = watch_rss(
        gw,
        lambda: gw.metric("engineroom_gateway_health_checks_total") >= rounds + 6 * len(MODELS),
        timeout=20,
    )
    print(f"\nsix health rounds on an endless /health: the gateway grew {grown / MiB:.1f} MiB")


def test_a_failover_canary_on_an_endless_error_answer_costs_no_memory(gateway):
    gw = gateway()
    plan: list[httpx.Response] = []
    ask = {"model": "broken", "to": "broken-engine"}
    headers = {"Authorization": f"Bearer {ADMIN}"}
    client = threading.Thread(
        target=lambda: plan.append(
            httpx.post(gw.url + "/admin/failover/plan", json=ask, headers=headers, timeout=60)
        ),
        daemon=True,
    )
    client.start()
    watch_rss(gw, lambda: bool(plan), timeout=20)
    (resp,) = plan
    assert resp.status_code == 200 and resp.json()["ok"] is False, resp.text
    assert "the canary through broken-engine failed: HTTP 500" in resp.json()["detail"]


# -- slow and malformed heads ------------------------------------------------------------------

TRICKLE = b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nX-Slow: " + b"s" * 200


def test_a_slow_head_is_cut_on_fresh_and_handed_over_connections_alike(gateway):
    gw = gateway(head_timeout_s=2.0)
    fresh = connect(gw)
    took = closed_within(fresh, 12, TRICKLE)
    assert took is not None and took < 2.0 + 4, took
    # Handed over to the admin server after one request, then trickled.
    handed = connect(gw)
    handed.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
    status, _ = read_answer(handed)
    assert status == 200
    took = closed_within(handed, 12, TRICKLE)
    assert took is not None and took < 2.0 + 4, took
    # A chunked upload (handed over) whose body trickles: 408.
    slow_body = connect(gw)
    slow_body.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{"
    )
    status, body = read_answer(slow_body, deadline_s=12)
    assert status == 408 and b"head_timeout_s" in body, body


def test_a_kept_alive_connection_s_next_head_is_due_head_timeout_s_after_its_last_answer(
    gateway,
):
    """The deadline runs from the last answer, not from the connection's start: a request
    trickled in over most of the first window is answered, and the connection then stays
    open head_timeout_s for the next one (the gateway keeps one timer and moves it on)."""
    gw = gateway(head_timeout_s=2.0)
    sock = connect(gw)
    body = b'{"model":"nope","prompt":"x"}'
    request = b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: %d\r\n" % len(body)
    for line in request.split(b"\r\n")[:-1]:  # a line every 0.3 s: ~0.9 s of the 2
        sock.sendall(line + b"\r\n")
        readable, _, _ = select.select([sock], [], [], 0.3)
        assert not readable, "the gateway answered or closed before the head was whole"
    sock.sendall(b"\r\n" + body)
    status, _ = read_answer(sock)
    assert status == 404
    took = closed_within(sock, 12)
    assert took is not None and 2.0 - 0.3 < took < 2.0 + 4, took


@pytest.mark.parametrize("bad", [b"a\nb", b"a\rb", b"a\x00b"], ids=["LF", "CR", "NUL"])
def test_a_header_line_with_a_bare_lf_cr_or_nul_gets_400(gateway, bad):
    gw = gateway()
    body = b'{"model":"nope","prompt":"x"}'
    sock = connect(gw)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nX-Odd: %s\r\nContent-Length: %d\r\n\r\n%s"
        % (bad, len(body), body)
    )
    status, answer = read_answer(sock)
    assert status == 400, answer
    assert b"line 3" in answer, answer  # says where


def test_a_head_over_16_kib_gets_431_on_any_route(gateway):
    gw = gateway()
    whole = b"\r\nX-Long: " + b"a" * 20000 + b"\r\nContent-Length: 2\r\n\r\n{}"
    for request in (
        b"POST /v1/completions HTTP/1.1" + whole,  # was served
        b"GET /healthz HTTP/1.1" + whole,
        b"GET /healthz HTTP/1.1\r\nX-Unended: " + b"b" * 20000,  # no end of head yet
    ):
        sock = connect(gw)
        sock.sendall(request)
        status, body = read_answer(sock)
        assert status == 431 and b"over 16384 bytes" in body, body


def test_a_malformed_head_is_logged_in_one_line_without_its_key(gateway):
    """aiohttp, which answers the heads FrontDoor hands over, logged a malformed one with a
    traceback and an excerpt of the bad line: here a client's key."""
    gw = gateway()
    for line in (b"Authorization: Bearer key-in-a-bad-line\x01", b"X Bad: key-in-a-bad-line"):
        sock = connect(gw)
        sock.sendall(b"GET /healthz HTTP/1.1\r\n" + line + b"\r\n\r\n")
        status, _ = read_answer(sock)
        assert status == 400
    lines = wait_until(
        lambda: len(found := gw.log_lines("malformed request")) == 2 and found, 10, what="logged"
    )
    assert all("answered 400" in line for line in lines), lines
    text = gw.log.read_text()
    assert "key-in-a-bad-line" not in text and "Traceback" not in text, text


def test_a_wrong_key_gets_401_before_its_body_is_read(gateway, monkeypatch):
    """With client keys, a stranger cannot make the gateway hold an upload: the answer
    comes at the end of the head."""
    monkeypatch.setenv("GW_BOUNDS_KEYS", "key-0123456789")
    gw = gateway(api_keys_env="GW_BOUNDS_KEYS")
    sock = connect(gw)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer nope\r\n"
        b"Content-Length: 4000000\r\n\r\n" + b"x" * 1000
    )
    status, body = read_answer(sock, deadline_s=5)
    assert status == 401 and b"invalid_api_key" in body, body


def test_connections_over_the_cap_get_503_and_one_log_line(gateway):
    gw = gateway(max_connections=8)
    held = [connect(gw) for _ in range(8)]
    over = [connect(gw) for _ in range(2)]
    for sock in over:
        status, body = read_answer(sock)
        assert status == 503 and b"max_connections (8)" in body, body
    assert len(gw.log_lines("max_connections")) == 1
    for sock in held + over:
        sock.close()

    def served() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(gw.url + "/healthz", timeout=2).status_code == 200
        return False

    wait_until(served, 10, what="a connection served again once others closed")


# -- a client that hangs up ----------------------------------------------------------------


def test_a_client_that_hangs_up_is_counted_not_logged_as_a_gateway_failure(gateway):
    gw = gateway()
    sock = connect(gw)  # a plain answer the client leaves before it comes (the engine takes 1 s)
    sock.sendall(completion_request("slow", stream=False))
    wait_until(lambda: gw.inflight() == 1, 10, interval=0.05, what="the request under way")
    sock.close()
    wait_until(lambda: gw.metric("engineroom_gateway_client_gone_total") == 1, 10, what="counted")
    sock = connect(gw)  # a stream the client leaves in the middle
    sock.sendall(completion_request("flood", stream=True))
    assert sock.recv(1024).startswith(b"HTTP/1.1 200")
    sock.close()
    wait_until(lambda: gw.metric("engineroom_gateway_client_gone_total") == 2, 10, what="counted")
    wait_until(lambda: gw.inflight() == 0, 10, interval=0.05, what="in flight back to 0")
    text = gw.log.read_text()
    assert "failed on a request" not in text and "Traceback" not in text, text
    assert len(gw.log_lines("went away")) == 2


def test_a_content_length_of_five_thousand_digits_is_refused_not_a_traceback(gateway):
    """int() refuses a string of over 4,300 digits: FrontDoor's parse raised, the
    connection dropped and asyncio logged a traceback (issue 27, a sibling of #2)."""
    gw = gateway()
    sock = connect(gw)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: "
        + b"9" * 5000
        + b"\r\n\r\n{}"
    )
    status, _ = read_answer(sock)
    assert 400 <= status < 500, status
    assert "Traceback" not in gw.log.read_text()
    sock = connect(gw)  # and it goes on serving
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
    assert read_answer(sock)[0] == 200
