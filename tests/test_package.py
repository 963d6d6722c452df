"""The wheel stands on its own: installed in a fresh venv, far from the checkout, it runs.

An operator installs engineroom from a wheel, not from this source tree. These stories
build the wheel, install it with its dependencies from PyPI into a venv under tmp_path,
and from a directory outside the checkout run `engineroom --help`, the demo, `check`
against it and the demo's rebuild drill (whose TensorRT-LLM TEST DOUBLE must ship in the
package). Slow (a minute or two), so it carries the `package` mark; `make test` runs
it, `make test-quick` does not.

The dependencies are kept between runs in a wheelhouse under the user's cache directory
(WHEELHOUSE): pip's own HTTP cache keeps nothing here (the index's answers carry no caching
headers), so every run downloaded 47 MB again. A run installs from the wheelhouse alone and
fills it from the indexes only when that fails (the first run, or a dependency changed),
and skips bytecode compilation. Build and install, 2 cores: 8 s warm, 26 s cold (a plain
`pip install` took 87 s under load, a third of it compiling).
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.engines.servers import wait_until

pytestmark = [pytest.mark.package, pytest.mark.timeout(900)]

TOKEN = "package-test-demo-token"
PIP_TIMEOUT_S = 600  # a cold wheelhouse downloads textual, fastapi, tritonclient, ...
CACHE_HOME = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
WHEELHOUSE = CACHE_HOME / "engineroom" / "test-wheelhouse"


def source_files() -> list[Path]:
    """What a build sees: tracked and not-ignored files (no .venv, caches, egg-info)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout.split(b"\0")
    return [Path(name.decode()) for name in listed if name and (ROOT / name.decode()).is_file()]


def clean_env(venv: Path) -> dict[str, str]:
    """The installed venv first on PATH, nothing pointing back into the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env = {k: v for k, v in env.items() if not k.startswith(("ENGINEROOM_", "PIP_NO_CACHE"))}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    return env


def install_with_dependencies(pip: list[str], venv: Path, wheel: Path, cwd: Path) -> None:
    """`wheel` and its dependencies into `venv`: from the wheelhouse, else from the indexes."""
    offline = [
        *pip,
        *("--python", str(venv / "bin" / "python"), "install", "-q", "--no-compile"),
        *("--no-index", "--find-links", str(WHEELHOUSE), str(wheel)),
    ]
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    if subprocess.run(offline, capture_output=True, timeout=PIP_TIMEOUT_S, cwd=cwd).returncode:
        # A cold wheelhouse, or one without a dependency the wheel now wants: fill it.
        download = [*pip, "download", "-q", "--dest", str(WHEELHOUSE), str(wheel)]
        subprocess.run(download, check=True, timeout=PIP_TIMEOUT_S, cwd=cwd)
        for copied in WHEELHOUSE.glob("engineroom-*.whl"):  # the wheel under test, not a dep
            copied.unlink()
        subprocess.run(offline, check=True, timeout=PIP_TIMEOUT_S, cwd=cwd)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(venv, an empty working directory): the wheel installed outside the checkout."""
    root = tmp_path_factory.mktemp("package")
    # Build from a copy: an in-tree build would write build/ into a checkout others share.
    source = root / "source"
    for name in source_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    wheels = root / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "wheel", "-q", "--no-deps", "--wheel-dir", str(wheels), str(source)],
        check=True,
        timeout=PIP_TIMEOUT_S,
        cwd=root,
    )
    (wheel,) = wheels.glob("engineroom-*.whl")
    venv = root / "venv"
    # No ensurepip in the new venv (seconds saved): this pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    install_with_dependencies(pip, venv, wheel, cwd=root)
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    yield venv, elsewhere


def engineroom(
    installed: tuple[Path, Path], *argv: str, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    venv, cwd = installed
    return subprocess.run(
        [str(venv / "bin" / "engineroom"), *argv],
        cwd=cwd,
        env={**clean_env(venv), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_wheel_carries_the_code_it_runs(installed):
    venv, cwd = installed
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import console, plugins; print(console.__file__)"],
        cwd=cwd,
        env=clean_env(venv),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(venv), where  # not this checkout's console/
    helped = engineroom(installed, "--help")
    assert helped.returncode == 0, helped.stderr
    assert "demo" in helped.stdout and "drill" in helped.stdout


def test_an_installed_demo_is_checked_and_runs_its_drill(installed):
    venv, cwd = installed
    err = cwd / "demo.err"
    with err.open("wb") as stderr:
        demo = subprocess.Popen(
            [str(venv / "bin" / "engineroom"), "demo", "--no-tui"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=cwd,
            env={**clean_env(venv), "ENGINEROOM_DEMO_TOKEN": TOKEN},
            start_new_session=True,
        )
    try:
        assert demo.stdout is not None
        ready, _, _ = select.select([demo.stdout], [], [], 120)
        assert ready, f"no first line from the demo within 120 s: {err.read_text()[-2000:]}"
        first = demo.stdout.readline().decode()
        assert first.startswith("fleet: "), (first, err.read_text()[-2000:])
        fleet = first.removeprefix("fleet: ").strip()
        token = {"ENGINEROOM_DEMO_TOKEN": TOKEN}

        def all_up() -> dict | None:
            checked = engineroom(installed, "check", "--fleet", fleet, "--json", **token)
            assert checked.returncode in (0, 1), checked.stderr  # 2: no node answered
            summary = json.loads(checked.stdout)["summary"]
            return summary if summary["nodes_up"] == 4 else None

        wait_until(all_up, 90, interval=1.0, what="the installed demo's 4 nodes up in check")
        table = engineroom(installed, "check", "--fleet", fleet, **token)
        assert table.returncode in (0, 1), table.stderr

        listed = engineroom(installed, "drill", "list", "--fleet", fleet, "--json", **token)
        assert listed.returncode == 0, listed.stderr
        names = [d["name"] for d in json.loads(listed.stdout)["drills"]]
        assert len(names) == 1, names
        drill = engineroom(
            installed, "drill", "run", names[0], "--wait", "--fleet", fleet, timeout=300, **token
        )
        assert drill.returncode == 0, drill.stdout[-3000:] + drill.stderr[-3000:]
        assert re.search(r"^job \w+: succeeded after", drill.stdout, re.M), drill.stdout[-3000:]
    finally:
        os.killpg(demo.pid, signal.SIGTERM)
        try:
            demo.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(timeout=10)
