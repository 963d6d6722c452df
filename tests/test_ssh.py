"""Agentless nodes over SSH, against a real OpenSSH server on loopback (tests/sshd.py).

Read with engineroom installed on the host, and without it (the nvidia-smi fallback runs
the nvidia-smi TEST DOUBLE: these machines have no GPU). A wrong host key, an unknown
one, a refused port, a host that never sends its banner and a command that prints
garbage each give the node a clear state, within the timeout.
"""

from __future__ import annotations

import asyncio
import json
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import pytest

from console.collect.sources.collector import Collector
from console.collect.sources.ssh import SshError, SshReader
from console.core.config.load import parse_fleet
from console.tui.app import EngineroomApp
from console.tui.screens.node import NodeScreen
from tests.conftest import agent_env, run_cli
from tests.engines.servers import free_port
from tests.sshd import (
    Sshd,
    install_engineroom,
    install_nvidia_smi_double,
    keygen,
    start_sshd,
    stop_sshd,
)
from tests.support.cost import traced
from tests.support.hung import hung_host, switch_screens
from tests.tui_support import until


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    install_engineroom(server)
    install_nvidia_smi_double(server)
    yield server
    stop_sshd(server)


def node(sshd: Sshd, name: str, known_hosts: Path, port: int | None = None, **extra: str) -> str:
    lines = [
        "[[nodes]]",
        f'name = "{name}"',
        f'ssh = "{sshd.user}@127.0.0.1"',
        f"ssh_port = {port or sshd.port}",
        f'ssh_key = "{sshd.client_key}"',
        f'ssh_known_hosts = "{known_hosts}"',
        *(f"{k} = {v}" for k, v in extra.items()),
    ]
    return "\n".join(lines) + "\n"


def fleet_text(*nodes: str, timeout: float = 20.0) -> str:
    return (
        f'[fleet]\nname = "ssh"\nrefresh_s = 0.5\nssh_refresh_s = 1\n'
        f"ssh_timeout_s = {timeout}\n" + "".join(nodes)
    )


async def poll(text: str) -> Collector:
    collector = Collector(parse_fleet(text))
    async with collector:
        await collector.poll_all()
    return collector


async def test_a_host_with_engineroom_is_read_by_running_the_agent_once(sshd, tmp_path):
    text = fleet_text(node(sshd, "box", sshd.known_hosts(tmp_path / "kh")))
    state = (await poll(text)).states["box"]
    assert state.error is None, state.error
    snap = state.snapshot
    assert snap is not None and snap.source == "ssh"
    assert snap.node.name == "box" and snap.host.cpu_count  # the host's own reading
    assert snap.gpu_status.startswith("no NVIDIA driver")  # this machine has no GPU
    assert snap.missing == []


async def test_a_host_without_engineroom_falls_back_to_nvidia_smi_and_says_what_is_missing(
    sshd, tmp_path
):
    text = fleet_text(
        node(
            sshd,
            "bare",
            sshd.known_hosts(tmp_path / "kh"),
            ssh_agent_command='["engineroom-not-installed", "agent", "--once", "--json"]',
        )
    )
    state = (await poll(text)).states["bare"]
    assert state.error is None, state.error
    snap = state.snapshot
    assert snap is not None and snap.source == "ssh nvidia-smi" and snap.gpu_status == "ok"
    assert snap.driver_version == "580.159.04"
    busy, idle = snap.gpus
    assert (busy.name, busy.utilization_pct, busy.power_w) == ("NVIDIA H200", 87.0, 512.34)
    assert busy.memory_used_bytes == 120210 * 2**20
    assert busy.processes and busy.processes[0].used_memory_bytes == 118000 * 2**20
    assert idle.utilization_pct == 0.0 and idle.processes == []
    assert busy.ecc_uncorrected is None  # nvidia-smi was not asked: unknown, not 0
    assert snap.host.cpu_pct is None
    assert snap.missing[0].startswith("engines: `engineroom-not-installed` is not installed")


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("changed key", "CHANGED: it does not match"),
        ("unknown key", "is not in"),
        ("refused", "connection refused"),
        ("garbage", "printed no snapshot"),
        ("hung", "no connect (no SSH banner?) within 2 s"),
    ],
)
async def test_bad_hosts_get_a_clear_state_within_the_timeout(sshd, tmp_path, case, expected):
    known = sshd.known_hosts(tmp_path / "kh")
    port, extra = None, {}
    server = None
    if case == "changed key":
        keygen(tmp_path / "other")
        other = " ".join((tmp_path / "other.pub").read_text().split()[:2])
        known = sshd.known_hosts(tmp_path / "kh", other)
    elif case == "unknown key":
        known.write_text("")
    elif case == "refused":
        port = free_port()
    elif case == "garbage":
        extra["ssh_agent_command"] = '["echo", "this is not JSON"]'
    elif case == "hung":
        server = await asyncio.start_server(lambda r, w: asyncio.sleep(3600), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
    text = fleet_text(node(sshd, "bad", known, port=port, **extra), timeout=2)
    started = time.monotonic()
    state = (await poll(text)).states["bad"]
    took = time.monotonic() - started
    if server is not None:
        server.close()
    assert state.snapshot is None
    assert expected in (state.error or ""), state.error
    if "key" in case:
        assert "SHA256:" in (state.error or "")  # the fingerprint it presented
    assert took < 5, f"{case} took {took:.1f} s"


async def test_trust_on_first_use_adds_the_key_when_the_file_asks(sshd, tmp_path):
    known = tmp_path / "kh"
    known.write_text("")
    text = fleet_text(node(sshd, "new", known, ssh_trust_on_first_use="true"))
    state = (await poll(text)).states["new"]
    assert state.error is None, state.error
    assert sshd.host_key_line in known.read_text()


def test_check_reads_ssh_nodes_with_exit_codes_0_1_2(sshd, tmp_path):
    known = sshd.known_hosts(tmp_path / "kh")
    good = fleet_text(node(sshd, "box", known))
    (tmp_path / "good.toml").write_text(good)
    result = run_cli("check", "--fleet", str(tmp_path / "good.toml"), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    (row,) = report["nodes"]
    assert (row["name"], row["status"], row["transport"]) == ("box", "up", "ssh")

    gone = node(sshd, "gone", known, port=free_port())
    (tmp_path / "mixed.toml").write_text(fleet_text(node(sshd, "box", known), gone))
    result = run_cli("check", "--fleet", str(tmp_path / "mixed.toml"))
    assert result.returncode == 1, result.stdout + result.stderr  # degraded: one is down
    assert "connection refused" in result.stdout

    result = run_cli("check", "--fleet", str(tmp_path / "mixed.toml"), "--prometheus")
    assert result.returncode == 1
    assert 'engineroom_node_up{node="box",transport="ssh"} 1' in result.stdout
    assert 'engineroom_node_up{node="gone",transport="ssh"} 0' in result.stdout
    assert 'engineroom_check_status{fleet="ssh"} 1' in result.stdout

    (tmp_path / "gone.toml").write_text(fleet_text(gone))
    result = run_cli("check", "--fleet", str(tmp_path / "gone.toml"))
    assert result.returncode == 2, result.stdout + result.stderr  # unreachable: none answered


async def test_ssh_nodes_show_as_ssh_and_cannot_start_engines(sshd, tmp_path):
    text = fleet_text(node(sshd, "box", sshd.known_hosts(tmp_path / "kh")))
    app = EngineroomApp(parse_fleet(text))
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: app.collector.states["box"].snapshot, 30, "box read over SSH")
        app.open_node("box")
        await until(
            pilot,
            lambda: any(str(w.render()).strip() for w in app.screen.query("#node-info")),
            10,
            "the node screen's info line",
        )
        assert isinstance(app.screen, NodeScreen)
        info = str(app.screen.query_one("#node-info").render())
        assert "via ssh" in info
        assert "box is read over SSH: starting and stopping engines needs its agent" in info
        assert app.screen.check_action("start_vllm", ()) is None


async def test_the_console_answers_keys_while_an_ssh_host_hangs(sshd, tmp_path):
    async with hung_host() as host:
        kh = sshd.known_hosts(tmp_path / "kh")
        text = fleet_text(node(sshd, "hung", kh, port=host.port), timeout=12)
        app = EngineroomApp(parse_fleet(text))
        async with app.run_test(size=(120, 36)) as pilot:
            # The first read has reached the hung host and now waits on it, for up to 12 s.
            await until(pilot, lambda: host.accepted, 10, "the read's connection")
            await switch_screens(pilot, app)
            # Every key was answered while the read still waited: a console that waited on it
            # would switch screens only after its 12 s timeout (state, not a clock).
            assert app.collector.states["hung"].error is None, "the keys waited for the SSH read"
            error = await until(
                pilot, lambda: app.collector.states["hung"].error, 30, "the read's timeout"
            )
            assert "no connect (no SSH banner?) within 12 s" in error


def test_check_watch_prints_a_fresh_table_every_interval_without_a_tui(sshd, tmp_path):
    (tmp_path / "f.toml").write_text(
        fleet_text(node(sshd, "box", sshd.known_hosts(tmp_path / "kh")))
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "console.cli", "check", "--fleet", str(tmp_path / "f.toml"),
         "--watch", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=agent_env(),
    )  # fmt: skip
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 30
    try:
        # Three tables started: the two before the third are complete.
        while sum(line.startswith("fleet ssh ") for line in lines) < 3:
            assert time.monotonic() < deadline, "".join(lines)
            if select.select([process.stdout], [], [], 1)[0]:
                line = process.stdout.readline()
                assert line, f"check --watch ended: {''.join(lines)}{process.stderr.read()}"
                lines.append(line)
    finally:
        process.terminate()
        process.communicate(timeout=10)
    out = "".join(lines)
    complete = out.split("fleet ssh ")[1:-1]  # each table starts with the fleet line
    assert len(complete) == 2, out
    assert all("box           up/ssh" in table for table in complete), out  # fresh and full
    assert "\x1b[" not in out  # not a terminal: no screen clearing


# -- host keys: every decision through asyncssh's known_hosts matching --------------------


def hashed(path: Path) -> str:
    """Hash `path` in place with OpenSSH's own ssh-keygen -H, as Debian and Ubuntu do."""
    subprocess.run(["ssh-keygen", "-H", "-f", str(path)], check=True, capture_output=True)
    Path(f"{path}.old").unlink()
    return path.read_text()


def other_key(tmp_path: Path) -> str:
    keygen(tmp_path / "other")
    return " ".join((tmp_path / "other.pub").read_text().split()[:2])


@pytest.fixture(scope="module")
def ca_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sshd, str]]:
    """An sshd whose host key comes with a certificate from a host CA; the CA's line."""
    workdir = tmp_path_factory.mktemp("ca-sshd")
    keygen(workdir / "host_ca")
    server = start_sshd(workdir / "sshd", host_ca=workdir / "host_ca")
    install_engineroom(server)
    ca = " ".join((workdir / "host_ca.pub").read_text().split()[:2])
    yield server, ca
    stop_sshd(server)


@pytest.mark.parametrize("entry", ["hashed", "wildcard", "cert-authority", "plain"])
async def test_a_listed_host_with_another_key_is_refused_even_with_trust_on_first_use(
    sshd, tmp_path, entry
):
    known = tmp_path / "kh"
    wrong = other_key(tmp_path)
    if entry == "hashed":
        sshd.known_hosts(known, wrong)
        hashed(known)
    elif entry == "wildcard":
        known.write_text(f"[127.0.0.*]:{sshd.port} {wrong}\n")
    elif entry == "cert-authority":
        known.write_text(f"@cert-authority * {wrong}\n")
    else:
        sshd.known_hosts(known, wrong)
    before = known.read_text()
    text = fleet_text(node(sshd, "moved", known, ssh_trust_on_first_use="true"), timeout=5)
    state = (await poll(text)).states["moved"]
    assert state.snapshot is None, f"{entry}: a listed host's new key was accepted"
    error = state.error or ""
    assert error.startswith(f"ssh 127.0.0.1:{sshd.port}: "), error
    if entry == "cert-authority":
        # Asked for a certificate only (as OpenSSH asks), this sshd has none to offer.
        assert f"({known}:1 trusts only a @cert-authority for this host, and the host " in error
    else:
        presented = asyncssh.import_public_key(sshd.host_key_line).get_fingerprint()
        assert f"host key ssh-ed25519 {presented} CHANGED" in error, error
        assert f"CHANGED: it does not match {known}:1;" in error, error
        assert f"ssh-keygen -R '[127.0.0.1]:{sshd.port}' -f {known}" in error
    assert known.read_text() == before  # nothing appended


@pytest.mark.parametrize("entry", ["hashed", "wildcard"])
async def test_hashed_and_wildcard_entries_with_the_right_key_are_matched(sshd, tmp_path, entry):
    known = tmp_path / "kh"
    if entry == "hashed":
        sshd.known_hosts(known)
        assert "127.0.0.1" not in hashed(known)
    else:
        known.write_text(f"[127.0.0.*]:{sshd.port} {sshd.host_key_line}\n")
    state = (await poll(fleet_text(node(sshd, "box", known)))).states["box"]
    assert state.error is None, state.error
    assert state.snapshot is not None and state.snapshot.source == "ssh"


async def test_a_host_certificate_from_a_listed_cert_authority_is_trusted(ca_sshd, tmp_path):
    server, ca = ca_sshd
    known = tmp_path / "kh"
    known.write_text(f"@cert-authority 127.0.0.* {ca}\n")
    state = (await poll(fleet_text(node(server, "signed", known)))).states["signed"]
    assert state.error is None, state.error
    assert known.read_text() == f"@cert-authority 127.0.0.* {ca}\n"


@pytest.mark.parametrize("style", ["hashed", "plain"])
async def test_trust_on_first_use_appends_an_unlisted_host_in_the_files_own_style(
    sshd, tmp_path, style
):
    known = tmp_path / "kh"
    known.write_text(f"gpu-other.example {other_key(tmp_path)}\n")
    if style == "hashed":
        hashed(known)
    before = known.read_text()
    text = fleet_text(node(sshd, "new", known, ssh_trust_on_first_use="true"))
    state = (await poll(text)).states["new"]
    assert state.error is None, state.error
    assert known.read_text().startswith(before)
    added = known.read_text()[len(before) :]
    assert added.count("\n") == 1 and added.endswith(f" {sshd.host_key_line}\n")
    if style == "hashed":
        assert added.startswith("|1|") and "127.0.0.1" not in added
    else:
        assert added.startswith(f"[127.0.0.1]:{sshd.port} ")
    # The added line is what the next connection trusts, with first use now off.
    state = (await poll(fleet_text(node(sshd, "new", known)))).states["new"]
    assert state.error is None, state.error


async def test_a_known_hosts_line_asyncssh_cannot_read_is_an_error_naming_file_and_line(
    sshd, tmp_path
):
    known = sshd.known_hosts(tmp_path / "kh")
    known.write_text(known.read_text() + "@revoke-typo * ssh-ed25519 AAAA\n")
    state = (await poll(fleet_text(node(sshd, "box", known)))).states["box"]
    assert state.snapshot is None
    assert f"known_hosts file {known}:2: Invalid known hosts marker" in (state.error or "")


# -- output: read as it arrives, never past the cap ---------------------------------------


def running(marker: str) -> bool:
    """Whether a process with `marker` in its command line still runs on this machine
    (the "remote" host of these tests is this machine)."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


@pytest.mark.parametrize("flood", ["64 MiB then exit", "forever"])
async def test_a_host_printing_far_past_the_cap_costs_the_console_no_more_than_the_cap(
    sshd, tmp_path, flood
):
    marker = f"engineroom-flood-{flood.split()[0]}-{time.monotonic_ns()}"
    command = (
        ["sh", "-c", f"head -c {64 * 2**20} /dev/zero; : {marker}"]
        if flood != "forever"
        else ["yes", marker]
    )
    text = fleet_text(
        node(sshd, "loud", sshd.known_hosts(tmp_path / "kh"), ssh_agent_command=json.dumps(command))
    )
    fleet = parse_fleet(text)
    reader = SshReader(fleet, fleet.nodes[0], asyncio.Semaphore(1))
    reader.max_output = 2**20
    try:
        with traced() as cost, pytest.raises(SshError) as raised:
            await reader.snapshot()
    finally:
        await reader.close()
    took = cost.took()
    assert str(raised.value).startswith("ssh 127.0.0.1: `"), raised.value
    assert "printed over 1 MiB (the output cap)" in str(raised.value)
    assert cost.peak < 8 * 2**20, f"the console held {cost.peak / 2**20:.1f} MiB for a 1 MiB cap"
    assert took < 10, f"{flood}: {took:.1f} s"
    # The remote command does not go on printing to nobody.
    deadline = time.monotonic() + 10
    while running(marker) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not running(marker), "the remote command outlived its closed session"
