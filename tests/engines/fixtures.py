"""pytest fixtures that run the REAL engines once per session: vLLM (CPU) and Triton.

Load with `pytest_plugins = ["tests.engines.fixtures"]` in tests/conftest.py.

Session fixtures (started on first use, stopped at the end of the session):
  tiny_model_dir   the tiny random-weight Llama (make_tiny_model.py), built once
  vllm_server      real vLLM serving it as "tiny"             -> servers.VllmServer
  triton_repo      a model repository with the "ensemble" test double
  triton_server    real tritonserver with "ensemble" loaded    -> servers.TritonServer
Function fixture:
  engine_launcher  starts extra servers for one test (a second vLLM, a Triton to kill, a
                   crashing vLLM) and stops them all when the test ends

vLLM needs about 40 s to become ready, so when the collected tests use `vllm_server`, this
plugin starts building the model and booting vLLM right after collection, in the background,
while other tests run (WHILE_VLLM_BOOTS go first). ENGINEROOM_PRESTART_VLLM=0 turns that off.

The session servers are shared: a test must not stop them or crash them. Use
`engine_launcher` for that. Every server here is SIGKILLed at teardown (servers.kill): no
test depends on its clean exit, and a SIGTERM waits for the requests still in flight.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from tests.engines import servers
from tests.engines.servers import TritonServer, VllmServer
from tests.engines.triton_repo import write_repo

# Skip torch.compile (-O0): saves 15-25 s of startup per server on 2 cores, and nothing the
# tests look at (API, metrics, scheduling) depends on compiled kernels.
VLLM_TEST_ARGS: tuple[str, ...] = ("-O0",)
VLLM_READY_TIMEOUT_S = 180.0
TRITON_READY_TIMEOUT_S = 60.0


def _beside_the_session_vllm() -> dict[str, str]:
    # vLLM's CPU worker binds itself to core 0 unless told (its "auto" binding keeps the
    # last core for the rest), the session's too: a second one left to "auto" shares core 0
    # with it, and under traffic each runs at half speed. Told the last core, each has one.
    last = max(os.sched_getaffinity(0))
    return {"VLLM_CPU_OMP_THREADS_BIND": str(last)} if last > 0 else {}


# The env for a second vLLM that serves beside the session's `vllm_server`.
SECOND_VLLM_ENV: dict[str, str] = _beside_the_session_vllm()


class _VllmBoot:
    """Builds the tiny model and launches vLLM in a background thread; `result()` joins it."""

    def __init__(self, root: Path, second: bool = False) -> None:
        self.root = root
        self.started = time.monotonic()
        self.model_dir: Path | None = None
        self.launched: tuple[subprocess.Popen[bytes], int, Path] | None = None
        # The data-plane tests' "b" (tests/support/dataplanes.second_vllm), launched beside
        # it where the session has them: its boot costs the tests run meanwhile, not a wait.
        self.second = second
        self.second_launched: tuple[subprocess.Popen[bytes], int, Path] | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="vllm-boot", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.model_dir = servers.make_tiny_model(self.root / "tiny-model")
            self.launched = servers.launch_vllm(
                self.model_dir, self.root / "vllm", extra_args=VLLM_TEST_ARGS
            )
            if self.second:
                self.second_launched = servers.launch_vllm(
                    self.model_dir, self.root / "vllm-b", extra_env=SECOND_VLLM_ENV,
                    extra_args=VLLM_TEST_ARGS,
                )  # fmt: skip
        except BaseException as exc:  # re-raised in the test that asks for it
            self.error = exc

    def join(self) -> None:
        self._thread.join(timeout=VLLM_READY_TIMEOUT_S)
        if self.error is not None:
            raise self.error
        if self._thread.is_alive():
            raise servers.EngineStartError("building the tiny model did not finish in time")

    def stop(self) -> None:
        self._thread.join(timeout=VLLM_READY_TIMEOUT_S)
        for launched in (self.launched, self.second_launched):
            if launched is not None:
                servers.kill(launched[0])

    def take_second(self) -> tuple[subprocess.Popen[bytes], int, Path] | None:
        """The "b" launched at the session's start, once (None: none, or already taken)."""
        self._thread.join(timeout=VLLM_READY_TIMEOUT_S)
        launched, self.second_launched = self.second_launched, None
        return launched


def take_second_vllm() -> tuple[subprocess.Popen[bytes], int, Path] | None:
    """tests/support/dataplanes.second_vllm's first "b", when the session launched it."""
    return _boot.take_second() if _boot is not None else None


_boot: _VllmBoot | None = None

# Run first, while the session's vLLM boots in the background: tests that need no engine
# and hold nothing to a deadline that a boot beside them could move. Before, the first test
# (tests/engines/test_harness.py) asked for vllm_server at once and waited out the whole
# boot, 27 to 30 s of every run.
WHILE_VLLM_BOOTS = "tests/test_agent_hardening.py::"
# The modules whose tests share the data planes' "b" (second_vllm): where the session has
# one, "b" boots beside the session's vLLM, each on a core of its own (SECOND_VLLM_ENV).
SECOND_VLLM_USERS = (
    "tests/test_dataplane_contract.py::",
    "tests/test_dataplane_haproxy.py::",
    "tests/test_dataplane_router.py::",
    "tests/test_diagnoses_gateway.py::",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = [item for item in items if item.nodeid.startswith(WHILE_VLLM_BOOTS)]
    # Last: the tests that kill the data planes' second vLLM ("b", second_vllm), so that it
    # boots once for every module that shares it, and once more between the two killers
    # (each needs the other engine alive). In module order, each module's killer was
    # followed by a boot of "b" for the next module: 60 s of every run.
    last = [item for item in items if item.get_closest_marker("kills_second_vllm")]
    moved = {id(item) for item in first + last}
    items[:] = first + [item for item in items if id(item) not in moved] + last


def pytest_collection_finish(session: pytest.Session) -> None:
    global _boot
    config = session.config
    if (
        _boot is not None
        or config.option.collectonly
        or os.environ.get("ENGINEROOM_PRESTART_VLLM", "1") == "0"
        or not any("vllm_server" in getattr(i, "fixturenames", ()) for i in session.items)
        or not servers.vllm_python().exists()  # the fixture reports that, with what to do
    ):
        return
    second = any(i.nodeid.startswith(SECOND_VLLM_USERS) for i in session.items)
    _boot = _VllmBoot(config._tmp_path_factory.mktemp("vllm-session"), second)  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Normally vllm_server's teardown has stopped it; this covers interrupts and no-shows.
    if _boot is not None:
        _boot.stop()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama, built once per session with the vLLM venv's python."""
    if _boot is not None:
        _boot.join()
        assert _boot.model_dir is not None
        return _boot.model_dir
    return servers.make_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def vllm_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """Real vLLM serving the tiny model as "tiny" on 127.0.0.1; shared by the session."""
    if _boot is not None and _boot.launched is not None:
        process, port, log_path = _boot.launched
        started = _boot.started
    else:
        started = time.monotonic()
        process, port, log_path = servers.launch_vllm(
            tiny_model_dir, tmp_path_factory.mktemp("vllm"), extra_args=VLLM_TEST_ARGS
        )
    try:
        server = servers.wait_vllm(
            process, port, log_path, tiny_model_dir, "tiny", VLLM_READY_TIMEOUT_S, started
        )
        yield server
    finally:
        servers.kill(process)


@pytest.fixture(scope="session")
def triton_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository holding "ensemble", the TensorRT-LLM test double."""
    return write_repo(tmp_path_factory.mktemp("triton-repo"))


@pytest.fixture(scope="session")
def triton_server(
    triton_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonServer]:
    """Real tritonserver 2.51.0 with "ensemble" loaded on 127.0.0.1; shared by the session."""
    server = servers.start_triton(
        triton_repo, tmp_path_factory.mktemp("triton"), timeout=TRITON_READY_TIMEOUT_S
    )
    try:
        yield server
    finally:
        servers.kill(server)


class EngineLauncher:
    """Starts servers for one test and stops every one of them at teardown."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.running: list[VllmServer | TritonServer] = []

    def vllm(
        self,
        model_dir: Path,
        served_name: str = "tiny",
        port: int | None = None,
        extra_env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = VLLM_TEST_ARGS,
    ) -> VllmServer:
        server = servers.start_vllm(
            model_dir,
            self.workdir / "vllm",
            port=port,
            served_name=served_name,
            extra_env=extra_env,
            extra_args=extra_args,
            timeout=VLLM_READY_TIMEOUT_S,
        )
        self.running.append(server)
        return server

    def crashing_model(self) -> Path:
        """A tiny model that vLLM loads but dies on at the first request (head_dim 16)."""
        out = self.workdir / "crashing-model"
        if not (out / "config.json").exists():
            servers.make_tiny_model(out, crashing=True)
        return out

    def triton(
        self,
        repo: Path | None = None,
        model: str = "ensemble",
        extra_args: Sequence[str] = (),
        token_delay_ms: float = 5.0,
    ) -> TritonServer:
        if repo is None:
            repo_dir = self.workdir / f"triton-repo-{len(self.running)}"
            repo = write_repo(repo_dir, model, token_delay_ms)
        server = servers.start_triton(
            repo,
            self.workdir / "triton",
            model=model,
            extra_args=extra_args,
            timeout=TRITON_READY_TIMEOUT_S,
        )
        self.running.append(server)
        return server

    def stop_all(self) -> None:
        while self.running:
            servers.kill(self.running.pop())


@pytest.fixture
def engine_launcher(tmp_path: Path) -> Iterator[EngineLauncher]:
    """Extra real servers for one test; all stopped when the test ends."""
    launcher = EngineLauncher(tmp_path)
    try:
        yield launcher
    finally:
        launcher.stop_all()
