"""Run a command the way systemd runs a unit's service, as far as a test can: the unit's
system-call filter (libseccomp, through ctypes), its user, umask and open-file limit, and
its file system (ProtectSystem=strict, ReadWritePaths=, StateDirectory=, PrivateTmp=,
ProtectHome=) in a mount namespace of its own. tests/test_deploy_units.py uses it.

    python tests/unit_sandbox.py SPEC.json -- ARGV...      (as root)

SPEC is what `Sandbox.spec()` wrote: this script takes a mount namespace, mounts, drops to
the unit's uid, loads the filters and execs ARGV, so the filtered process is the service
itself, as under systemd. Where the unit names a path (/etc/engineroom/..., /var/lib/...),
the test gives the same path under its own folder (tests/deploy_host.py).

What is applied, in systemd's terms:
- SystemCallFilter= (groups expanded by `systemd-analyze syscall-filter`, so the sets are
  the installed systemd's), SystemCallErrorNumber= (else a denied call kills the process),
  SystemCallArchitectures=native (libseccomp's filter takes only the native ABI);
- RestrictAddressFamilies= and MemoryDenyWriteExecute=, which systemd also builds from
  seccomp filters, each loaded as a filter of its own as systemd does;
- User= and Group= (the test's uid), UMask=, LimitNOFILE= (at most this machine's hard
  limit: raising it takes CAP_SYS_RESOURCE), NoNewPrivileges=, no capability at all
  (CapabilityBoundingSet=: a non-root uid keeps none across exec);
- ProtectSystem=strict: every mount read-only but /dev, /proc, /sys and the writable ones;
  ReadWritePaths= and StateDirectory= writable; PrivateTmp=: a fresh /tmp and /var/tmp;
  ProtectHome=: the homes hidden (read-only too: stricter than systemd), except the Python
  installation the test runs, where it lives in one (pyenv in /root).
Not applied: PrivateDevices=, ProtectProc=, ProtectKernel*=, ProtectClock=,
ProtectControlGroups=, RestrictNamespaces=, RestrictRealtime=, LockPersonality=, and
systemd's ENOSYS for calls newer than its own list (killed here instead: stricter).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

# -- what a unit file says -------------------------------------------------------------------


def directives(text: str) -> dict[str, list[str]]:
    """Each `Key=value` of a unit file, in order, comments and section lines left out."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


@cache
def syscall_group(name: str) -> frozenset[str]:
    """The system calls of `@name` (nested groups expanded), as the installed systemd says."""
    out = subprocess.run(
        ["systemd-analyze", "syscall-filter", "--no-pager", name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        raise ValueError(f"systemd-analyze syscall-filter {name}: {out.stderr.strip()}")
    calls: set[str] = set()
    for line in out.stdout.splitlines()[1:]:  # the first line is the group's name
        entry = line.strip()
        if entry and not entry.startswith("#"):
            calls |= syscall_group(entry) if entry.startswith("@") else {entry}
    return frozenset(calls)


def _expand(name: str) -> frozenset[str]:
    return syscall_group(name) if name.startswith("@") else frozenset({name})


@dataclass
class SyscallFilter:
    allow_list: bool  # True: only `names` run; False: `names` are denied
    names: list[str]
    errno: int | None  # SystemCallErrorNumber=; None: a denied call kills the process


def syscall_filter(found: dict[str, list[str]]) -> SyscallFilter | None:
    """The unit's SystemCallFilter= lines as systemd merges them: the first line decides
    whether it is an allow list (then @default is always in it) or a deny list; a later
    line adds to that list, or removes from it when it is of the other kind (`~`)."""
    allow: bool | None = None
    names: set[str] = set()
    for value in found.get("SystemCallFilter", []):
        if not value:
            allow, names = None, set()
            continue
        invert = value.startswith("~")
        if allow is None:
            allow = not invert
            names = set(syscall_group("@default")) if allow else set()
        for word in value.lstrip("~").split():
            if ":" in word:
                raise ValueError(f"SystemCallFilter={value}: a per-call errno is not emulated")
            if invert != allow:
                names |= _expand(word)
            else:
                names -= _expand(word)
    if allow is None:
        return None
    number = (found.get("SystemCallErrorNumber") or ["kill"])[-1]
    return SyscallFilter(allow, sorted(names), None if number == "kill" else errno_of(number))


def errno_of(name: str) -> int:
    value = getattr(errno, name, None)
    if not isinstance(value, int):
        raise ValueError(f"SystemCallErrorNumber={name}: not an errno name")
    return value


def address_families(found: dict[str, list[str]]) -> list[int] | None:
    """RestrictAddressFamilies= as numbers (an allow list); None when the unit sets none."""
    values = found.get("RestrictAddressFamilies")
    if not values:
        return None
    if values[-1].startswith("~"):
        raise ValueError("RestrictAddressFamilies=~...: a deny list is not emulated")
    return sorted(int(getattr(socket, name)) for name in values[-1].split())


# -- the spec a test writes and this script applies --------------------------------------------


@dataclass
class Sandbox:
    uid: int
    gid: int
    umask: int
    nofile: int | None
    no_new_privileges: bool
    read_only_system: bool  # ProtectSystem=strict
    writable: list[str]  # ReadWritePaths= and StateDirectory=, where the test put them
    private_tmp: bool
    hide_homes: bool
    keep: list[str]  # folders that stay at their paths whatever is mounted over them
    env: dict[str, str]
    syscalls: SyscallFilter | None = None
    families: list[int] | None = None
    memory_deny_write_execute: bool = False
    workdir: str = "/"

    def spec(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self)))
        return path


def load_spec(path: str) -> Sandbox:
    data = json.loads(Path(path).read_text())
    calls = data.pop("syscalls")
    return Sandbox(**data, syscalls=SyscallFilter(**calls) if calls else None)


# -- applying it (as root, in the process that then becomes the service) ---------------------

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME = 16384, 1 << 18, 1 << 21
KEPT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME | MS_RELATIME
PR_SET_NO_NEW_PRIVS = 38
API_FILE_SYSTEMS = ("/proc", "/sys", "/dev")
HOMES = ("/root", "/home", "/run/user")


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source} {target}",
    )


def mount_points() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        raw = line.split()[4]
        # mountinfo escapes space, tab, newline and backslash as \ooo
        points.append(
            raw.encode().decode("unicode_escape").encode("latin-1").decode(errors="replace")
        )
    return points


def under(path: str, folders: list[str] | tuple[str, ...]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def apply_file_system(box: Sandbox) -> None:
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host
    kept = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in box.keep}
    fresh = []
    if box.private_tmp:
        fresh += [t for t in ("/tmp", "/var/tmp") if os.path.isdir(t)]
        for tmp in fresh:
            mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    if box.hide_homes:
        for home in HOMES:
            if os.path.isdir(home):
                mount("tmpfs", home, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for path, fd in kept.items():  # back at their paths, over what was just mounted
        os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
    if not box.read_only_system:
        return
    for path in box.writable:
        mount(path, path, None, MS_BIND | MS_REC)
    for point in mount_points():
        if under(point, API_FILE_SYSTEMS) or point in fresh or under(point, box.writable):
            continue
        kept_flags = os.statvfs(point).f_flag & KEPT_FLAGS
        mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept_flags)


def drop_privileges(box: Sandbox) -> None:
    if box.nofile is not None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        limit = box.nofile if hard == resource.RLIM_INFINITY else min(box.nofile, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    os.umask(box.umask)
    os.setgroups([])
    os.setgid(box.gid)
    os.setuid(box.uid)
    if box.no_new_privileges:
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


# libseccomp (seccomp.h)
SCMP_ACT_KILL_PROCESS = 0x80000000
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ, SCMP_CMP_GE, SCMP_CMP_MASKED_EQ = 4, 5, 7
AF_MAX = 46  # Linux 6.x: AF_MCTP (45) is the last
PROT_WRITE, PROT_EXEC, SHM_EXEC = 0x2, 0x4, 0o100000


def scmp_act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


class Filter:
    """One libseccomp filter context, loaded as a filter of its own (the kernel runs every
    loaded filter and the strictest answer wins, which is how systemd stacks its)."""

    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_exact_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(ArgCmp),
    ]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]

    def __init__(self, default: int) -> None:
        self.default = default
        self.ctx = self.lib.seccomp_init(default)
        if not self.ctx:
            raise OSError("seccomp_init failed")

    def rule(self, action: int, name: str, *args: tuple[int, int, int, int]) -> None:
        number = self.lib.seccomp_syscall_resolve_name(name.encode())
        if number == -1 or action == self.default:  # unknown to libseccomp: systemd skips it
            return
        cmps = (ArgCmp * max(len(args), 1))(*(ArgCmp(*a) for a in args))
        result = self.lib.seccomp_rule_add_exact_array(self.ctx, action, number, len(args), cmps)
        if result not in (0, -errno.EDOM):  # EDOM: not a call of this architecture
            raise OSError(-result, f"seccomp rule for {name}: {os.strerror(-result)}")

    def load(self) -> None:
        result = self.lib.seccomp_load(self.ctx)
        self.lib.seccomp_release(self.ctx)
        if result != 0:
            raise OSError(-result, f"seccomp_load: {os.strerror(-result)}")


def apply_filters(box: Sandbox) -> None:
    """RestrictAddressFamilies=, MemoryDenyWriteExecute=, then SystemCallFilter= last, as
    systemd does (loading a filter is a system call the last one may deny)."""
    if box.families is not None:
        families = Filter(SCMP_ACT_ALLOW)
        refused = scmp_act_errno(errno.EAFNOSUPPORT)
        for family in range(AF_MAX):
            if family not in box.families:
                families.rule(refused, "socket", (0, SCMP_CMP_EQ, family, 0))
        families.rule(refused, "socket", (0, SCMP_CMP_GE, AF_MAX, 0))
        families.load()
    if box.memory_deny_write_execute:
        wx = Filter(SCMP_ACT_ALLOW)
        refused = scmp_act_errno(errno.EPERM)
        both = PROT_WRITE | PROT_EXEC
        wx.rule(refused, "mmap", (2, SCMP_CMP_MASKED_EQ, both, both))
        wx.rule(refused, "mprotect", (2, SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC))
        wx.rule(refused, "pkey_mprotect", (2, SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC))
        wx.rule(refused, "shmat", (2, SCMP_CMP_MASKED_EQ, SHM_EXEC, SHM_EXEC))
        wx.load()
    if (calls := box.syscalls) is not None:
        denied = SCMP_ACT_KILL_PROCESS if calls.errno is None else scmp_act_errno(calls.errno)
        listed = SCMP_ACT_ALLOW if calls.allow_list else denied
        only = Filter(denied if calls.allow_list else SCMP_ACT_ALLOW)
        for name in calls.names:
            only.rule(listed, name)
        only.load()


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: unit_sandbox.py SPEC.json -- ARGV...")
    box = load_spec(argv[0])
    command = argv[2:]
    apply_file_system(box)
    drop_privileges(box)
    os.chdir(box.workdir)
    apply_filters(box)  # last, as systemd does: nothing after it but the exec
    os.execve(command[0], command, box.env)


if __name__ == "__main__":
    main(sys.argv[1:])
