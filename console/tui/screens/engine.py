"""Engine detail: versions, state and why, its configuration, and what it serves."""

from __future__ import annotations

import json

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from console.tui import format as fmt
from console.tui.built import ViewBuilt
from console.tui.screens.base import ViewScreen
from console.tui.widgets.safe_static import SafeStatic


class EngineScreen(ViewScreen):
    def __init__(self, node: str, engine_id: str) -> None:
        super().__init__()
        self.node = node
        self.engine_id = engine_id
        self.where = f"Engine {node}/{engine_id}"

    def compose_body(self) -> ComposeResult:
        with VerticalScroll():
            yield SafeStatic(id="engine-info")  # the engine's own answers

    def draw(self, built: ViewBuilt) -> None:
        state = built.states.get(self.node)
        snap = state.snapshot if state else None
        engine = next((e for e in snap.engines if e.id == self.engine_id), None) if snap else None
        out = self.query_one("#engine-info", Static)
        if engine is None or snap is None:
            out.update(
                Text(
                    f"engine {self.engine_id} is not reported by node {self.node}", style="bold red"
                )
            )
            return
        t = Text()
        t.append(f"{engine.id}  ", style="bold")
        t.append(f"{engine.kind} {engine.version or '?'}  ")
        t.append_text(fmt.status(engine.state))
        t.append(
            f"\nendpoint {engine.endpoint}  pid {engine.pid or '?'}  "
            f"probe {engine.probe_ms or 0:.0f} ms  "
            f"{'discovered' if engine.discovered else 'declared'}"
        )
        t.append(f"\ndeployments: {', '.join(engine.deployment_ids) or '(none in fleet.toml)'}")
        t.append(
            f"\nnode {self.node}: driver {snap.driver_version or '?'}, "
            f"CUDA {snap.cuda_driver_version or '?'}"
        )
        if engine.reason:
            t.append(f"\n\nwhy: {engine.reason}", style="yellow")
        for m in engine.models:
            lat = m.latency
            window = "?" if m.window_s is None else f"{m.window_s:.0f}"
            t.append(f"\n\nmodel {m.name}", style="bold")
            t.append(
                f"\n  running {fmt.count(m.requests_running)}  waiting "
                f"{fmt.count(m.requests_waiting)}  KV {fmt.ratio(m.kv_cache_usage)}  "
                f"rate {fmt.rate(m.request_rate)}  window {window} s"
            )
            for name, p in (("TTFT", lat.ttft_s), ("ITL", lat.itl_s), ("e2e", lat.e2e_s)):
                t.append(
                    f"\n  {name:<5} p50 {fmt.seconds(p.p50)}  p95 {fmt.seconds(p.p95)}  "
                    f"p99 {fmt.seconds(p.p99)}  mean {fmt.seconds(p.mean)}  "
                    f"({p.source or 'no data'})"
                )
        if engine.config:
            t.append("\n\nconfiguration", style="bold")
            t.append("\n" + json.dumps(engine.config, indent=2, default=str)[:6000])
        t.append(
            "\n\nlog lines: the agent keeps logs for the engines it starts (jobs); this "
            "engine's own log is not read by the agent.",
            style="dim",
        )
        out.update(t)
