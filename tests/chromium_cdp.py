"""A small, bounded client for headless Chromium over the DevTools protocol (CDP).

Enough to drive a page as a person would: open an address, run JavaScript, press keys,
take a screenshot. Every call has a deadline, the events kept are capped, the browser's
own output goes to a file, and the browser is stopped for sure (`async with`).

The text of a textual-serve page lives in xterm.js, drawn on a canvas: `TERMINAL_HOOK`
catches the page's Terminal object as the page stores it, so `terminal_text()` reads
the screen through xterm's own buffer API instead of pixels.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import aiohttp

from tests.engines.servers import log_tail, stop

CALL_TIMEOUT_S = 15.0
START_TIMEOUT_S = 30.0
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # a full-page screenshot, base64
MAX_EVENTS = 500

# textual-serve's page keeps its xterm Terminal in `this.terminal` of a closure-private
# object; an accessor on Object.prototype sees that assignment and keeps a reference.
TERMINAL_HOOK = """
Object.defineProperty(Object.prototype, "terminal", {
  configurable: true,
  get() { return undefined; },
  set(value) {
    Object.defineProperty(this, "terminal", {
      value, writable: true, configurable: true, enumerable: true,
    });
    if (value && value.buffer && value.buffer.active) { window.__terminal = value; }
  },
});
"""

TERMINAL_TEXT = """(() => {
  const t = window.__terminal;
  if (!t) { return null; }
  const buffer = t.buffer.active, rows = [];
  for (let y = 0; y < t.rows; y++) {
    const line = buffer.getLine(buffer.viewportY + y);
    rows.push(line ? line.translateToString(true) : "");
  }
  return rows.join("\\n");
})()"""

# CDP key events for the keys the tests press (key, code, Windows virtual key code).
SPECIAL_KEYS = {
    "Enter": ("Enter", "Enter", 13, "\r"),
    "Escape": ("Escape", "Escape", 27, ""),
    "Tab": ("Tab", "Tab", 9, "\t"),
}


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class CdpError(Exception):
    pass


class Page:
    """One page target's CDP session."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[dict]] = {}
        self.events: deque[dict] = deque(maxlen=MAX_EVENTS)
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(message.data)
            future = self.waiting.pop(data.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(data)
            elif "method" in data:
                self.events.append(data)
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(CdpError("the browser closed the DevTools connection"))

    async def call(self, method: str, timeout: float = CALL_TIMEOUT_S, **params: Any) -> dict:
        """Send one CDP command; its result, or CdpError (its error, or no answer in time)."""
        call_id = next(self.ids)
        future: asyncio.Future[dict] = asyncio.get_running_loop().create_future()
        self.waiting[call_id] = future
        await self.ws.send_str(json.dumps({"id": call_id, "method": method, "params": params}))
        try:
            async with asyncio.timeout(timeout):
                answer = await future
        except TimeoutError:
            raise CdpError(f"{method}: no answer in {timeout} s") from None
        finally:
            self.waiting.pop(call_id, None)
        if "error" in answer:
            raise CdpError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    async def evaluate(self, expression: str) -> Any:
        result = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise CdpError(f"{expression[:60]!r}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        """Evaluate `expression` until it is truthy; its value. CdpError with the last one."""
        deadline = time.monotonic() + timeout
        value: Any = None
        while time.monotonic() < deadline:
            value = await self.evaluate(expression)
            if value:
                return value
            await asyncio.sleep(0.2)
        raise CdpError(f"waited {timeout} s for {what}; last value: {value!r}")

    async def terminal_text(self) -> str:
        return await self.evaluate(TERMINAL_TEXT) or ""

    async def wait_for_text(self, needles: list[str], timeout: float, what: str) -> str:
        """The terminal's text once every needle is on the screen."""
        checks = " && ".join(f"text.includes({json.dumps(n)})" for n in needles)
        expression = (
            f"(() => {{ const text = {TERMINAL_TEXT}; "
            f"return text && ({checks}) ? text : null; }})()"
        )
        try:
            return await self.wait_for(expression, timeout, what)
        except CdpError:
            screen = await self.terminal_text()
            raise CdpError(f"waited {timeout} s for {what}; the screen:\n{screen}") from None

    async def press(self, key: str) -> None:
        """A key press as the keyboard makes it: keyDown (with its text), keyUp."""
        if key in SPECIAL_KEYS:
            name, code, vk, text = SPECIAL_KEYS[key]
            modifiers = 0
        else:
            name, text = key, key
            code = f"Key{key.upper()}" if key.isalpha() else ""
            vk = ord(key.upper())
            modifiers = 8 if key.isupper() else 0  # shift
        down: dict[str, Any] = {
            "type": "keyDown",
            "key": name,
            "code": code,
            "windowsVirtualKeyCode": vk,
            "modifiers": modifiers,
        }
        if text:
            down["text"] = text
        await self.call("Input.dispatchKeyEvent", **down)
        await self.call(
            "Input.dispatchKeyEvent",
            type="keyUp",
            key=name,
            code=code,
            windowsVirtualKeyCode=vk,
            modifiers=modifiers,
        )

    async def screenshot(self, path: Path) -> None:
        result = await self.call("Page.captureScreenshot", timeout=30, format="png")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(result["data"]))


class Chromium:
    """Headless Chromium on a DevTools port of its choosing, stopped on exit."""

    def __init__(self, width: int = 1600, height: int = 1000) -> None:
        binary = chromium_binary()
        if binary is None:
            raise CdpError("no chromium on PATH")
        self.binary, self.size = binary, (width, height)
        self.profile = Path(tempfile.mkdtemp(prefix="cdp-"))
        self.log = self.profile / "chromium.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.http: aiohttp.ClientSession | None = None
        self.pages: list[Page] = []

    async def __aenter__(self) -> Chromium:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    self.binary,
                    "--headless=new",
                    "--no-sandbox",  # the tests may run as root in a container
                    "--disable-gpu",
                    "--no-first-run",
                    "--no-default-browser-check",
                    "--disable-extensions",
                    "--disable-background-networking",
                    "--remote-debugging-address=127.0.0.1",
                    "--remote-debugging-port=0",
                    f"--user-data-dir={self.profile}",
                    f"--window-size={self.size[0]},{self.size[1]}",
                    "about:blank",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S))
        try:
            self.port = await self._port()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _port(self) -> int:
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise CdpError(f"chromium exited {self.process.returncode}:\n{log_tail(self.log)}")
            with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
                return int(active.read_text().splitlines()[0])
            await asyncio.sleep(0.1)
        raise CdpError(f"chromium wrote no DevTools port in {START_TIMEOUT_S} s")

    async def page(self) -> Page:
        """The first page target (the about:blank the browser opened), attached."""
        assert self.http is not None
        async with self.http.get(f"http://127.0.0.1:{self.port}/json/list") as response:
            targets = await response.json()
        target = next(t for t in targets if t.get("type") == "page")
        ws = await self.http.ws_connect(
            target["webSocketDebuggerUrl"], max_msg_size=MAX_MESSAGE_BYTES
        )
        page = Page(ws)
        self.pages.append(page)
        await page.call("Page.enable")
        await page.call("Runtime.enable")
        return page

    async def __aexit__(self, *exc: object) -> None:
        for page in self.pages:
            await page.ws.close()
            page.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await page.reader
        if self.http is not None:
            await self.http.close()
        if self.process is not None:
            await asyncio.to_thread(stop, self.process, 5)
        shutil.rmtree(self.profile, ignore_errors=True)
