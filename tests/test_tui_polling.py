"""A gateway or agent slower than the console's refresh is still shown once it answers.

The polls used to run on `set_interval` with an exclusive worker: each tick cancelled the
call still waiting, so an answer slower than the interval never arrived. They now start
the next call only after the last one ended (console/tui/polling.py).

SlowServer is a test double: a real HTTP server on loopback that waits before every
answer, standing in for a gateway or an agent on a slow link (the real ones answer in
milliseconds here).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from rich.text import Text
from textual.widgets import Static

from console.core.config.load import parse_fleet
from console.core.snapshot import decode_snapshot, plain
from console.tui.app import EngineroomApp
from console.tui.screens.jobs import JobScreen
from tests.support.loopback_http import LoopbackHttp, QuietHandler
from tests.test_tui_snapshots import RECORDED_GATEWAY
from tests.tui_support import FLEET, ROOT, recorded_app, until

DRILLS = ROOT / "tests" / "fixtures" / "snapshot-cpu-drills.json"


class SlowServer(LoopbackHttp):
    """Test double: answers `answers[path]` (JSON, or text for a str) after `delay_s`."""

    def __init__(self, delay_s: float, answers: dict[str, Any]) -> None:
        self.asked: list[str] = []
        self.in_flight = self.most_at_once = 0
        lock = threading.Lock()
        outer = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                path = self.path.partition("?")[0]
                with lock:
                    outer.asked.append(path)
                    outer.in_flight += 1
                    outer.most_at_once = max(outer.most_at_once, outer.in_flight)
                time.sleep(delay_s)  # the slow link
                with lock:
                    outer.in_flight -= 1
                answer = answers.get(path)
                body = (answer if isinstance(answer, str) else json.dumps(answer)).encode()
                try:
                    self.send_response(200 if answer is not None else 404)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the console closed, or gave up on this call

        super().__init__(Handler)


async def test_a_gateway_slower_than_the_refresh_is_shown_once_it_answers(
    monkeypatch: pytest.MonkeyPatch,
):
    """refresh_s is 0.2 s; the gateway takes 0.5 s (within the client's 1 s timeout)."""
    monkeypatch.setenv("T_GATEWAY", "admin-token-of-the-slow-gateway")
    with SlowServer(0.5, {"/admin/snapshot": RECORDED_GATEWAY}) as gateway:
        fleet = FLEET + f'\n[gateway]\nurl = "{gateway.url}"\ntoken_env = "T_GATEWAY"\n'
        app = recorded_app(fleet)
        async with app.run_test(size=(140, 30)) as pilot:
            shown = await until(
                pilot, lambda: app.gateway_snapshot, timeout=15, what="the gateway's snapshot"
            )
            assert shown == RECORDED_GATEWAY and app.gateway_error is None
            # One call at a time, even when asked again while one waits: the next starts
            # right after the last one answered.
            for _ in range(5):
                app.gateway_poll.now()
            started = len(gateway.asked)
            await until(pilot, lambda: len(gateway.asked) > started + 1, what="two more polls")
            assert gateway.most_at_once == 1


async def test_a_job_on_an_agent_slower_than_the_job_screen_refresh_is_shown():
    """The Job screen polls every second; this agent takes 1.5 s for each answer."""
    job = next(j for j in decode_snapshot(DRILLS.read_text()).jobs)
    answers = {
        f"/v1/jobs/{job.id}": plain(job),
        f"/v1/jobs/{job.id}/log": "the drill's last log line\n",
    }
    with SlowServer(1.5, answers) as agent:
        fleet = parse_fleet(
            f'[fleet]\nname = "slow"\n[[nodes]]\nname = "slow"\nagent = "{agent.url}"\n'
        )
        app = EngineroomApp(fleet)
        async with app.run_test(size=(120, 40)) as pilot:
            app.open_job("slow", job.id)
            screen = await until(
                pilot,
                lambda: app.screen if isinstance(app.screen, JobScreen) else None,
                what="the job screen",
            )
            await until(pilot, lambda: screen.log_lines, timeout=20, what="the job and its log")
            assert screen.job is not None and screen.job.id == job.id
            info = screen.query_one("#job-info", Static).content
            assert isinstance(info, Text) and job.state.upper() in info.plain
            log = screen.query_one("#log", Static).content
            assert isinstance(log, Text) and "the drill's last log line" in log.plain


async def test_a_gateway_past_the_client_timeout_is_said_and_the_poll_carries_on(
    monkeypatch: pytest.MonkeyPatch,
):
    """The limit: the client gives up after 1 s (twice refresh_s, at least 1 s), says so,
    and the next poll still comes."""
    monkeypatch.setenv("T_GATEWAY", "admin-token-of-the-slow-gateway")
    with SlowServer(3.0, {"/admin/snapshot": RECORDED_GATEWAY}) as gateway:
        fleet = FLEET + f'\n[gateway]\nurl = "{gateway.url}"\ntoken_env = "T_GATEWAY"\n'
        app = recorded_app(fleet)
        async with app.run_test(size=(140, 30)) as pilot:
            error = await until(pilot, lambda: app.gateway_error, what="the gateway's error")
            assert f"gateway {gateway.url} did not answer" in error
            assert app.gateway_snapshot is None
            await until(pilot, lambda: len(gateway.asked) >= 2, what="the next poll")
