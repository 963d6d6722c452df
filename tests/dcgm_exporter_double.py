"""A dcgm-exporter TEST DOUBLE: a tiny static HTTP server that serves /metrics in
dcgm-exporter's text format, for a Prometheus to scrape.

dcgm-exporter itself cannot run here (it needs a GPU and DCGM). This serves what its
default counters file exports, with its labels (`gpu`, `UUID`, `device`, `modelName`,
`Hostname`, `DCGM_FI_DRIVER_VERSION`, `pci_bus_id`) and units (framebuffer in MiB,
power in W, temperature in C, `DCGM_FI_DEV_XID_ERRORS` the last XID seen). The values come
from a JSON file, read at each scrape, so a test knows exactly what Prometheus holds and
can change it.

    python -m tests.dcgm_exporter_double --port P --gpus gpus.json --hostname local

gpus.json: [{"util": 37, "fb_used": 1024, "fb_free": 80000, "temp": 41, "power": 120.5,
             "xid": 0, "ecc_dbe": 0}, ...], one object per GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DRIVER = "550.54.15"
MODEL = "NVIDIA H200"
FIELDS = (
    # (field, metric, type, help): as dcgm-exporter's default-counters.csv words them
    ("sm_clock", "DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("temp", "DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("power", "DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("util", "DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("throttle", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Throttling reasons (bitmask)."),
    ("xid", "DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("fb_free", "DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("fb_used", "DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    (
        "ecc_dbe",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "Total number of double-bit volatile ECC errors.",
    ),
)


def uuid_of(hostname: str, index: int) -> str:
    """A stable UUID per host and index, in NVML's shape."""
    digest = hashlib.sha256(hostname.encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{index:012d}"


def render(hostname: str, gpus: list[dict[str, Any]]) -> str:
    lines = []
    for key, metric, kind, help_text in FIELDS:
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]
        for index, gpu in enumerate(gpus):
            if key not in gpu:
                continue  # a field this GPU does not export: absent, as in dcgm-exporter
            labels = (
                f'gpu="{index}",UUID="{gpu.get("uuid") or uuid_of(hostname, index)}",'
                f'pci_bus_id="00000000:{index + 7:02X}:00.0",device="nvidia{index}",'
                f'modelName="{MODEL}",Hostname="{hostname}",'
                f'DCGM_FI_DRIVER_VERSION="{DRIVER}"'
            )
            lines.append(f"{metric}{{{labels}}} {gpu[key]}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--gpus", required=True, help="a JSON file: one object per GPU")
    args = parser.parse_args(argv)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            with open(args.gpus, encoding="utf-8") as f:
                body = render(args.hostname, json.load(f)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # a scrape a second: keep quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"dcgm-exporter TEST DOUBLE on 127.0.0.1:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
