"""A hostile exporter for a real Prometheus to scrape: a real HTTP server in the test
process that serves, on /metrics, whatever Prometheus text the test hands it.

Any exporter that Prometheus scrapes writes series the console reads; this one writes
the series a broken or malicious one could. `page` is called at every scrape (it gets the
scrape's number), so a counter can run backwards from one scrape to the next.

    with Exporter(lambda n: "DCGM_FI_DEV_FB_USED{Hostname=\"h\",gpu=\"0\"} 1e308\\n") as e:
        ... scrape_config = e.job("hostile")
"""

from __future__ import annotations

from collections.abc import Callable

from tests.support.loopback_http import LoopbackHttp, QuietHandler


class Exporter(LoopbackHttp):
    """Serves `page(scrape_number)` at /metrics on a free loopback port until closed."""

    def __init__(self, page: Callable[[int], str]) -> None:
        self.page = page
        self.scrapes = 0
        exporter = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                exporter.scrapes += 1
                body = exporter.page(exporter.scrapes).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(Handler)

    def job(self, name: str, **extra: object) -> dict[str, object]:
        """A scrape config for Prometheus."""
        return {
            "job_name": name,
            "static_configs": [{"targets": [f"127.0.0.1:{self.port}"]}],
            **extra,
        }


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def series(name: str, labels: dict[str, str], value: str) -> str:
    """One sample line, label values escaped as the text format wants (and nothing else:
    control characters go through raw)."""
    quoted = ",".join(f'{k}="{_escaped(v)}"' for k, v in labels.items())
    return f"{name}{{{quoted}}} {value}\n"
