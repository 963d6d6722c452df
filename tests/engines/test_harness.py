"""The harness itself: the real engines start, answer, and report the versions we pinned."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.engines.servers import (
    TritonServer,
    VllmServer,
    iter_sse_data,
    send_traffic_triton,
    send_traffic_vllm,
)

pytestmark = pytest.mark.engines


def test_vllm_answers_a_completion_and_reports_its_version(vllm_server: VllmServer) -> None:
    assert vllm_server.version == "0.32.0"
    assert httpx.get(f"{vllm_server.base_url}/version", timeout=5).json() == {"version": "0.32.0"}

    response = httpx.post(
        f"{vllm_server.base_url}/v1/completions",
        json={"model": "tiny", "prompt": "the gpu fleet", "max_tokens": 8, "ignore_eos": True},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 8
    assert send_traffic_vllm(vllm_server.base_url, 2, stream=True) == 2


def test_triton_generate_answers_once_and_generate_stream_streams(
    triton_server: TritonServer,
) -> None:
    url = f"{triton_server.base_url}/v2/models/ensemble"
    one = httpx.post(f"{url}/generate", json={"text_input": "hi", "max_tokens": 4}, timeout=10)
    assert one.status_code == 200, one.text
    assert one.json()["text_output"] == " tok0 tok1 tok2 tok3"

    body = {"text_input": "hi", "max_tokens": 5, "stream": True}
    with httpx.stream("POST", f"{url}/generate_stream", json=body, timeout=10) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(data) for data in iter_sse_data(response.iter_lines())]
    assert [e["text_output"] for e in events] == [f" tok{i}" for i in range(5)]

    assert send_traffic_triton(triton_server.base_url, "ensemble", 2, stream=False) == 2
    assert send_traffic_triton(triton_server.base_url, "ensemble", 2, stream=True) == 2


def test_triton_reports_version_and_fails_on_request(triton_server: TritonServer) -> None:
    assert triton_server.version == "2.51.0"
    server = httpx.get(f"{triton_server.base_url}/v2", timeout=5).json()
    assert server["name"] == "triton"
    assert server["version"] == "2.51.0"

    failed = httpx.post(
        f"{triton_server.base_url}/v2/models/ensemble/generate",
        json={"text_input": "FAIL please", "max_tokens": 2},
        timeout=10,
    )
    assert failed.status_code == 400
    assert "error" in failed.json()
