"""Engines that misbehave, for the agent's and the gateway's bad-input tests: one listener
per mode.

    python tests/hostile_engine.py hang:PORT garbage:PORT error500:PORT enormous:PORT
    python tests/hostile_engine.py flood:PORT endless:PORT endless-head:PORT one-line:PORT
    python tests/hostile_engine.py endless-500:PORT slow:PORT enormous-health:PORT
    python tests/hostile_engine.py trickle-head:PORT trickle-body:PORT completion-500:PORT

`enormous-health` answers `/health` with `enormous`'s endless body. The others of the
last two lines misbehave only on a completion (`POST /v1/...`, or Triton's
`POST /v2/models/M/generate...`) and answer health checks (`/health`, `.../ready`):
`flood` streams SSE events without end as fast as it may send, `endless` sends a
non-streaming body that never ends (`endless-500`: an error's), `endless-head` a header
line that never ends, `one-line` an SSE stream whose one line never ends; `slow` answers
a completion correctly, after a second; `trickle-head` and `trickle-body` send a byte of
their answer's head, or of its body, every 0.1 s; `completion-500` answers every
completion 500 and every health check 200 (an engine that fails its requests, healthy).

These are not stand-ins for a real engine's normal behaviour (the real engines are
tested for that); they are the hung, lying and broken servers an agent meets in an
incident. Each speaks just enough HTTP/1.1 for the probes.
"""

from __future__ import annotations

import asyncio
import re
import sys

MODELS = b'{"object":"list","data":[{"id":"m","object":"model"}]}'


async def _reply(
    writer: asyncio.StreamWriter, status: str, body: bytes, ctype: str = "application/json"
) -> None:
    head = f"HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n\r\n"
    writer.write(head.encode() + body)
    await writer.drain()


async def _enormous(writer: asyncio.StreamWriter) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    line = b'vllm:num_requests_running{model_name="m"} 1\n' * 20000  # ~900 KB per chunk
    chunk = f"{len(line):x}\r\n".encode() + line + b"\r\n"
    for _ in range(2000):  # up to ~1.8 GB: far over any sane cap
        writer.write(chunk)
        await writer.drain()


CHUNK = b'data: {"choices":[{"index":0,"text":"' + b"x" * 1000 + b'"}]}\n\n'
ENDLESS_LIMIT = 4 << 30  # a bound on every loop: 4 GiB, far over any sane gateway cap


async def _endless(writer: asyncio.StreamWriter, mode: str) -> None:
    """A completion that never ends (up to ENDLESS_LIMIT bytes), sent as fast as the
    gateway reads it: the flood a gateway must not buffer."""
    if mode == "endless-head":
        writer.write(b"HTTP/1.1 200 OK\r\nx-endless: ")
        piece = b"h" * 65536
    else:
        status = b"500 Internal Server Error" if mode == "endless-500" else b"200 OK"
        ctype = b"text/event-stream" if mode in ("flood", "one-line") else b"application/json"
        writer.write(
            b"HTTP/1.1 %s\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\n\r\n"
            % (status, ctype)
        )
        body = {"flood": CHUNK * 64, "one-line": b"y" * 65536}.get(mode, b'"x",' * 16384)
        if mode == "one-line":
            writer.write(b"7\r\ndata: [\r\n")
        piece = f"{len(body):x}\r\n".encode() + body + b"\r\n"
    sent = 0
    while sent < ENDLESS_LIMIT:
        writer.write(piece)
        sent += len(piece)
        await writer.drain()


async def _trickle(writer: asyncio.StreamWriter, mode: str) -> None:
    """An answer a byte every 0.1 s (for an hour at most): no gap is long, the whole never
    comes."""
    if mode == "trickle-body":
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
        writer.write(b"content-length: 100000\r\n\r\n")
    else:
        writer.write(b"HTTP/1.1 200 OK\r\nx-trickle: ")
    for _ in range(36000):
        writer.write(b"t")
        await writer.drain()
        await asyncio.sleep(0.1)


ENDLESS_MODES = ("flood", "endless", "endless-500", "endless-head", "one-line")
ANSWER = b'{"object":"text_completion","choices":[{"index":0,"text":"late"}]}'


def handler(mode: str):  # type: ignore[no-untyped-def]
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                path = request.split(b" ", 2)[1].decode()
                if mode in ENDLESS_MODES and request.startswith(b"POST "):
                    await _endless(writer, mode)
                    return
                if mode.startswith("trickle-") and request.startswith(b"POST "):
                    await _trickle(writer, mode)
                    return
                if mode == "completion-500" and request.startswith(b"POST "):
                    length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", request)
                    await reader.readexactly(int(length.group(1)) if length else 0)
                    await _reply(writer, "500 Internal Server Error", b'{"error":"boom"}')
                    continue
                if mode == "slow" and request.startswith(b"POST "):
                    await asyncio.sleep(1)
                    await _reply(writer, "200 OK", ANSWER)
                    return
                if mode in (*ENDLESS_MODES, "slow", "completion-500") and path.endswith("/ready"):
                    await _reply(writer, "200 OK", b"")
                elif mode == "hang":
                    await asyncio.sleep(3600)
                elif mode == "error500":
                    await _reply(writer, "500 Internal Server Error", b'{"error":"boom"}')
                elif path == "/health" and mode == "enormous-health":
                    await _enormous(writer)
                    return
                elif path == "/health":
                    await _reply(writer, "200 OK", b"")
                elif path == "/version":
                    await _reply(writer, "200 OK", b'{"version":"0.32.0"}')
                elif path == "/v1/models":
                    await _reply(writer, "200 OK", MODELS)
                elif path == "/metrics" and mode == "garbage":
                    await _reply(
                        writer, "200 OK", b"\x00\xff<html>not metrics</html>\n{{{{\n", "text/plain"
                    )
                elif path == "/metrics" and mode == "enormous":
                    await _enormous(writer)
                    return
                else:
                    await _reply(writer, "404 Not Found", b"{}")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return handle


async def main(specs: list[str]) -> None:
    servers = []
    for spec in specs:
        mode, port = spec.split(":")
        servers.append(await asyncio.start_server(handler(mode), "127.0.0.1", int(port)))
    print("listening", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
