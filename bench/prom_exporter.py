"""The SIMULATED exporter of bench.prom_scale: the series of N nodes, served in shards.

Each node has 8 GPUs in dcgm-exporter's names and labels and 2 vLLM deployments in vLLM's
names (`vllm:*`, histograms cut to `buckets` finite buckets each); values change every
second (counters grow at each deployment's own rate). A real Prometheus scrapes it, one
shard per job (`?shard=I&of=N`), `honor_labels` on, so each series keeps the `instance`
and `node` labels it would carry in a real fleet.
"""

from __future__ import annotations

import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

GPUS_PER_NODE = 8
DEPLOYMENTS_PER_NODE = 2
# vLLM's TTFT, ITL and e2e bucket bounds, cut to `--buckets` (their first ones).
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
              5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BOUNDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
              60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


class SyntheticFleet:
    """The series of `nodes` nodes, rendered per shard; values are functions of time."""

    def __init__(self, nodes: int, buckets: int) -> None:
        self.nodes = nodes
        self.start = time.time()
        self.hist = {
            "vllm:time_to_first_token_seconds": TTFT_BOUNDS[:buckets],
            "vllm:inter_token_latency_seconds": ITL_BOUNDS[:buckets],
            "vllm:e2e_request_latency_seconds": E2E_BOUNDS[:buckets],
        }

    def shard(self, index: int, of: int) -> bytes:
        t = time.time() - self.start
        tick = int(t)
        out: list[str] = []
        add = out.append
        for n in range(index, self.nodes, of):
            host = f"node-{n:05d}"
            ip = f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"
            for g in range(GPUS_PER_NODE):
                labels = (
                    f'gpu="{g}",UUID="GPU-{n:08x}-0000-0000-0000-{g:012d}",device="nvidia{g}",'
                    f'modelName="NVIDIA H200",Hostname="{host}",instance="{ip}:9400",'
                    'DCGM_FI_DRIVER_VERSION="550.54.15"'
                )
                wave = (n * 7 + g * 13 + tick) % 100
                add(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {wave}")
                add(f"DCGM_FI_DEV_FB_USED{{{labels}}} {40000 + wave * 900}")
                add(f"DCGM_FI_DEV_FB_FREE{{{labels}}} {101000 - wave * 900}")
                add(f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} {35 + wave // 3}")
                add(f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} {120 + wave * 5}")
                add(f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} 0")
            for d in range(DEPLOYMENTS_PER_NODE):
                labels = (
                    f'model_name="model-{(n * DEPLOYMENTS_PER_NODE + d) % 500:03d}",'
                    f'engine="0",node="{host}",instance="{ip}:{8000 + d}"'
                )
                rate = 0.5 + (n * 31 + d * 17) % 45 / 10  # requests/s, per deployment
                requests = int(rate * t)
                add(f"vllm:num_requests_running{{{labels}}} {(tick + n) % 16}")
                add(f"vllm:num_requests_waiting{{{labels}}} {(tick + n) % 5}")
                add(f"vllm:kv_cache_usage_perc{{{labels}}} {((tick + n) % 90) / 100}")
                add(f'vllm:request_success_total{{{labels},finished_reason="stop"}} {requests}')
                add(f'vllm:request_success_total{{{labels},finished_reason="error"}} '
                    f"{requests // 200}")  # fmt: skip
                shape = 0.3 + (n + d) % 7 / 10  # where each deployment's latency sits
                for name, bounds in self.hist.items():
                    count = (
                        requests if name != "vllm:inter_token_latency_seconds" else requests * 40
                    )
                    below = 0.0
                    for i, bound in enumerate(bounds):
                        below = min(1.0, below + shape / (i + 2))
                        add(f'{name}_bucket{{{labels},le="{bound}"}} {int(count * below)}')
                    add(f'{name}_bucket{{{labels},le="+Inf"}} {count}')
                    add(f"{name}_sum{{{labels}}} {count * bounds[len(bounds) // 3]:.3f}")
                    add(f"{name}_count{{{labels}}} {count}")
        add("")
        return "\n".join(out).encode()


def serve_exporter(nodes: int, buckets: int, port: int) -> None:
    fleet = SyntheticFleet(nodes, buckets)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name
            query = parse_qs(urlsplit(self.path).query)
            body = fleet.shard(int(query["shard"][0]), int(query["of"][0]))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("serving", flush=True)
    server.serve_forever()
