"""What an on-call engineer types is on the screen: every input of every screen, in a
real terminal (tmux), at 80x24 and 200x50.

Issue 28: `/util>90` showed only the input's top border (`▊▔▔▔`) and the text nowhere,
and so did the Start vLLM form's focused field; Textual's own pilot snapshots did not
see it. The console here watches a real agent and a real gateway on loopback.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import OPERATOR, ROOT, start_agent
from tests.engines.servers import free_port, stop, wait_until
from tests.support.terminal import TMUX, Terminal, console_env

pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (make test does)")

SIZES = [(80, 24), (200, 50)]
ADMIN = "admin-token-typing-0123"

FLEET = """\
[fleet]
name = "typing"
environment = "staging"
refresh_s = 1

[agent]
state_dir = "{state}"

[gateway]
url = "http://127.0.0.1:{gateway_port}"
state_dir = "{gateway_state}"
token_env = "T_ADMIN"

[[nodes]]
name = "local"
agent = "http://127.0.0.1:{agent_port}"
token_env = "T_OPERATOR"

[[models]]
name = "tiny"
slo = {{ ttft_p95_ms = 500, itl_p95_ms = 60 }}

  [[models.deployments]]
  id = "tiny-a"
  node = "local"
  engine = "vllm"
  endpoint = "http://127.0.0.1:{closed_a}"
  weight = 100

  [[models.deployments]]
  id = "tiny-b"
  node = "local"
  engine = "vllm"
  endpoint = "http://127.0.0.1:{closed_b}"
  weight = 0

[profiles.tiny]
engine = "vllm"
node = "local"
model = "{model}"
served_model_name = "tiny"
port = {closed_b}
command = ["{python}", "-m", "vllm.entrypoints.openai.api_server"]
overridable = ["port"]
"""


@dataclass
class Setup:
    fleet: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("typing")
    model = tmp / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    agent_port, gateway_port, closed_a, closed_b = (free_port() for _ in range(4))
    text = FLEET.format(
        state=tmp / "state",
        gateway_state=tmp / "gateway-state",
        agent_port=agent_port,
        gateway_port=gateway_port,
        closed_a=closed_a,
        closed_b=closed_b,
        model=model,
        python=sys.executable,
    )
    (tmp / "agent").mkdir()
    agent = start_agent(tmp / "agent", text, "local", agent_port)
    fleet = tmp / "fleet.toml"
    fleet.write_text(text)
    env = console_env(T_OPERATOR=OPERATOR.split(":", 1)[1], T_ADMIN=ADMIN)
    gateway = subprocess.Popen(
        [sys.executable, "-m", "console.cli", "gateway", "--fleet", str(fleet)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**env, "ENGINEROOM_ADMIN_TOKEN": ADMIN},
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        import httpx

        def gateway_up() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{gateway_port}/healthz", timeout=1).is_success
            except httpx.HTTPError:
                return False

        wait_until(gateway_up, timeout=30, what="the gateway")
        yield Setup(fleet, env)
    finally:
        stop(gateway, grace=5)
        stop(agent.process, grace=5)


def console(setup: Setup, size: tuple[int, int], *args: str) -> Terminal:
    argv = [sys.executable, "-m", "console.cli", "--fleet", str(setup.fleet), *args]
    return Terminal(argv, size, setup.env, ROOT)


def on_bottom(typed: str, rows: int = 3):
    """The typed text on one of the bottom rows, where the command line is."""
    return lambda screen: any(typed in row for row in screen[-rows:])


# Each view, the key that opens it and a word its header shows.
VIEWS = [("n", "Fleet"), ("g", "GPUs"), ("m", "Models"), ("v", "Events"), ("j", "Jobs"),
         ("d", "Drills")]  # fmt: skip


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_command_line_and_the_filter_show_what_is_typed_on_every_screen(setup, size):
    with console(setup, size) as term:
        term.wait_for("local", what="the fleet drawn")
        for key, where in VIEWS:
            term.keys(key)
            term.wait_for(lambda rows, w=where: w in rows[0], what=f"the {where} screen")
            for mode, typed, hint in ((":", "xq7 zz", "engine NODE/ID"), ("/", "qx=9", "all must")):
                term.type(mode)
                term.wait_for(on_bottom(hint), what=f"the {mode} line open on {where}")
                term.type(typed)
                term.wait_for(on_bottom(mode + typed), what=f"{mode}{typed} typed on {where}")
                term.keys("Escape")
                term.wait_for(
                    lambda rows, t=mode + typed: not on_bottom(t)(rows), what="the line closed"
                )
        # A detail screen has the same line.
        term.type(":")
        term.wait_for(on_bottom("engine NODE/ID"), what="the command line open")
        term.type("node local")
        term.wait_for(on_bottom(":node local"), what="the command typed")
        term.keys("Enter")
        term.wait_for(lambda rows: "local" in rows[0] and "Fleet" not in rows[0], what="node")
        term.type("/")
        term.wait_for(on_bottom("all must"), what="the filter line open")
        term.type("pid>1")
        term.wait_for(on_bottom("/pid>1"), what="a filter typed on the node screen")
        term.keys("Escape")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_start_vllm_form_shows_the_typed_override(setup, size):
    with console(setup, size) as term:
        term.wait_for("local", what="the fleet drawn")
        term.type(":")
        term.wait_for(on_bottom("engine NODE/ID"), what="the command line open")
        term.type("start tiny")
        term.keys("Enter")
        term.wait_for("Start vLLM for tiny", what="the form")
        term.wait_for("preflight", what="the agent's plan, the fields mounted")
        term.keys("Tab")  # from the profile to the first override, `port`
        term.wait_for_cursor_on("port")
        term.type("18123")
        # The value on the field's own row (the plan's argv shows the port too).
        term.wait_for(
            lambda rows: any(re.search(r"\bport\s{2,}18123\b", row) for row in rows),
            what="18123 in the port field",
        )
        term.keys("Escape")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_failover_confirmation_shows_what_is_typed(setup, size):
    with console(setup, size) as term:
        term.wait_for("local", what="the fleet drawn")
        term.keys("m")
        term.wait_for("tiny-a", what="Models with the deployments")
        term.keys("f")
        term.wait_for("Fail over tiny", what="the plan")
        term.wait_for("type tiny below to confirm", what="the move named, whole")
        term.keys("Tab", "Tab")  # target, mode, then the confirmation
        term.wait_for_cursor_on("type tiny")  # its placeholder, under the move named
        term.type("zq-typed")
        term.wait_for("zq-typed", what="the typed confirmation")
        term.keys("Escape")
