"""The console draws no terminal sequence from outside text (issue 27, defect 6).

The console runs in a real pseudo-terminal over the fleet of tests/test_escape_injection.py
(a real agent probing a vLLM server with hostile answers, and a compromised node's agent)
and is walked through every screen that shows their text: Fleet, a node, an engine, Jobs,
a job with its log, its cancel confirmation and the agent's refusal as a notification, the
Start vLLM form's refused plan, Drills and Models. Every byte it writes is read: none of
the payloads' sequences may be among them, and each shows as its escape. Before the fix,
the version string alone wrote a window title, a hyperlink and a clear screen. The web
view (`serve --web`) sends its browsers the same console's bytes.
"""

from __future__ import annotations

import asyncio
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import aiohttp
import httpx
import pytest

from console.core.config.load import parse_fleet
from console.tui.app import EngineroomApp
from tests.conftest import ROOT
from tests.engines.servers import free_port, stop
from tests.hostile_answers import EVERY, RAW, raw_in
from tests.support.serving import wait_serving
from tests.test_escape_injection import Hostile, hostile  # noqa: F401 - the module fixture
from tests.tui_support import until

# The escapes the screens show. (Rich itself drops BEL, BS, VT, FF and CR from any text it
# is given, so `ok\rFAIL` reaches the screen as okFAIL: never the terminal, never hidden.)
SHOWN = (
    rb"\x1b]0;PWNED-TITLE",
    rb"\x1b]8;;http://evil.example/",
    rb"\x1b[2JCLEARED",
    rb"\x1b[31mREDDENED",
    rb"\x9b2JEIGHTBIT",
    rb"\x9d0;EIGHTOSC\x9c",
    rb"rtl\u202eGNP",
    rb"zero\u200bWIDTH",
)


class Console:
    """`engineroom` on a pty of its own, 200x50; every byte it writes is kept."""

    def __init__(self, fleet: Hostile) -> None:
        self.out = b""
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the console on the pty, as over SSH
            env = {k: v for k, v in fleet.env.items() if k != "NO_COLOR"}
            env.update(TERM="xterm-256color", COLUMNS="200", LINES="50")
            os.chdir(ROOT)
            argv = [sys.executable, "-m", "console.cli", "--fleet", str(fleet.fleet)]
            os.execve(sys.executable, argv, env)

    def read(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], 0.05)
            if ready:
                try:
                    self.out += os.read(self.fd, 1 << 16)
                except OSError:
                    return

    def until(self, what: Callable[[bytes], object], timeout: float, why: str) -> int:
        """Read until `what(bytes since now)` holds; where those bytes start."""
        start = len(self.out)
        deadline = time.monotonic() + timeout
        while not what(self.out[start:]):
            if time.monotonic() > deadline:
                tail = self.out[-3000:].decode(errors="replace")
                raise AssertionError(f"{why}: not within {timeout} s; the last output:\n{tail}")
            self.read(0.1)
        return start

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def command(self, text: str, shows: bytes, timeout: float = 30) -> None:
        """`:text` Enter, then read until the screen shows `shows`."""
        self.type(b":")
        self.until(lambda b: b"| model NAME" in b, 30, "the command line's hint")
        self.type(text.encode() + b"\r")
        self.until(lambda b: shows in b, timeout, f":{text} showing {shows!r}")

    def close(self) -> None:
        try:
            os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and os.waitpid(self.pid, os.WNOHANG)[0] == 0:
                time.sleep(0.05)
            else:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(self.fd)


def test_every_screen_in_a_real_terminal_writes_outside_text_as_escapes(
    hostile,  # noqa: F811 - the fixture imported above
):
    console = Console(hostile)
    try:
        # Fleet: both nodes' engines (the real agent's engine version; the compromised one's).
        console.until(lambda b: b"bad" in b and b"vllm 0.11" in b, 60, "Fleet with both nodes")
        console.command("node bad", b"GPUs")  # the host, versions, disks, GPUs, engines
        console.command("engine bad/vllm-8000", b"probe")  # the engine's answers, its models
        console.command("jobs", b"j-drill")
        console.command("job bad/j-run", b"engine log")  # its steps and its log
        console.until(lambda b: b"RUNNING" in b, 30, "the job drawn")
        console.type(b"c")  # cancel it: the confirmation names its target
        console.until(lambda b: b"cancel the job" in b, 30, "the confirmation")
        console.type(b"y")  # the agent refuses, with its words: a notification
        console.until(lambda b: b"bad: refused" in b, 30, "the refusal")
        console.command("drills", b"j-drill")
        console.command("start", b"refused")  # the form's plan, refused by the agent
        console.type(b"\x1b")  # Esc closes the form: Drills is drawn again
        console.until(lambda b: b"j-drill" in b, 30, "the form closed")
        console.command("models", b"m-bad")
        console.command("node real", b"vllm-")  # the real agent's engine
    finally:
        console.close()
    out = console.out
    assert raw_in(out) == [], f"the payloads' own bytes reached the terminal: {raw_in(out)}"
    missing = [m for m in SHOWN if m not in out]
    assert missing == [], f"not shown as escapes: {missing}"


async def test_a_notification_is_plain_text_and_safe():
    """A refusal's words in a notification: never markup (an `[@click=...]` action in an
    agent's error would run when clicked), never a sequence."""
    app = EngineroomApp(parse_fleet('[fleet]\nname = "n"\n'))
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        app.notify("agent says [@click=app.quit]click[/] " + EVERY, title="t" + EVERY)

        def toast() -> str:
            from textual.widgets._toast import Toast

            return "".join(str(t.render()) for t in app.screen.query(Toast))

        shown = await until(pilot, toast, what="the toast")
    assert "[@click=app.quit]click[/]" in shown  # the text, as written
    assert r"\x1b]0;PWNED-TITLE\x07" in shown
    assert not any(ch in shown for ch in "\x1b\x9b\x9d\u202e\u200b")


# -- the web view: the same console's bytes, sent to every browser --------------------------

WEB_TOKEN = "web-token-0123456789abcdef"


async def test_the_web_view_sends_browsers_no_hostile_sequence(
    hostile,  # noqa: F811 - the fixture imported above
):
    port = free_port()
    log = hostile.fleet.parent / "web.log"
    env = {**hostile.env, "ENGINEROOM_WEB_TOKEN": WEB_TOKEN}
    argv = [sys.executable, "-m", "console.cli", "serve", "--web", "--fleet", str(hostile.fleet)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*argv, "--listen", f"127.0.0.1:{port}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_serving(process, log, lambda: httpx.get(url + "/", timeout=2).status_code == 401,
                     "serve --web")  # fmt: skip
        frames = await _frames(url, until=b"vllm 0.11", timeout=60)
    finally:
        stop(process, grace=10)
    assert b"vllm 0.11" in frames, "the fleet's engines were not drawn"
    assert raw_in(frames) == [], f"the payloads' own bytes reached a browser: {raw_in(frames)}"
    assert SHOWN[0] in frames


async def _frames(url: str, until: bytes, timeout: float) -> bytes:
    """The terminal bytes one browser session gets, until `until` is among them."""
    got = b""
    headers = {"Authorization": f"Bearer {WEB_TOKEN}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout + 30)) as http:
        ws = await http.ws_connect(
            url.replace("http", "ws") + "/ws?width=200&height=50", headers=headers
        )
        try:
            async with asyncio.timeout(timeout):
                while until not in got:
                    message = await ws.receive()
                    if message.type == aiohttp.WSMsgType.BINARY:
                        got += message.data
                    elif message.type != aiohttp.WSMsgType.TEXT:
                        break
        except TimeoutError:
            pass
        finally:
            await ws.close()
    return got


@pytest.mark.parametrize("raw", RAW)
def test_the_payloads_bytes_are_what_the_tests_look_for(raw):
    """Each sequence looked for is in the payloads as sent, so its absence means something."""
    assert raw in EVERY.encode()
