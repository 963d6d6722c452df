"""Numbers from outside text in the agent's parsers (issue 27, the siblings of defect 2):
an engine's metrics and statistics, a process's command line, the agent's stream
framing, and the gateway's snapshot as the console reads it. Each bad number costs its
own reading, never the engine, the agent or the stream.

The engines' own parsers are fed what a broken or hostile engine could send (a real
vLLM or Triton cannot be made to send it); the agent test runs a real agent and a real
process whose command line names a port that is not a number.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from pathlib import Path

import pytest

from console.collect.sources.linestream import StreamError, open_stream
from console.collect.views.gateway_view import GatewayPercentiles
from console.collect.views.gateway_view import parse as parse_gateway
from console.core.metrics.promtext import finite, parse
from console.core.metrics.window import ModelWindow
from plugins.base import json_number, port_from
from plugins.triton import read_models
from plugins.trtllm import iteration_model
from plugins.vllm import read_metrics
from tests.engines.servers import stop, wait_until


def test_a_sample_in_unicode_digits_or_with_underscores_is_not_a_number():
    """Python's float() reads "١٢" as 12 and "1_0" as 10; Prometheus' own parser (and
    so every exporter's contract) refuses both. Such a line is a bad line, not a 12."""
    text = (
        'vllm:num_requests_running{model_name="m"} ١٢\n'
        'vllm:num_requests_waiting{model_name="m"} 1_000\n'
        'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
        'vllm:request_success_total{model_name="m"} NaN\n'
        'vllm:generation_tokens_total{model_name="m"} +Inf\n'
        'vllm:prompt_tokens_total{model_name="m"} 1e308\n'
    )
    exp = parse(text, ("vllm:",))
    assert exp.bad_lines == 2 and exp.first_bad is not None and "١٢" in exp.first_bad
    assert [s.name for s in exp.samples] == [
        "vllm:kv_cache_usage_perc",
        "vllm:request_success_total",
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
    ]
    (model,) = read_metrics(text, ["m"])
    assert model.requests_running is None and model.requests_waiting is None
    assert model.kv_cache_usage == 0.5
    for text_value, expected in (("١٢", None), ("1_0", None), ("nan", None), ("-Inf", None),
                                 ("1e308", 1e308), (" 41 ", 41.0), ("[N/A]", None)):  # fmt: skip
        assert finite(text_value) == expected, text_value


def test_a_bucket_whose_bound_is_not_a_number_costs_that_bucket_not_the_engine():
    """Before, one `le="abc"` raised out of the probe: the engine showed unhealthy
    ("probe failed: ValueError(...)") and lost every figure."""
    name = "vllm:e2e_request_latency_seconds"

    def text(count: int) -> str:
        lines = [f'{name}_bucket{{model_name="m",le="{le}"}} {n}'
                 for le, n in (("0.1", count // 2), ("abc", 1), ("NaN", 1), ("١", 1),
                               ("1", count), ("+Inf", count))]  # fmt: skip
        lines += [f'{name}_count{{model_name="m"}} {count}', f'{name}_sum{{model_name="m"}} 1']
        lines.append('vllm:request_success_total{model_name="m",finished_reason="stop"} 3')
        return "\n".join(lines) + "\n"

    window = ModelWindow(60)
    window.add(0.0, read_metrics(text(0), ["m"])[0])
    window.add(1.0, read_metrics(text(10), ["m"])[0])
    e2e = window.stats().latency.e2e_s
    assert e2e.count == 10 and e2e.p50 is not None and 0 < e2e.p50 <= 0.1


def test_engine_statistics_that_are_not_numbers_are_unknown_not_a_failed_probe():
    """Triton's statistics and trtllm-serve's iteration stats are JSON from the engine:
    a string, a bool, NaN, or an integer too large for a float (`float()` raises) is an
    unknown figure; before, it raised, and the engine showed unhealthy."""
    huge = 10**400
    stats = {"model_stats": [
        {"name": "bad", "inference_stats": {"success": {"count": "abc", "ns": 5},
                                            "fail": {"count": huge, "ns": 0},
                                            "queue": {"count": 1, "ns": [1]}}},
        {"name": "good", "inference_stats": {"success": {"count": 4, "ns": 4e9},
                                             "fail": {"count": 0, "ns": 0},
                                             "queue": {"count": 4, "ns": 0}}},
    ]}  # fmt: skip
    bad, good = read_models(["bad", "good"], json.loads(json.dumps(stats)), None)
    assert bad.counters == {} and "e2e" not in bad.means
    assert good.counters == {"requests": 4.0, "errors": 0.0}
    assert good.means["e2e"].count == 4 and good.means["e2e"].total_s == 4.0

    for hostile in ({"numActiveRequests": huge, "numQueuedRequests": "7",
                     "kvCacheStats": {"usedNumBlocks": 5, "maxNumBlocks": 0}},
                    {"numActiveRequests": True, "numQueuedRequests": float("nan"),
                     "kvCacheStats": {"usedNumBlocks": "x", "maxNumBlocks": 10}},
                    {"numActiveRequests": float("inf"),
                     "kvCacheStats": {"usedNumBlocks": 5, "maxNumBlocks": huge}}):  # fmt: skip
        model = iteration_model("m", hostile)
        assert (model.requests_running, model.requests_waiting) == (None, None), hostile
        assert model.kv_cache_usage is None, hostile
    kv = {"usedNumBlocks": 5, "maxNumBlocks": 10}
    model = iteration_model(
        "m", {"numActiveRequests": 3, "numQueuedRequests": 1, "kvCacheStats": kv}
    )
    assert (model.requests_running, model.requests_waiting, model.kv_cache_usage) == (3, 1, 0.5)
    assert [json_number(v) for v in (1, 2.5, True, "1", huge, float("nan"))] == [
        1.0, 2.5, None, None, None, None,
    ]  # fmt: skip


@pytest.mark.parametrize("port", ["²", "١٢", "99999", "0", "-1", "8000x"])
def test_a_port_flag_that_is_not_a_port_reads_as_none_given(port):
    for cmdline in (["vllm", "serve", "--port", port], ["vllm", "serve", f"--port={port}"]):
        assert port_from(cmdline, ("--port",), [], 8000) == 8000
    assert port_from(["vllm", "serve", "--port", "8011"], ("--port",), [], 8000) == 8011


AGENT_FLEET = """\
[fleet]
name = "t"
[agent]
state_dir = "{state}"
scrape_interval_s = 1.0
probe_timeout_s = 1.0
discover = true
[[nodes]]
name = "local"
agent = "http://127.0.0.1:9410"
"""


def test_a_process_whose_port_flag_is_not_a_number_does_not_stop_the_agent(
    agent_factory, tmp_path: Path
):
    """Any local user can start a process that looks like an engine. Before, `vllm serve
    --port ²` raised out of discovery, in the agent's first snapshot cycle: the agent
    did not start (and, started before it, failed every cycle after)."""
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\nsleep 300\n")  # sh keeps this command line; sleep is a child
    script.chmod(0o755)
    process = subprocess.Popen([str(script), "serve", "--port", "²"], start_new_session=True)
    try:
        agent = agent_factory(AGENT_FLEET.format(state=tmp_path / "state"))
        first = agent.snapshot()["node"]["time"]
        # Cycles go on: a later snapshot, and the process found with the default port.
        snap = wait_until(
            lambda: (s := agent.snapshot())["node"]["time"] > first and s,
            20,
            what="a second snapshot cycle",
        )
        mine = [e for e in snap["engines"] if e.get("pid") == process.pid]
        assert len(mine) == 1 and mine[0]["endpoint"].endswith(":8000"), snap["engines"]
    finally:
        stop(process, grace=5)


async def _stream_of(body: bytes) -> tuple[list[bytes], BaseException | None]:
    """What the console's stream reader makes of `body`, sent chunked by a real server."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(head + body)
        await writer.drain()
        # Held open until the reader goes: it must fail on the framing, not on a close.
        with contextlib.suppress(TimeoutError, ConnectionError):
            await asyncio.wait_for(reader.read(), 5)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    lines: list[bytes] = []
    async with server:
        stream = await open_stream(
            f"http://127.0.0.1:{port}/v1/snapshot/stream", {}, lines.append,
            max_line=1024, timeout_s=5,
        )  # fmt: skip
        try:
            await asyncio.wait_for(asyncio.shield(stream.ended), 1.5)
        except (StreamError, TimeoutError) as exc:
            return lines, exc
        finally:
            stream.close(StreamError("test over"))
    return lines, None


@pytest.mark.parametrize("size", [b"-5", b"+6", b"0x6", b"6_0", "\u0666".encode()])
async def test_a_chunk_size_that_is_not_hex_digits_is_bad_framing(size):
    """`int(size, 16)` also reads "-5", "+6", "0x6" and "6_0": a negative size read the
    payload backwards, the others a size the agent never sent. Only hex digits are one."""
    lines, error = await _stream_of(size + b"\r\nhello\n\r\n")
    assert lines == [] and isinstance(error, StreamError), (lines, error)
    assert str(error) == "bad chunked framing from the agent"
    lines, error = await _stream_of(b"6;ext=1\r\nhello\n\r\n")
    assert lines == [b"hello"] and isinstance(error, TimeoutError)


def test_a_gateway_figure_that_is_not_a_number_is_unknown_never_zero():
    """The gateway's snapshot is outside input to the console: a string, a bool, NaN, a
    negative number or a missing key reads as unknown (None), never as 0, and costs only
    that figure; an entry that is not an object is no deployment."""
    odd = {"p50": "0.1", "p95": float("nan"), "p99": -1.0, "count": True}
    view = parse_gateway({
        "models": {
            "m": {
                "bad": {"weight": "max", "up": "yes", "inflight": 2.5, "requests": -3,
                        "failures": None, "error_rate": float("inf"), "ttft_s": odd,
                        "itl_s": [0.1], "e2e_s": "fast"},
                "bare": {},
                "good": {"weight": 0, "up": False, "requests": 40, "failures": 10,
                         "error_rate": 0.25, "ttft_s": {"p95": 0.64, "count": 40}},
                "not-an-object": 7,
            },
            "not-a-model": ["x"],
        }
    })  # fmt: skip
    assert view is not None and view.routes("not-a-model") is None
    assert set(view.routes("m") or {}) == {"bad", "bare", "good"}
    for name in ("bad", "bare"):
        dep = view.at("m", name)
        assert dep is not None
        assert (dep.weight, dep.up, dep.inflight, dep.requests, dep.failures) == (None,) * 5
        assert dep.error_rate is None and dep.error_ratio is None and not dep.down
        assert dep.ttft_s == dep.itl_s == dep.e2e_s == GatewayPercentiles()
    good = view.at("m", "good")
    assert good is not None and good.down and good.weight == 0 and good.ttft_p95 == 0.64
    assert (good.requests, good.failures, good.error_ratio) == (40, 10, 0.25)
    assert view.weights("m") == {"good": 0}  # an unknown weight is left out, not 0
    assert view.at("m", "") is None and view.at("other", "good") is None
    assert parse_gateway(None) is None and parse_gateway({}) is not None
