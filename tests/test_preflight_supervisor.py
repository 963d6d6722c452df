"""The preflight's GPU check over NVML readings, and the supervisor's SIGKILL fallback.

GPU readings are wire objects as the agent builds them from NVML; these machines have no
GPU. The SIGKILL test runs a real process that ignores SIGTERM, standing in for a hung
engine (a stand-in, not vLLM: the point is the supervisor's escalation).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from console.agent.jobs import preflight
from console.agent.jobs.launch import vllm_launch
from console.agent.supervise import processes
from console.agent.supervise.supervisor import Supervisor, group_pids
from console.core.config.load import parse_fleet
from console.core.wire import Gpu, GpuProcess

GIB = 2**30
FLEET = parse_fleet("""
[fleet]
name = "t"
[[nodes]]
name = "n"
agent = "http://127.0.0.1:9410"
[profiles.p]
engine = "vllm"
node = "n"
model = "/m"
served_model_name = "m"
port = 8001
gpus = [0, 1]
tensor_parallel_size = 2
args = { gpu_memory_utilization = 0.5 }
stop_grace_s = 1
""")
PROFILE = FLEET.profiles["p"]


def gpu(index: int, used_gib: float, processes: list[GpuProcess] | None = None) -> Gpu:
    return Gpu(
        index=index,
        memory_total_bytes=int(80 * GIB),
        memory_used_bytes=int(used_gib * GIB),
        processes=[] if processes is None else processes,
    )


def test_idle_gpus_with_room_pass():
    check = preflight.gpu_check((0, 1), PROFILE, [gpu(0, 0.5), gpu(1, 30)], "ok")
    assert check.ok, check.detail
    assert check.detail == "GPU 0 idle, 79.5 GiB free; GPU 1 idle, 50.0 GiB free"


def test_a_gpu_held_by_another_engine_or_short_of_memory_fails_naming_it():
    busy = gpu(0, 70, [GpuProcess(pid=4242, engine_id="triton-8000", used_memory_bytes=70 * GIB)])
    check = preflight.gpu_check((0, 1), PROFILE, [busy, gpu(1, 45)], "ok")
    assert not check.ok
    assert "GPU 0 is in use by pid 4242 (triton-8000)" in check.detail
    assert "GPU 1 has 35.0 GiB free, the launch needs 40.0 GiB (gpu_memory_utilization 0.5)" in (
        check.detail
    )


def test_missing_gpus_and_no_nvml_fail_clearly():
    check = preflight.gpu_check((0, 7), PROFILE, [gpu(0, 0)], "ok")
    assert "GPU 7 does not exist (this node has [0])" in check.detail
    check = preflight.gpu_check((0,), PROFILE, [], "no NVIDIA driver (NVML library not found)")
    assert check.detail == (
        "GPUs [0] requested, but NVML reports: no NVIDIA driver (NVML library not found)"
    )


async def test_an_engine_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path):
    supervisor = Supervisor(tmp_path, log_max_bytes=65536, log_keep=1)
    launch = vllm_launch(PROFILE)
    stubborn = (
        sys.executable,
        "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ignoring SIGTERM', flush=True); time.sleep(120)",
    )
    launch = type(launch)(stubborn, {}, launch.port, launch.gpus)
    managed = supervisor.spawn("vllm-8001", "vllm", "p", {}, launch, "http://x", "m", "job1")
    deadline = time.monotonic() + 10
    # Its handler is in place once it says so (a SIGTERM before that would kill it).
    while "ignoring SIGTERM" not in managed.log_path.read_text():
        assert time.monotonic() < deadline, "the stand-in never started"
        time.sleep(0.05)
    assert managed.alive()
    how = await supervisor.stop(managed, grace_s=1.0)
    assert how == "did not exit within 1 s of SIGTERM: killed (SIGKILL)"
    assert not managed.alive() and group_pids(managed.pgid) == []
    assert "ignoring SIGTERM" in managed.log_path.read_text()


def test_engines_and_drill_steps_never_see_the_tokens(monkeypatch, tmp_path):
    from console.agent.api.auth import child_env
    from console.agent.jobs.launch import Launch
    from console.agent.supervise.supervisor import Supervisor
    from console.core.config.load import parse_fleet

    fleet = parse_fleet(
        '[fleet]\nname = "t"\n[agent]\noperator_token_env = "MY_OPS"\n'
        '[[nodes]]\nname = "a"\nagent = "http://127.0.0.1:1"\ntoken_env = "NODE_TOKEN"\n'
    )
    for name in ("MY_OPS", "NODE_TOKEN", "ENGINEROOM_VIEWER_TOKEN", "ENGINEROOM_ADMIN_TOKEN"):
        monkeypatch.setenv(name, "secret-" + name)
    monkeypatch.setenv("HARMLESS", "kept")
    env = child_env(fleet, {"EXTRA": "1"})
    assert not [k for k in env if env[k].startswith("secret-")]
    assert env["HARMLESS"] == "kept" and env["EXTRA"] == "1"
    # An engine the supervisor starts: its environment, printed by the engine itself.
    from console.agent.api.auth import secret_env_names

    sup = Supervisor(tmp_path, 1 << 20, 1, hidden=secret_env_names(fleet))
    code = "import os; print(sorted(k for k in os.environ if 'secret' in os.environ[k]))"
    launch = Launch(argv=(sys.executable, "-c", code), env={}, port=1, gpus=())
    managed = sup.spawn("e", "vllm", "p", {}, launch, "http://x", "m", "job")
    managed.process.wait(10)  # type: ignore[union-attr]
    printed = managed.log_path.read_text().splitlines()[-1]
    assert printed == "[]", printed  # no variable holding a token reached the engine


def test_a_log_tail_reads_only_the_end_and_never_shows_a_cut_line(tmp_path: Path):
    log = tmp_path / "engine.log"
    log.write_text("".join(f"line {i} " + "x" * 90 + "\n" for i in range(2000)))  # ~200 KB
    shown = processes.tail(log, lines=5000, max_bytes=1000)
    assert shown[-1].startswith("line 1999 ")
    assert len(shown) < 11 and all(line.startswith("line ") for line in shown)  # no cut line
    assert processes.tail(log, lines=3)[0].startswith("line 1997 ")
    assert processes.tail(tmp_path / "absent.log") == []


def test_new_lines_returns_whole_lines_only_and_starts_over_after_a_rotation(tmp_path: Path):
    log = tmp_path / "engine.log"
    log.write_text("one\ntw")
    offset, lines = processes.new_lines(log, 0)
    assert (offset, lines) == (4, ["one"])  # "tw" waits for its newline
    with log.open("a") as f:
        f.write("o\n")
    offset, lines = processes.new_lines(log, offset)
    assert lines == ["two"]
    log.write_text("after\n")  # rotated: shorter than the offset
    assert processes.new_lines(log, offset) == (6, ["after"])
    big = "y" * (processes.READ_MAX_BYTES + 10) + "\n"
    log.write_text("a\n" + big)
    offset, lines = processes.new_lines(log, 0)
    assert lines == ["a"] and offset == 2  # one read is bounded; the rest comes next time
    offset, lines = processes.new_lines(log, offset)  # a line longer than a read: in pieces
    assert offset == 2 + processes.READ_MAX_BYTES and lines == ["y" * processes.READ_MAX_BYTES]
    assert processes.new_lines(log, offset) == (len(big) + 2, ["y" * 10])
