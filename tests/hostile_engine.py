"""Engines that misbehave, for the agent's bad-input tests: one listener per mode.

    python tests/hostile_engine.py hang:PORT garbage:PORT error500:PORT enormous:PORT

These are not stand-ins for a real engine's normal behaviour (the real engines are
tested for that); they are the hung, lying and broken servers an agent meets in an
incident. Each speaks just enough HTTP/1.1 for the probes.
"""

from __future__ import annotations

import asyncio
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


def handler(mode: str):  # type: ignore[no-untyped-def]
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                path = request.split(b" ", 2)[1].decode()
                if mode == "hang":
                    await asyncio.sleep(3600)
                elif mode == "error500":
                    await _reply(writer, "500 Internal Server Error", b'{"error":"boom"}')
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
