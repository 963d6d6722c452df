"""The snapshot stream read off the socket (console/collect/sources/linestream.py): HTTP/1.1
framing however the bytes are cut, the newest line only, and every cap."""

from __future__ import annotations

import asyncio

import pytest

from console.collect.sources.linestream import MAX_HEAD, StreamError, StreamStatus, open_stream

HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)


async def serve(answer: bytes, *, cut: int | None = None, hold: bool = True):
    """A socket server that answers any request with `answer`, `cut` bytes at a time."""
    requests: list[bytes] = []
    release = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await reader.readuntil(b"\r\n\r\n"))
        step = cut or len(answer) or 1
        for i in range(0, len(answer), step):
            writer.write(answer[i : i + step])
            await writer.drain()
            await asyncio.sleep(0)
        if hold:
            await release.wait()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, port, requests, release


async def read_all(answer: bytes, cut: int | None = None, max_line: int = 1 << 20):
    server, port, requests, release = await serve(answer, cut=cut, hold=False)
    lines: list[bytes] = []
    try:
        stream = await open_stream(
            f"http://127.0.0.1:{port}/v1/snapshot/stream",
            {"Authorization": "Bearer t0k"},
            lines.append,
            max_line=max_line,
            timeout_s=5,
        )
        await asyncio.wait_for(stream.ended, 5)
    except StreamError as exc:
        why = str(exc)
    else:
        pytest.fail("the stream ended without an error")
    finally:
        release.set()
        server.close()
    return lines, why, requests


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 64, None])
async def test_lines_come_out_whole_however_the_bytes_are_cut(cut):
    body = chunked(b'{"a": 1}\n{"a"', b": 2}\n", b'{"a": 3}\n')
    lines, why, requests = await read_all(HEAD + body + b"0\r\n\r\n", cut=cut)
    # With the bytes cut finely each line arrives on its own; together, only the newest
    # of a batch is handed on (a console that fell behind skips stale snapshots).
    assert lines[-1] == b'{"a": 3}'
    assert set(lines) <= {b'{"a": 1}', b'{"a": 2}', b'{"a": 3}'}
    if cut == 1:
        assert lines == [b'{"a": 1}', b'{"a": 2}', b'{"a": 3}']
    assert why == "the agent closed its snapshot stream"
    assert requests[0].startswith(b"GET /v1/snapshot/stream HTTP/1.1\r\n")
    assert b"Authorization: Bearer t0k\r\n" in requests[0]


async def test_a_body_without_chunks_is_read_too():
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n\r\n"
    lines, _, _ = await read_all(head + b'{"a": 1}\n{"a": 2}\n', cut=5)
    assert lines[-1] == b'{"a": 2}'


async def test_a_line_over_the_cap_fails_the_stream_and_is_not_kept():
    lines, why, _ = await read_all(HEAD + chunked(b"x" * 5000), cut=1000, max_line=4096)
    assert lines == [] and why == "snapshot larger than 4 KiB"


async def test_a_head_over_the_cap_fails():
    head = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"p" * (MAX_HEAD + 10)
    _, why, _ = await read_all(head, cut=4096)
    assert why == "an HTTP head over 64 KiB"


@pytest.mark.parametrize(
    "body",
    [b"zz\r\n{}\n\r\n", b"2\r\n{}XX", b"1" * 100],
    ids=["size not hex", "no CRLF after data", "size line never ends"],
)
async def test_bad_chunked_framing_fails_the_stream(body):
    _, why, _ = await read_all(HEAD + body)
    assert why == "bad chunked framing from the agent"


async def test_an_answer_other_than_200_is_its_status():
    server, port, _, release = await serve(
        b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n"
    )
    try:
        with pytest.raises(StreamStatus) as refused:
            await open_stream(
                f"http://127.0.0.1:{port}/s", {}, lambda line: None, max_line=1024, timeout_s=5
            )
        assert refused.value.status == 401
    finally:
        release.set()
        server.close()


async def test_an_agent_that_never_answers_the_request_times_out():
    server, port, _, release = await serve(b"")  # reads the request, then holds
    try:
        with pytest.raises(TimeoutError):
            await open_stream(
                f"http://127.0.0.1:{port}/s", {}, lambda line: None, max_line=1024, timeout_s=0.5
            )
    finally:
        release.set()
        server.close()


async def test_a_callback_that_fails_ends_the_stream_with_its_error():
    server, port, _, release = await serve(HEAD + chunked(b"not json\n"))

    def refuse(line: bytes) -> None:
        raise ValueError(f"refused {line!r}")

    try:
        stream = await open_stream(
            f"http://127.0.0.1:{port}/s", {}, refuse, max_line=1024, timeout_s=5
        )
        with pytest.raises(ValueError, match="refused b'not json'"):
            await asyncio.wait_for(stream.ended, 5)
    finally:
        release.set()
        server.close()
