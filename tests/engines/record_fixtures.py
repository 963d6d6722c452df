"""Record what the REAL engines answer, as parsing fixtures under tests/fixtures/.

    .venv/bin/python -m tests.engines.record_fixtures [--out tests/fixtures]

Starts vLLM (with the exact argv of `servers.vllm_argv`, no test-only flags) and tritonserver
on loopback, sends a little traffic and saves the bodies as the servers sent them, byte for byte.
See tests/fixtures/README.md for what each file holds.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.engines import servers
from tests.engines.triton_repo import write_repo

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "fixtures"


def metric_sum(text: str, name: str) -> float:
    """Sum of all samples of `name` (any labels) in a Prometheus text body."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(text))


def save(out: Path, name: str, body: bytes) -> None:
    (out / name).write_bytes(body)
    print(f"wrote {out / name} ({len(body)} bytes)")


def get(url: str) -> bytes:
    response = httpx.get(url, timeout=10)
    response.raise_for_status()
    return response.content


def record_vllm(server: servers.VllmServer, out: Path) -> None:
    prefix = f"vllm-{server.version}"
    save(out, f"{prefix}.idle.metrics.txt", get(f"{server.base_url}/metrics"))
    save(out, f"{prefix}.models.json", get(f"{server.base_url}/v1/models"))

    sent = servers.send_traffic_vllm(server.base_url, 4, stream=False)
    sent += servers.send_traffic_vllm(server.base_url, 4, stream=True)
    assert sent == 8, f"only {sent} of 8 vLLM requests succeeded"

    # Counters are updated from the engine's output stream: wait until all 8 are in.
    def counted() -> bool:
        text = get(f"{server.base_url}/metrics").decode()
        return metric_sum(text, "vllm:request_success_total") >= 8

    servers.wait_until(counted, timeout=30, what="vLLM metrics count 8 requests")
    save(out, f"{prefix}.metrics.txt", get(f"{server.base_url}/metrics"))

    save(out, f"{prefix}.busy.metrics.txt", busy_scrape(server.base_url))


def busy_scrape(base_url: str, attempts: int = 3) -> bytes:
    """A /metrics body taken while requests run: non-zero running count and KV-cache usage.

    Eight long requests through one shared client keep the batch busy for about a second.
    On 2 cores /metrics itself can answer late (after the batch is done), hence the retries.
    """
    body = {"model": "tiny", "prompt": "the gpu fleet", "max_tokens": 240, "ignore_eos": True}
    limits = httpx.Limits(max_connections=16)
    with httpx.Client(base_url=base_url, timeout=60, limits=limits) as client:
        for _ in range(attempts):
            with ThreadPoolExecutor(8) as pool:
                load = [pool.submit(client.post, "/v1/completions", json=body) for _ in range(8)]
                while not all(f.done() for f in load):
                    scraped = client.get("/metrics").content
                    if metric_sum(scraped.decode(), "vllm:num_requests_running") >= 2:
                        return scraped
    raise RuntimeError(f"no /metrics scrape saw running requests in {attempts} attempts")


def triton_traffic(server: servers.TritonServer) -> None:
    sent = servers.send_traffic_triton(server.base_url, server.model, 4, stream=False)
    sent += servers.send_traffic_triton(server.base_url, server.model, 4, stream=True)
    assert sent == 8, f"only {sent} of 8 Triton requests succeeded"
    failed = httpx.post(
        f"{server.base_url}/v2/models/{server.model}/generate",
        json={"text_input": "FAIL on purpose", "max_tokens": 2},
        timeout=10,
    )
    assert failed.status_code == 400, failed.text

    def settled() -> bytes | None:
        # Per-model counters move at once; the CPU gauges only every metrics interval (2 s).
        body = get(server.metrics_url)
        text = body.decode()
        done = metric_sum(text, "nv_inference_request_success") >= 8
        return body if done and metric_sum(text, "nv_cpu_memory_total_bytes") > 0 else None

    servers.wait_until(settled, timeout=30, what="Triton metrics settle")


def record_triton(server: servers.TritonServer, out: Path) -> None:
    prefix = f"triton-{server.version}"
    triton_traffic(server)
    save(out, f"{prefix}.metrics.txt", get(server.metrics_url))
    save(out, f"{prefix}.stats.json", get(f"{server.base_url}/v2/models/{server.model}/stats"))
    save(out, f"{prefix}.server.json", get(f"{server.base_url}/v2"))
    save(out, f"{prefix}.config.json", get(f"{server.base_url}/v2/models/{server.model}/config"))
    index = httpx.post(f"{server.base_url}/v2/repository/index", timeout=10)
    index.raise_for_status()
    save(out, f"{prefix}.index.json", index.content)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="engineroom-record-") as tmp:
        work = Path(tmp)
        model = servers.make_tiny_model(work / "tiny-model")
        started = time.monotonic()
        process, port, log = servers.launch_vllm(model, work / "vllm")
        try:
            # Triton while vLLM boots: it needs 2 s, vLLM about 40.
            repo = write_repo(work / "triton-repo")
            triton = servers.start_triton(repo, work / "triton")
            try:
                record_triton(triton, args.out)
            finally:
                servers.stop(triton)
            # The same traffic with Triton's opt-in latency summaries (2.51 has no histograms).
            triton = servers.start_triton(
                repo,
                work / "triton-summary",
                extra_args=["--metrics-config=summary_latencies=true"],
            )
            try:
                triton_traffic(triton)
                name = f"triton-{triton.version}.summary.metrics.txt"
                save(args.out, name, get(triton.metrics_url))
            finally:
                servers.stop(triton)

            vllm = servers.wait_vllm(process, port, log, model, started=started)
            print(f"vLLM {vllm.version} ready in {vllm.ready_s:.1f} s")
            record_vllm(vllm, args.out)
        finally:
            servers.stop(process)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
