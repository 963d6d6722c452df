"""A host laid out as deploy/README.md says, under a test's folder, and a unit's service
started on it as systemd would start it (tests/unit_sandbox.py applies the sandbox).

`Layout.build` runs the `install` lines of the docs' code blocks (owner `engineroom` is
the test's unprivileged SERVICE_USER); `sandbox_of` reads a unit in deploy/ into the
sandbox's spec and its command line, every path the unit names given under the layout.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import httpx

from tests.conftest import ROOT
from tests.engines.servers import log_tail, wait_until
from tests.unit_sandbox import HOMES, Sandbox, address_families, directives, syscall_filter, under

DEPLOY = ROOT / "deploy"
GATEWAY_UNIT, AGENT_UNIT = "engineroom-gateway.service", "engineroom-agent.service"
INSTALLED_AT = "/opt/engineroom/bin/engineroom"  # the units' ExecStart, as shipped
SERVICE_USER = "nobody"  # stands in for the units' `engineroom`: unprivileged, in passwd


@cache
def why_no_sandbox() -> str | None:
    """None where the sandbox can run here, else why not."""
    if os.geteuid() != 0:
        return "the sandbox takes a mount namespace and drops to another uid: run as root"
    if shutil.which("systemd-analyze") is None:
        return "systemd-analyze is missing: `make systemd` installs Debian's systemd package"
    try:
        ctypes.CDLL("libseccomp.so.2")
    except OSError:
        return "libseccomp.so.2 is missing (Debian's libseccomp2)"
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        return "no mount namespace here (unshare --mount fails)"
    return None


# -- the host, as deploy/README.md builds it ---------------------------------------------------


def install_lines(doc: Path) -> list[list[str]]:
    """The `install ...` command lines in `doc`'s code blocks, as words."""
    lines, in_code = [], False
    for line in doc.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif in_code and line.startswith("install "):
            lines.append(shlex.split(line, comments=True))
    return lines


class Layout:
    """The host's folders under the test's: `at("/etc/engineroom")` is where it lies."""

    def __init__(self, root: Path) -> None:
        self.root = root
        pw = pwd.getpwnam(SERVICE_USER)
        self.uid, self.gid = pw.pw_uid, pw.pw_gid
        root.mkdir(mode=0o755)

    def at(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def _owner(self, user: str | None, group: str | None) -> tuple[int, int]:
        def one(name: str | None, ours: int) -> int:
            if name in (None, "root"):
                return 0
            assert name == "engineroom", f"install line names the owner {name!r}"
            return ours

        return one(user, self.uid), one(group, self.gid)

    def install(self, argv: list[str], files: dict[str, str]) -> None:
        """install(1), as far as the docs use it: -d, -m, -o, -g; SRC DEST[/]."""
        assert argv[0] == "install", argv
        folders, mode, user, group, paths = False, None, None, None, []
        words = iter(argv[1:])
        for word in words:
            if word == "-d":
                folders = True
            elif word in ("-m", "-o", "-g"):
                value = next(words)
                mode, user, group = (
                    (int(value, 8), user, group)
                    if word == "-m"
                    else (mode, value, group)
                    if word == "-o"
                    else (mode, user, value)
                )
            else:
                paths.append(word)
        uid, gid = self._owner(user, group)
        mode = 0o755 if mode is None else mode
        if folders:
            targets = [self.at(p) for p in paths]
            for target in targets:
                target.mkdir(parents=True, exist_ok=True)
        else:
            source, dest = paths
            target = self.at(dest + Path(source).name if dest.endswith("/") else dest)
            text = "" if source == "/dev/null" else files[Path(source).name]
            target.write_text(text)
            targets = [target]
        for target in targets:
            os.chown(target, uid, gid)
            os.chmod(target, mode)

    def build(self, docs: list[Path], files: dict[str, str]) -> None:
        for doc in docs:
            for argv in install_lines(doc):
                self.install(argv, files)


# -- a unit's service, started as systemd would --------------------------------------------


def engineroom_here() -> Path:
    beside = Path(sys.executable).with_name("engineroom")
    assert beside.exists(), f"{beside}: the venv's engineroom (pip install -e .)"
    return beside


def sandbox_of(unit: str, layout: Layout, env: dict[str, str]) -> tuple[Sandbox, list[str]]:
    """The unit's sandbox and command line, its paths given under `layout`."""
    found = directives((DEPLOY / unit).read_text())
    words = shlex.split(found["ExecStart"][-1])
    assert words[0] == INSTALLED_AT, f"{unit}: ExecStart no longer runs {INSTALLED_AT}"
    argv = [str(engineroom_here())]
    argv += [str(layout.at(w)) if w.startswith("/") else w for w in words[1:]]
    state = [f"/var/lib/{name}" for v in found.get("StateDirectory", []) for name in v.split()]
    state_mode = int((found.get("StateDirectoryMode") or ["0755"])[-1], 8)
    for folder in state:  # systemd makes it, the unit's user's; its parents stay root's
        layout.at(folder).mkdir(parents=True, exist_ok=True)
        os.chown(layout.at(folder), layout.uid, layout.gid)
        os.chmod(layout.at(folder), state_mode)
    writable = [p for v in found.get("ReadWritePaths", []) for p in v.split()] + state
    for path in writable:
        assert layout.at(path).is_dir(), (
            f"{unit}: ReadWritePaths={path}: the documented layout makes no such folder "
            "(systemd would not start the unit)"
        )
    unit_env = {}
    for value in found.get("Environment", []):
        key, _, val = value.partition("=")
        val = val.replace("%S", "/var/lib")
        unit_env[key] = str(layout.at(val)) if val.startswith("/") else val
    # The Python installation and the checkout stay where they are over the hidden homes and
    # the private /tmp: a real install lives in /opt or /usr, a test's checkout may be in
    # either (CI's clone under /tmp must not leave the unit without its interpreter).
    hidden = (*HOMES, "/tmp", "/var/tmp")
    found_here = {p for p in (sys.base_prefix, sys.prefix, str(ROOT)) if under(p, hidden)}
    # Only the outermost: a folder bound over its parent's bind is hidden under it, and
    # remounting it read-only then fails (the venv inside the checkout, in either order).
    python_homes = sorted(
        p for p in found_here if not any(p != q and under(p, [q]) for q in found_here)
    )
    box = Sandbox(
        uid=layout.uid,
        gid=layout.gid,
        umask=int((found.get("UMask") or ["0022"])[-1], 8),
        nofile=int(found["LimitNOFILE"][-1]) if "LimitNOFILE" in found else None,
        no_new_privileges=found.get("NoNewPrivileges") == ["yes"],
        read_only_system=found.get("ProtectSystem") == ["strict"],
        writable=[str(layout.at(p)) for p in writable],
        private_tmp=found.get("PrivateTmp") == ["yes"],
        hide_homes=found.get("ProtectHome", ["no"])[-1] in ("yes", "read-only", "tmpfs"),
        keep=[str(layout.root), *python_homes],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", **unit_env, **env},
        syscalls=syscall_filter(found),
        families=address_families(found),
        memory_deny_write_execute=found.get("MemoryDenyWriteExecute") == ["yes"],
    )
    return box, argv


def start_in_sandbox(
    box: Sandbox, argv: list[str], log: Path, denied_kills: bool = True
) -> subprocess.Popen[bytes]:
    if denied_kills and box.syscalls is not None:
        box.syscalls.errno = None
    spec = box.spec(log.with_suffix(".spec.json"))
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "unit_sandbox.py"), str(spec), "--", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def how_it_ended(process: subprocess.Popen[bytes], log: Path) -> str:
    """What a service that exited said, and the call its filter denied, if that killed it."""
    said = f"exited {process.returncode}:\n{log_tail(log)}"
    if process.returncode == -signal.SIGSYS:
        call = denied_call(process.pid)
        said = f"killed by its system-call filter ({call or 'see dmesg'}); {said}"
    return said


def denied_call(pid: int) -> str | None:
    """The system call the kernel logged for `pid`'s seccomp kill, by name."""
    kernel = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    found = re.findall(rf"type=1326 .* pid={pid} .* syscall=(\d+)", kernel)
    if not found:
        return None
    lib = ctypes.CDLL("libseccomp.so.2")
    lib.seccomp_syscall_resolve_num_arch.restype = ctypes.c_char_p
    name = lib.seccomp_syscall_resolve_num_arch(0, int(found[-1]))  # 0: the native arch
    return name.decode() if name else f"system call {found[-1]}"


@dataclass
class Service:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def alive(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"{self.url}: {how_it_ended(self.process, self.log)}")
        return True

    def up(self) -> Service:
        def answers() -> bool:
            self.alive()
            try:
                return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(answers, 60, what=f"{self.url}/healthz")
        return self
