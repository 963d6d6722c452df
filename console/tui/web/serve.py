"""`engineroom serve --web`: the console as a read-only web page for the incident bridge.

textual-serve supplies the page (xterm.js) and the protocol to a console process; this
module puts a guard in front of it and bounds it:

- every route (the page, the static files, the websocket) wants the bearer token from the
  environment (`Authorization: Bearer`, or `/?token=` once, which becomes a cookie holding
  an HMAC of the token, never the token), compared in constant time, never logged;
- each browser session is one console process (console/tui/web/session.py, read-only, every
  action key answers "read-only view"), started from an argv list with no shell, at most
  `max_sessions` at once, each for at most `max_session_s`;
- that process gets no token that can act. Its environment is an allow-list, not the
  server's less a few names: the few variables any program needs (SESSION_ENV), then each
  token it reads with, under the name the fleet gives it: the agents' viewer token for
  every node's token, the gateway's viewer token for its admin token, Prometheus'
  credentials. Nothing else the server holds goes in: not the web token, the operator or
  admin tokens, the gateway's client keys, a data plane's token, nor any other secret;
- what a browser or a console process sends is bounded: websocket messages, terminal
  size, protocol packets, the stderr kept, the time to start and to stop.

docs/web.md says how to run it and what it guarantees.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp_jinja2
import jinja2
import textual_serve
from aiohttp import WSMsgType, web
from textual_serve.app_service import AppService
from textual_serve.download_manager import DownloadManager

from console.core.config.load import Fleet

log = logging.getLogger("engineroom.web")

DEFAULT_LISTEN = "127.0.0.1:9430"
DEFAULT_TOKEN_ENV = "ENGINEROOM_WEB_TOKEN"
MIN_TOKEN_CHARS = 16
COOKIE = "engineroom_web"
COOKIE_MAX_AGE_S = 12 * 3600
DEFAULT_MAX_SESSIONS = 8
DEFAULT_MAX_SESSION_S = 12 * 3600.0
MAX_MESSAGE_BYTES = 64 * 1024  # one browser message: a key press, a resize, a ping
MAX_REQUEST_BYTES = 64 * 1024  # no route takes a body
MAX_PACKET_BYTES = 16 * 1024 * 1024  # one frame from the console process
MAX_COLUMNS, MAX_ROWS = 400, 200  # a terminal bigger than this costs the console memory
STDERR_TAIL_BYTES = 16 * 1024
START_DEADLINE_S = 60.0  # for the console process's first line (a loaded host is slow)
STOP_GRACE_S = 5.0
HEARTBEAT_S = 15.0  # a browser that stops answering pings loses its session
KEEPALIVE_S = 15.0  # an idle HTTP connection is closed after this

_SERVE = Path(textual_serve.__file__).parent
STATIC = _SERVE / "static"
TEMPLATES = _SERVE / "templates"


class WebConfigError(Exception):
    """The web view cannot start: the message says what to set."""


def read_token(env_name: str, environ: Mapping[str, str] | None = None) -> bytes:
    """The bearer token from `env_name`; WebConfigError (never the value) if unusable."""
    value = (os.environ if environ is None else environ).get(env_name, "").strip()
    if not value:
        raise WebConfigError(
            f"environment variable {env_name} is not set: the web view needs a bearer token "
            f"(at least {MIN_TOKEN_CHARS} characters, e.g. from `openssl rand -hex 24`)"
        )
    if len(value) < MIN_TOKEN_CHARS:
        raise WebConfigError(
            f"environment variable {env_name} holds {len(value)} characters: the web view's "
            f"token needs at least {MIN_TOKEN_CHARS}"
        )
    return value.encode()


def viewer_token(value: str) -> str | None:
    """The first token of an agent viewer variable (`TOKEN` or `NAME:TOKEN`, comma-separated)."""
    first = value.split(",")[0].strip()
    token = first.rpartition(":")[2].strip()
    return token or None


# What a web session's console needs from the server's environment besides the tokens it
# reads with: where programs, its home and temporary files are, who it runs as, its
# language and time zone, and where Python finds the console.
SESSION_ENV = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "PYTHONPATH"}
)
SESSION_ENV_PREFIXES = ("LC_",)  # the locale's categories


def session_environment(
    fleet: Fleet, environ: Mapping[str, str], token_env: str
) -> tuple[dict[str, str], str]:
    """The environment a web session's console runs with, and what it reads with.

    An allow-list (defence in depth under the console's read-only mode): SESSION_ENV, then
    the tokens it reads with, each under the name the fleet reads it from."""
    # Names whose value, as the server holds it, can act: never passed as they are.
    acting = {token_env, fleet.agent.operator_token_env}
    if fleet.gateway is not None:
        acting.add(fleet.gateway.token_env)
    env = {
        name: value
        for name, value in environ.items()
        if (name in SESSION_ENV or name.startswith(SESSION_ENV_PREFIXES)) and name not in acting
    }

    def keep(name: str | None) -> None:
        """Pass the server's own value of a variable the console reads, unless it acts."""
        if name and name not in acting and environ.get(name, "").strip():
            env[name] = environ[name]

    if (prometheus := fleet.prometheus) is not None:  # it reads the fleet's series
        for name in (prometheus.token_env, prometheus.username_env, prometheus.password_env):
            keep(name)
    ssh = ""
    if any(node.transport == "ssh" for node in fleet.nodes):
        keep("SSH_AUTH_SOCK")  # agentless nodes are read over SSH (docs/web.md)
        ssh = "; agentless nodes with the server's SSH keys"
    gateway = ""
    if fleet.gateway is not None:
        gateway_viewer = environ.get(fleet.gateway.viewer_token_env, "").strip()
        if gateway_viewer:  # the gateway answers its reads and refuses its actions (403)
            env[fleet.gateway.token_env] = gateway_viewer
            gateway = f"; the gateway's viewer token ({fleet.gateway.viewer_token_env})"
        else:
            gateway = (
                f"; no gateway token ({fleet.gateway.viewer_token_env} is not set: the "
                "gateway's columns read -)"
            )
    viewer_env = fleet.agent.viewer_token_env
    viewer = viewer_token(environ.get(viewer_env, ""))
    if viewer is None:
        for node in fleet.nodes:
            keep(node.token_env)
        return env, (
            f"each node's own token ({viewer_env} is not set: only the console's read-only "
            f"mode stops actions; set it and the agents refuse them too){gateway}{ssh}"
        )
    for node in fleet.nodes:
        if node.token_env:
            env[node.token_env] = viewer
    return env, (
        f"the agents' viewer token ({viewer_env}): the agents refuse every action{gateway}{ssh}"
    )


@dataclass
class WebSettings:
    fleet: Fleet
    fleet_path: Path
    token: bytes
    token_env: str = DEFAULT_TOKEN_ENV
    host: str = "127.0.0.1"
    port: int = 9430
    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_session_s: float = DEFAULT_MAX_SESSION_S
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))

    def session_argv(self) -> list[str]:
        return [sys.executable, "-m", "console.tui.web.session", "--fleet", str(self.fleet_path)]


class ConsoleSession(AppService):
    """One browser session's console process: started from argv (no shell), given a
    deadline to start, its frames and stderr bounded, killed if it will not stop."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        *,
        start_deadline_s: float = START_DEADLINE_S,
        stop_grace_s: float = STOP_GRACE_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(" ".join(argv), download_manager=DownloadManager(), **kwargs)
        self.argv, self.base_env = argv, env
        self.start_deadline_s, self.stop_grace_s = start_deadline_s, stop_grace_s
        self.stderr_tail = bytearray()
        self.started = asyncio.Event()  # the console sent its first line

    def _build_environment(self, width: int = 80, height: int = 24) -> dict[str, str]:
        env = dict(self.base_env)
        env.update(
            TEXTUAL_DRIVER="textual.drivers.web_driver:WebDriver",
            TEXTUAL_FPS="30",
            TEXTUAL_COLOR_SYSTEM="truecolor",
            TERM_PROGRAM="textual",
            COLUMNS=str(width),
            ROWS=str(height),
        )
        return env

    async def _open_app_process(self, width: int = 80, height: int = 24) -> Any:
        self._process = process = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._build_environment(width, height),
            start_new_session=True,  # its own group: stop() ends whatever it started
        )
        self._stdin = process.stdin
        return process

    async def _keep_stderr(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(4096):
            self.stderr_tail += chunk
            del self.stderr_tail[:-STDERR_TAIL_BYTES]

    async def run(self) -> None:
        process = self._process
        assert process is not None and process.stdout is not None and process.stderr is not None
        stdout = process.stdout
        stderr_task = asyncio.create_task(self._keep_stderr(process.stderr))
        try:
            async with asyncio.timeout(self.start_deadline_s):
                for _ in range(10):  # the driver's prelude: a few lines, then the marker
                    if await stdout.readline() in (b"__GANGLION__\n", b""):
                        break
            self.started.set()
            while True:
                kind = await stdout.readexactly(1)
                size = int.from_bytes(await stdout.readexactly(4), "big")
                if size > MAX_PACKET_BYTES:
                    log.error("a console process sent a %d-byte frame: session closed", size)
                    break
                payload = await stdout.readexactly(size)
                if kind == b"D":
                    await self.on_data(payload)
                elif kind == b"M":
                    await self.on_meta(payload)
        except TimeoutError:
            log.error("a console process did not start in %.0f s", self.start_deadline_s)
        except (asyncio.IncompleteReadError, ConnectionResetError, ValueError):
            pass  # the process ended, or wrote past readline's limit
        finally:
            await self._end_process()
            stderr_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stderr_task
            if process.returncode not in (0, None, -signal.SIGTERM, -signal.SIGKILL):
                tail = bytes(self.stderr_tail[-2000:]).decode("utf-8", "replace")
                log.error("a console process exited %s: %s", process.returncode, tail)
            with contextlib.suppress(Exception):
                await self.remote_close()  # the page says "Session ended"

    async def on_meta(self, data: bytes) -> None:
        # Only "exit" matters here: no URLs are opened and no files are delivered.
        with contextlib.suppress(ValueError):
            if json.loads(data).get("type") == "exit":
                await self.remote_close()

    async def _end_process(self) -> None:
        process = self._process
        if process is None or process.returncode is not None:
            return
        try:
            async with asyncio.timeout(self.stop_grace_s):
                await process.wait()
                return
        except TimeoutError:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()

    async def stop(self) -> None:
        """Ask the console to quit; past the grace, kill its process group."""
        task, self._task = self._task, None
        if task is None:
            return
        await self.send_meta({"type": "quit"})
        try:
            async with asyncio.timeout(self.stop_grace_s):
                await asyncio.shield(task)
                return
        except TimeoutError:
            pass
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        await task


class WebView:
    """The guarded aiohttp app in front of the console sessions."""

    def __init__(self, settings: WebSettings) -> None:
        self.settings = settings
        self.env, self.reads_with = session_environment(
            settings.fleet, settings.environ, settings.token_env
        )
        # The browser's cookie is an HMAC of the token: a copied cookie is not the token.
        self.cookie = hmac.new(settings.token, b"engineroom web view", hashlib.sha256).hexdigest()
        self.sessions: set[ConsoleSession] = set()
        self.reserved = 0  # sessions counted from the handshake on, so the cap has no race

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.guard], client_max_size=MAX_REQUEST_BYTES)
        aiohttp_jinja2.setup(app, loader=jinja2.FileSystemLoader(TEMPLATES))
        app.add_routes(
            [
                web.get("/", self.index),
                web.get("/ws", self.websocket),
                web.static("/static", STATIC),
            ]
        )
        app.on_shutdown.append(self.close_sessions)
        return app

    # -- the guard ---------------------------------------------------------------------

    def _authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        if header.lower().startswith("bearer "):
            return hmac.compare_digest(header[7:].strip().encode(), self.settings.token)
        cookie = request.cookies.get(COOKIE)
        if cookie is not None:
            return hmac.compare_digest(cookie.encode(), self.cookie.encode())
        return False

    @web.middleware
    async def guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        token = request.query.get("token")
        if token is not None and request.path == "/":
            if not hmac.compare_digest(token.encode(), self.settings.token):
                return _refused()
            # Once: the token leaves the address bar (and the history) for a cookie.
            found = web.Response(status=303, headers={"Location": "/"})
            found.set_cookie(
                COOKIE,
                self.cookie,
                max_age=COOKIE_MAX_AGE_S,
                httponly=True,
                samesite="Strict",
                secure=_secure(request),
                path="/",
            )
            _no_store(found)
            return found
        if not self._authorized(request):
            return _refused()
        response: web.StreamResponse = await handler(request)
        if not response.prepared:
            _no_store(response)
        return response

    # -- the routes --------------------------------------------------------------------

    async def index(self, request: web.Request) -> web.StreamResponse:
        scheme = "wss" if _secure(request) else "ws"
        font = _bounded(request.query.get("fontsize"), 16, 8, 32)
        context = {
            "font_size": font,
            "app_websocket_url": f"{scheme}://{request.host}/ws",
            "config": {"static": {"url": "/static/"}},
            "application": {"name": f"engineroom {self.settings.fleet.fleet.name} (read-only)"},
        }
        return aiohttp_jinja2.render_template("app_index.html", request, context)

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc != request.host:
            return web.Response(status=403, text="403: the websocket is for this page only\n")
        if self.reserved >= self.settings.max_sessions:
            return web.Response(
                status=503,
                text=f"503: the web view has {self.settings.max_sessions} sessions open, its "
                "limit: close a tab, or try again later\n",
            )
        self.reserved += 1
        session: ConsoleSession | None = None
        ws = web.WebSocketResponse(heartbeat=HEARTBEAT_S, max_msg_size=MAX_MESSAGE_BYTES)
        try:
            await ws.prepare(request)
            session = ConsoleSession(
                self.settings.session_argv(),
                self.env,
                write_bytes=ws.send_bytes,
                write_str=ws.send_str,
                close=ws.close,
            )
            self.sessions.add(session)
            width = _bounded(request.query.get("width"), 80, 1, MAX_COLUMNS)
            height = _bounded(request.query.get("height"), 24, 1, MAX_ROWS)
            await session.start(width, height)
            try:
                async with asyncio.timeout(self.settings.max_session_s):
                    await self._browser(ws, session)
            except TimeoutError:
                log.info("a web session reached its %.0f s limit", self.settings.max_session_s)
        finally:
            if session is not None:
                await session.stop()
                self.sessions.discard(session)
            self.reserved -= 1
            await ws.close()
        return ws

    async def _browser(self, ws: web.WebSocketResponse, session: ConsoleSession) -> None:
        """What the page sends: key presses, its size, focus, pings. Anything else is
        ignored; a message over MAX_MESSAGE_BYTES closes the socket (aiohttp)."""
        async for message in ws:
            if message.type != WSMsgType.TEXT:
                continue
            try:
                kind, *rest = json.loads(message.data)
            except (ValueError, TypeError):
                continue
            data = rest[0] if rest else None
            if kind == "stdin" and isinstance(data, str):
                await session.send_bytes(data.encode("utf-8"))
            elif kind == "resize" and isinstance(data, dict):
                await session.set_terminal_size(
                    _bounded(data.get("width"), 80, 1, MAX_COLUMNS),
                    _bounded(data.get("height"), 24, 1, MAX_ROWS),
                )
            elif kind == "ping" and isinstance(data, str):
                await ws.send_json(["pong", data[:32]])
            elif kind == "blur":
                await session.blur()
            elif kind == "focus":
                await session.focus()

    async def close_sessions(self, _app: web.Application) -> None:
        await asyncio.gather(*(s.stop() for s in list(self.sessions)), return_exceptions=True)


def _refused() -> web.Response:
    response = web.Response(
        status=401,
        text="401: this read-only view needs its token: send Authorization: Bearer TOKEN, "
        "or open /?token=TOKEN once\n",
        headers={"WWW-Authenticate": 'Bearer realm="engineroom web view"'},
    )
    _no_store(response)
    return response


def _secure(request: web.Request) -> bool:
    # Behind a TLS proxy the page must ask for wss:// (a browser refuses ws:// from https).
    return request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"


def _no_store(response: web.StreamResponse) -> None:
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["X-Content-Type-Options"] = "nosniff"


def _bounded(value: object, default: int, low: int, high: int) -> int:
    try:
        number = int(str(value))
    except ValueError:
        return default
    return min(max(number, low), high)


def run_web(settings: WebSettings) -> int:
    """Serve until SIGINT or SIGTERM; every session's console is stopped on the way out."""
    view = WebView(settings)
    print(
        f"engineroom web: the read-only console of {settings.fleet.fleet.name!r} on "
        f"http://{settings.host}:{settings.port}/ (token: {settings.token_env}; at most "
        f"{settings.max_sessions} sessions; it reads with {view.reads_with})",
        file=sys.stderr,
        flush=True,
    )
    try:
        web.run_app(
            view.app(),
            host=settings.host,
            port=settings.port,
            access_log=None,  # a first visit's address holds ?token=
            keepalive_timeout=KEEPALIVE_S,
            print=None,
            shutdown_timeout=STOP_GRACE_S + 1,
        )
    except OSError as exc:
        print(
            f"engineroom serve: cannot listen on {settings.host}:{settings.port}: "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )
        return 1
    return 0
