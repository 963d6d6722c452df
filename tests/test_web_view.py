"""The console on the incident bridge: `engineroom serve --web`, read-only, behind a token.

Two real agents on loopback and the real web server (textual-serve's page and protocol,
one real console process per browser session). The last test drives Debian's headless
Chromium over the DevTools protocol: it reads the rendered terminal, presses the acting
keys, and checks that the page says "read-only view" and the agents ran nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import psutil
import pytest
from aiohttp.test_utils import TestServer

from console.core.config.load import parse_fleet
from console.tui.web import serve as web_module
from console.tui.web.serve import (
    COOKIE,
    MAX_COLUMNS,
    MAX_MESSAGE_BYTES,
    MAX_ROWS,
    STDERR_TAIL_BYTES,
    ConsoleSession,
    WebSettings,
    WebView,
    _bounded,
    session_environment,
)
from console.tui.web.session import WebViewApp
from tests.chromium_cdp import TERMINAL_HOOK, Chromium, chromium_binary
from tests.conftest import OPERATOR, ROOT, VIEWER, agent_env, run_cli, start_agent
from tests.engines.servers import free_port, free_ports, stop, wait_until
from tests.support.fleet import deployment, fleet_model, fleet_toml, vllm_profile
from tests.support.serving import wait_serving
from tests.tui_support import until

WEB_TOKEN = "web-token-0123456789abcdef"
OPERATOR_SECRET = OPERATOR.split(":", 1)[1]
# docs/web.md's screenshot: `make screenshots` names its folder; a test run leaves the
# checkout as it was and saves it under its tmp path.
SCREENSHOTS_ENV = "ENGINEROOM_SCREENSHOTS"


def fleet_text(
    state: Path, port_a: int, port_b: int, gateway_port: int, engine_port: int, python: str
) -> str:
    """Two nodes, web-a and web-b, a gateway, and model tiny on web-a's vLLM (its profile
    too). The agent's engines: this test's only, not whatever else runs on the host."""
    return fleet_toml(
        fleet={"name": "bridge", "environment": "staging", "refresh_s": 0.5},
        agent={"state_dir": state, "scrape_interval_s": 0.5, "discover": False},
        nodes=[{"name": n, "agent": f"http://127.0.0.1:{p}", "token_env": "T_WEB_NODE"}
               for n, p in [("web-a", port_a), ("web-b", port_b)]],
        gateway={"url": f"http://127.0.0.1:{gateway_port}"},
        models=[fleet_model("tiny", deployment("tiny-vllm", "web-a", "vllm", engine_port,
                                               weight=100))],
        profiles={"tiny": vllm_profile("web-a", state / "model", engine_port, python, args=None)},
    )  # fmt: skip


@dataclass
class Bridge:
    fleet: Path
    text: str
    agents: dict[str, str]  # node -> agent URL

    def jobs(self) -> dict[str, list]:
        return {
            node: httpx.get(
                f"{url}/v1/jobs", headers={"Authorization": f"Bearer {VIEWER}"}, timeout=10
            ).json()
            for node, url in self.agents.items()
        }


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    """Two real agents, web-a and web-b, and the console's fleet file that names them."""
    root = tmp_path_factory.mktemp("bridge")
    port_a, port_b, gateway_port, engine_port = free_ports(4)
    started = []
    for node, port in (("web-a", port_a), ("web-b", port_b)):
        text = fleet_text(
            state=root / node,
            port_a=port_a,
            port_b=port_b,
            gateway_port=gateway_port,
            engine_port=engine_port,
            python=sys.executable,
        )
        workdir = root / f"agent-{node}"
        workdir.mkdir()
        started.append(start_agent(workdir, text, node, port))
    fleet = root / "fleet.toml"
    fleet.write_text(text)
    try:
        yield Bridge(fleet, text, {"web-a": started[0].url, "web-b": started[1].url})
    finally:
        for agent in started:
            stop(agent.process, grace=5)


@dataclass
class WebServer:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def children(self) -> list[psutil.Process]:
        return psutil.Process(self.process.pid).children(recursive=True)


def serve_web(
    bridge: Bridge, *extra: str, fleet: Path | None = None, env: dict[str, str] | None = None
) -> WebServer:
    """`engineroom serve --web` as a real process; up once its page answers (401)."""
    port = free_port()
    log = bridge.fleet.parent / f"web-{port}.log"
    environ = agent_env(ENGINEROOM_WEB_TOKEN=WEB_TOKEN, T_WEB_NODE=OPERATOR_SECRET)
    environ["ENGINEROOM_ADMIN_TOKEN"] = "admin-token-0123456789"  # the gateway's: it can act
    environ.update(env or {})
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "console.cli", "serve", "--web"),
                *("--listen", f"127.0.0.1:{port}", "--fleet", str(fleet or bridge.fleet)),
                *extra,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environ,
            cwd=ROOT,
            start_new_session=True,
        )
    server = WebServer(process, f"http://127.0.0.1:{port}", log)

    wait_serving(process, log, lambda: httpx.get(server.url + "/", timeout=2).status_code == 401,
                 "serve --web")  # fmt: skip
    return server


@pytest.fixture(scope="module")
def server(bridge: Bridge) -> Iterator[WebServer]:
    web = serve_web(bridge)
    yield web
    stop(web.process, grace=10)
    leaked = web.log.read_text(errors="replace")
    assert WEB_TOKEN not in leaked and OPERATOR_SECRET not in leaked


def bearer(token: str = WEB_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Session:
    http: aiohttp.ClientSession
    ws: aiohttp.ClientWebSocketResponse

    async def close(self) -> None:
        await self.ws.close()
        await self.http.close()

    async def closed_by_server(self, timeout: float) -> None:
        """Read (and drop) the console's frames until the server closes the socket."""
        ended = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        async with asyncio.timeout(timeout):
            while (await self.ws.receive()).type not in ended:
                pass


async def open_session(url: str, headers: dict[str, str]) -> Session:
    """A browser session's websocket, once the console has drawn its first frame."""
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
    try:
        ws = await http.ws_connect(
            url.replace("http", "ws") + "/ws?width=120&height=40", headers=headers
        )
        async with asyncio.timeout(60):
            while (message := await ws.receive()).type != aiohttp.WSMsgType.BINARY:
                assert message.type == aiohttp.WSMsgType.TEXT, f"the session closed: {message}"
    except BaseException:
        await http.close()
        raise
    return Session(http, ws)


async def handshake_status(url: str, headers: dict[str, str] | None = None) -> int:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        try:
            ws = await http.ws_connect(url.replace("http", "ws") + "/ws", headers=headers)
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status
        await ws.close()
        return 101


# -- the guard ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/static/js/textual.js", "/ws", "/download/x", "/nope"])
def test_every_route_answers_401_without_the_token(server: WebServer, path: str) -> None:
    for headers in ({}, bearer("web-token-wrong-wrong-wrong"), {"Cookie": f"{COOKIE}=forged"}):
        response = httpx.get(server.url + path, headers=headers, timeout=10)
        assert response.status_code == 401, (path, headers)
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert "needs its token" in response.text


def test_the_page_opens_with_the_token_once_then_a_cookie_that_is_not_the_token(
    server: WebServer,
) -> None:
    assert httpx.get(server.url + "/?token=not-the-token-at-all", timeout=10).status_code == 401
    first = httpx.get(f"{server.url}/?token={WEB_TOKEN}", timeout=10)
    assert first.status_code == 303 and first.headers["Location"] == "/"
    cookie = first.cookies[COOKIE]
    assert cookie and WEB_TOKEN not in cookie
    assert "HttpOnly" in first.headers["Set-Cookie"]
    assert "SameSite=Strict" in first.headers["Set-Cookie"]
    page = httpx.get(server.url + "/", cookies={COOKIE: cookie}, timeout=10)
    assert page.status_code == 200 and "/ws" in page.text and "read-only" in page.text
    assert page.headers["Cache-Control"] == "no-store"
    proxied = httpx.get(server.url + "/", headers={**bearer(), "X-Forwarded-Proto": "https"})
    assert "wss://" in proxied.text  # behind a TLS proxy the page asks for wss://
    static = httpx.get(server.url + "/static/js/textual.js", headers=bearer(), timeout=10)
    assert static.status_code == 200


async def test_the_websocket_answers_401_without_the_token_and_403_to_another_site(
    server: WebServer,
) -> None:
    assert await handshake_status(server.url) == 401
    assert await handshake_status(server.url, headers=bearer("web-token-wrong-wrong")) == 401
    assert await handshake_status(server.url, headers={"Cookie": f"{COOKIE}=forged"}) == 401
    foreign = {**bearer(), "Origin": "https://evil.example"}
    assert await handshake_status(server.url, headers=foreign) == 403
    # And with the token, a console answers: its first frame comes over the socket.
    ws = await open_session(server.url, headers=bearer())
    await ws.close()


def test_serve_refuses_to_start_without_a_usable_token(bridge: Bridge) -> None:
    env = agent_env()
    missing = run_cli("serve", "--web", "--fleet", str(bridge.fleet), env=env)
    assert missing.returncode == 3
    assert "ENGINEROOM_WEB_TOKEN is not set" in missing.stderr
    short = run_cli(
        "serve",
        "--web",
        "--fleet",
        str(bridge.fleet),
        "--token-env",
        "MY_WEB",
        env={**env, "MY_WEB": "short-secret"},
    )
    assert short.returncode == 3
    assert "MY_WEB holds 12 characters" in short.stderr and "short-secret" not in short.stderr


# -- no token that can act ---------------------------------------------------------------


def test_a_web_session_holds_only_the_agents_viewer_token(bridge: Bridge) -> None:
    fleet = parse_fleet(bridge.text)
    environ = agent_env(
        ENGINEROOM_WEB_TOKEN=WEB_TOKEN,
        T_WEB_NODE=OPERATOR_SECRET,
        ENGINEROOM_ADMIN_TOKEN="admin-token-0123456789",
    )
    env, how = session_environment(fleet, environ, "ENGINEROOM_WEB_TOKEN")
    assert "viewer token" in how
    assert "ENGINEROOM_GATEWAY_VIEWER_TOKEN is not set" in how
    assert env["T_WEB_NODE"] == VIEWER
    for gone in ("ENGINEROOM_WEB_TOKEN", "ENGINEROOM_ADMIN_TOKEN", "ENGINEROOM_OPERATOR_TOKEN"):
        assert gone not in env
    # The gateway's viewer token, where set, takes the admin token's place: the session
    # reads routes and the gateway's figures, and the gateway refuses its actions
    # (tests/test_gateway.py::test_the_viewer_token_reads_everything_and_acts_on_nothing).
    with_gateway = {**environ, "ENGINEROOM_GATEWAY_VIEWER_TOKEN": "gateway-viewer-0123456789"}
    env, how = session_environment(fleet, with_gateway, "ENGINEROOM_WEB_TOKEN")
    assert env["ENGINEROOM_ADMIN_TOKEN"] == "gateway-viewer-0123456789"
    assert "the gateway's viewer token (ENGINEROOM_GATEWAY_VIEWER_TOKEN)" in how
    # What the real agent makes of the two: the session's token may only look.
    url = bridge.agents["web-a"] + "/v1/whoami"
    for token, role in ((environ["T_WEB_NODE"], "operator"), (env["T_WEB_NODE"], "viewer")):
        answer = httpx.get(url, headers=bearer(token), timeout=10).json()
        assert answer["role"] == role

    # Without a viewer token the nodes keep their own, and the start line says so.
    del environ["ENGINEROOM_VIEWER_TOKEN"]
    env, how = session_environment(fleet, environ, "ENGINEROOM_WEB_TOKEN")
    assert env["T_WEB_NODE"] == OPERATOR_SECRET
    assert "ENGINEROOM_VIEWER_TOKEN is not set" in how


# What a read-only console needs from the server's environment, and nothing more: where
# programs, its home and temporary files are, who it runs as, its language and time zone,
# where Python finds the console; the terminal textual-serve describes; and the tokens it
# reads with, under the names the fleet reads them from.
SESSION_NEEDS = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR"}
SESSION_NEEDS |= {"PYTHONPATH"}
TERMINAL = {
    "TEXTUAL_DRIVER",
    "TEXTUAL_FPS",
    "TEXTUAL_COLOR_SYSTEM",
    "TERM_PROGRAM",
    "COLUMNS",
    "ROWS",
}
GATEWAY_VIEWER = "gateway-viewer-0123456789"
# What a deployment's server may hold that can act, or is another tool's.
ACTING = {
    "ENGINEROOM_OPERATOR_TOKEN": OPERATOR,
    "ENGINEROOM_ADMIN_TOKEN": "admin-token-0123456789",
    "ROUTER_API_KEY": "router-key-0123456789abcdef",  # the vLLM router's data plane
    "GATEWAY_CLIENT_KEYS": "client-key-0123456789,client-key-abcdefghij",
    "AWS_SECRET_ACCESS_KEY": "another-tools-secret-0123456789",
}
ROUTED = """
[[dataplanes]]
name = "router"
kind = "vllm-router"
url = "http://127.0.0.1:9"
token_env = "ROUTER_API_KEY"
"""


async def test_a_web_sessions_process_holds_only_what_a_read_only_console_needs(
    bridge: Bridge,
) -> None:
    """Before: the console process kept the server's whole environment less four names,
    the vLLM router's API key, the gateway's client keys and any other secret among it."""
    text = bridge.text.replace("[gateway]\n", '[gateway]\napi_keys_env = "GATEWAY_CLIENT_KEYS"\n')
    fleet = bridge.fleet.parent / "fleet-routed.toml"
    fleet.write_text(text + ROUTED)
    env = {**ACTING, "ENGINEROOM_GATEWAY_VIEWER_TOKEN": GATEWAY_VIEWER, "LC_TIME": "C.UTF-8"}
    web = serve_web(bridge, fleet=fleet, env=env)
    try:
        session = await open_session(web.url, headers=bearer())
        [console] = web.children()
        held = console.environ()  # /proc/PID/environ: what it was started with
        await session.close()
    finally:
        stop(web.process, grace=10)
    reads = {"T_WEB_NODE", "ENGINEROOM_ADMIN_TOKEN"}  # each node's; the gateway's
    assert set(held) <= SESSION_NEEDS | TERMINAL | reads | {"LC_TIME"}, sorted(set(held))
    assert held["T_WEB_NODE"] == VIEWER and held["ENGINEROOM_ADMIN_TOKEN"] == GATEWAY_VIEWER
    assert held["LC_TIME"] == "C.UTF-8" and held["PATH"] == os.environ["PATH"]
    secrets = [key for value in ACTING.values() for key in value.split(",")]
    secrets += [OPERATOR_SECRET, WEB_TOKEN]
    assert not [s for s in secrets for value in held.values() if s in value]


def test_a_web_session_reads_prometheus_and_ssh_nodes_with_the_servers_credentials(
    bridge: Bridge,
) -> None:
    """The allow-list names what the console reads with, and only that."""
    text = (
        bridge.text
        + ROUTED
        + (
            '\n[[nodes]]\nname = "web-c"\nssh = "ops@127.0.0.1"\n'
            '\n[prometheus]\nurl = "http://127.0.0.1:9"\nusername_env = "PROM_USER"\n'
            'password_env = "PROM_PASSWORD"\n'
        )
    )
    environ = {
        **ACTING,
        "PROM_USER": "reader",
        "PROM_PASSWORD": "prometheus-password",
        "SSH_AUTH_SOCK": "/run/user/1000/ssh-agent.sock",
        "ENGINEROOM_VIEWER_TOKEN": VIEWER,
        "HOME": "/home/ops",
    }
    env, how = session_environment(parse_fleet(text), environ, "ENGINEROOM_WEB_TOKEN")
    assert env == {
        "HOME": "/home/ops",
        "PROM_USER": "reader",
        "PROM_PASSWORD": "prometheus-password",
        "SSH_AUTH_SOCK": "/run/user/1000/ssh-agent.sock",
        "T_WEB_NODE": VIEWER,
    }
    assert "agentless nodes with the server's SSH keys" in how


# -- read-only ---------------------------------------------------------------------------


async def test_every_acting_key_answers_read_only_view(
    bridge: Bridge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session's console itself, in-process: the keys and the :start command."""
    monkeypatch.setenv("T_WEB_NODE", OPERATOR_SECRET)  # even an operator token stays unused
    before = bridge.jobs()
    app = WebViewApp(parse_fleet(bridge.text))
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, lambda: app.collector.states["web-a"].snapshot, what="web-a")
        app.open_node("web-a")
        await pilot.press("s", "x", "r")
        await pilot.press("m", "s", "f", "R", "p")
        await pilot.press("d", "R")
        await pilot.press("colon", *"start tiny", "enter")
        await until(pilot, lambda: len(app.refused) >= 9, what="nine refusals")
    assert app.refused == [
        "starting vLLM",  # on the Node screen: s, x, r
        "stopping an engine",
        "restarting an engine",
        "starting vLLM",  # on Models: s, f, R, p
        "failing over",
        "running a drill",
        "the incident playbook",
        "running a drill",  # on Drills: R
        "starting vLLM",  # :start tiny
    ]
    assert bridge.jobs() == before


# -- bounds ------------------------------------------------------------------------------


async def test_sessions_are_capped_and_a_closed_one_frees_its_slot(bridge: Bridge) -> None:
    web = serve_web(bridge, "--max-sessions", "1")
    try:
        first = await open_session(web.url, headers=bearer())
        assert len(web.children()) == 1  # one console process per session
        assert await handshake_status(web.url, headers=bearer()) == 503
        await first.close()
        # Its console quits (or is killed after the grace) and the slot comes back.
        await asyncio.to_thread(
            wait_until, lambda: not web.children(), timeout=30, what="the console to exit"
        )
        again = await open_session(web.url, headers=bearer())
        consoles = web.children()
        # The server going away stops its consoles: none is left behind.
        stop(web.process, grace=10)
        await asyncio.to_thread(
            wait_until,
            lambda: not any(p.is_running() and p.status() != "zombie" for p in consoles),
            timeout=15,
            what="the consoles to exit with the server",
        )
        await again.close()
    finally:
        stop(web.process, grace=10)


# -- in a real browser -------------------------------------------------------------------


@pytest.mark.skipif(
    chromium_binary() is None, reason="no chromium on PATH (make chromium installs it)"
)
async def test_chromium_sees_the_fleet_and_no_key_changes_it(
    server: WebServer, bridge: Bridge, tmp_path: Path
) -> None:
    screenshot = Path(os.environ.get(SCREENSHOTS_ENV) or tmp_path) / "web-readonly.png"
    before = bridge.jobs()
    async with Chromium(width=1600, height=900) as browser:
        page = await browser.page()
        await page.call("Page.addScriptToEvaluateOnNewDocument", source=TERMINAL_HOOK)
        await page.call("Page.navigate", url=f"{server.url}/?token={WEB_TOKEN}&fontsize=14")
        await page.wait_for_text(["web-a", "web-b", "READ-ONLY", "nodes 2 up"], 90, "the fleet")
        assert await page.evaluate("location.search") == ""  # the token left the address
        await page.evaluate("document.querySelector('.xterm-helper-textarea').focus()")

        await page.press("m")
        await page.wait_for_text(["MODEL / DEPLOYMENT", "tiny"], 30, "the Models table")
        await page.press("s")
        await page.wait_for_text(["read-only view: starting vLLM is disabled"], 30, "s")
        await page.screenshot(screenshot)
        await page.press("f")
        await page.wait_for_text(["read-only view: failing over is disabled"], 30, "f")
        await page.press("R")
        await page.wait_for_text(["read-only view: running a drill is"], 30, "R")

        await page.press("n")
        await page.press("Enter")  # the first node: web-a
        await page.wait_for_text(["web-a", "Node"], 30, "the Node screen")
        await page.press("x")
        await page.wait_for_text(["read-only view: stopping an engine"], 30, "x")
        await page.press("r")
        await page.wait_for_text(["read-only view: restarting an"], 30, "r")
    assert bridge.jobs() == before
    assert screenshot.stat().st_size > 10_000


# -- a console process at its limits -----------------------------------------------------
# The real console never hangs before its first line, floods a frame or ignores quit:
# these small processes do, speaking its protocol (doubles of a console gone wrong).

CONSOLE_DOUBLES = {
    "silent": "import time; time.sleep(600)",
    "huge_frame": (
        "import sys, time; out = sys.stdout.buffer; "
        "out.write(b'__GANGLION__\\n' + b'D' + (1 << 30).to_bytes(4, 'big')); out.flush(); "
        "time.sleep(600)"
    ),
    "deaf": (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "sys.stdout.buffer.write(b'__GANGLION__\\n'); sys.stdout.flush(); time.sleep(600)"
    ),
    "noisy": "import sys; sys.stderr.write('x' * 1_000_000 + 'THE END'); sys.exit(1)",
}


async def console_double(kind: str) -> tuple[ConsoleSession, asyncio.Event]:
    closed = asyncio.Event()

    async def close() -> None:
        closed.set()

    async def drop(_: object) -> None:
        return None

    session = ConsoleSession(
        [sys.executable, "-c", CONSOLE_DOUBLES[kind]],
        dict(os.environ),
        start_deadline_s=1.0,
        stop_grace_s=1.0,
        write_bytes=drop,
        write_str=drop,
        close=close,
    )
    await session.start(80, 24)
    return session, closed


async def test_a_console_that_never_starts_is_killed_at_its_deadline() -> None:
    session, closed = await console_double("silent")
    async with asyncio.timeout(20):
        await closed.wait()  # the page says "Session ended"
    assert session._process is not None and session._process.returncode == -signal.SIGKILL
    await session.stop()


async def test_a_frame_over_the_limit_ends_the_session() -> None:
    session, closed = await console_double("huge_frame")
    async with asyncio.timeout(20):
        await closed.wait()
    assert session.started.is_set()
    assert session._process is not None and session._process.returncode is not None
    await session.stop()


async def test_a_console_that_will_not_quit_is_killed_after_the_grace() -> None:
    session, _ = await console_double("deaf")
    async with asyncio.timeout(20):
        await session.started.wait()
        await session.stop()  # quit is asked, ignored; SIGKILL after 1 s
    assert session._process is not None and session._process.returncode == -signal.SIGKILL


async def test_the_stderr_kept_of_a_console_is_bounded() -> None:
    session, closed = await console_double("noisy")
    async with asyncio.timeout(20):
        await closed.wait()
    assert len(session.stderr_tail) <= STDERR_TAIL_BYTES
    assert bytes(session.stderr_tail).endswith(b"THE END")
    await session.stop()


async def test_a_browser_message_over_the_limit_closes_its_session(server: WebServer) -> None:
    session = await open_session(server.url, bearer())
    consoles = {p.pid for p in server.children()}
    await session.ws.send_str("x" * (MAX_MESSAGE_BYTES + 1))
    await session.closed_by_server(timeout=30)
    assert session.ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
    await session.close()
    await asyncio.to_thread(
        wait_until,
        lambda: not consoles & {p.pid for p in server.children()},
        timeout=30,
        what="its console to exit",
    )


def test_a_terminal_size_from_the_browser_is_clamped() -> None:
    assert _bounded("100000", 80, 1, MAX_COLUMNS) == MAX_COLUMNS
    assert _bounded(-5, 24, 1, MAX_ROWS) == 1
    assert _bounded("wide", 80, 1, MAX_COLUMNS) == 80
    assert _bounded(None, 24, 1, MAX_ROWS) == 24


async def test_a_session_ends_at_its_time_limit(
    bridge: Bridge, caplog: pytest.LogCaptureFixture
) -> None:
    settings = WebSettings(
        parse_fleet(bridge.text, bridge.fleet),
        bridge.fleet,
        WEB_TOKEN.encode(),
        max_session_s=3.0,
        environ=agent_env(T_WEB_NODE=VIEWER),
    )
    async with TestServer(WebView(settings).app()) as web_server:
        with caplog.at_level(logging.INFO, logger="engineroom.web"):
            session = await open_session(str(web_server.make_url("")), bearer())
            await session.closed_by_server(timeout=30)
            await session.close()
    assert "a web session reached its 3 s limit" in caplog.text  # not a failure


async def test_a_browser_that_stops_answering_pings_loses_its_session(
    bridge: Bridge, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(web_module, "HEARTBEAT_S", 1.0)
    settings = WebSettings(
        parse_fleet(bridge.text, bridge.fleet),
        bridge.fleet,
        WEB_TOKEN.encode(),
        environ=agent_env(T_WEB_NODE=VIEWER),
    )
    view = WebView(settings)
    async with (
        TestServer(view.app()) as web_server,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
    ):
        url = str(web_server.make_url("/ws"))
        # autoping off: the pings reach the test, which never answers them.
        ws = await http.ws_connect(url, headers=bearer(), autoping=False)
        pings = 0
        async with asyncio.timeout(60):
            while (message := await ws.receive()).type not in (
                aiohttp.WSMsgType.CLOSE,
                aiohttp.WSMsgType.CLOSED,
            ):
                pings += message.type == aiohttp.WSMsgType.PING
        assert pings >= 1
        await ws.close()
        await asyncio.to_thread(
            wait_until, lambda: not view.sessions, timeout=30, what="the session to end"
        )
