"""A REAL OpenSSH server (Debian's openssh-server) on a loopback port, for the SSH tests.

Host and client keys are generated per test session. The session's PATH (sshd `SetEnv`)
starts with a bin directory the test fills: `engineroom` (this checkout's) and/or the
`nvidia-smi` test double.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.engines.servers import free_port, log_tail, stop, wait_until

SSHD = Path("/usr/sbin/sshd")
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Sshd:
    process: subprocess.Popen[bytes]
    port: int
    user: str
    client_key: Path
    host_key_line: str  # "ssh-ed25519 AAAA..." as a known_hosts line ends
    bin_dir: Path
    dir: Path

    def known_hosts(self, path: Path, line: str | None = None) -> Path:
        """A known_hosts file with this server's key (or `line` instead)."""
        path.write_text(f"[127.0.0.1]:{self.port} {line or self.host_key_line}\n")
        return path


def keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        capture_output=True,
    )


def start_sshd(workdir: Path, host_ca: Path | None = None) -> Sshd:
    """sshd on a free loopback port; with `host_ca` (a private key), its host key comes
    with a certificate that CA signed for 127.0.0.1 (for @cert-authority)."""
    if not SSHD.exists():
        raise RuntimeError(f"{SSHD} is missing: `make test` installs openssh-server")
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("host_key", "client_key"):
        keygen(workdir / name)
    certificate = ""
    if host_ca is not None:
        subprocess.run(
            ["ssh-keygen", "-q", "-s", str(host_ca), "-I", "engineroom-test", "-h",
             "-n", "127.0.0.1", str(workdir / "host_key.pub")],
            check=True, capture_output=True,
        )  # fmt: skip
        certificate = f"HostCertificate {workdir / 'host_key-cert.pub'}\n"
    (workdir / "authorized_keys").write_text((workdir / "client_key.pub").read_text())
    bin_dir = workdir / "bin"
    bin_dir.mkdir()
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    port = free_port()
    config = workdir / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {workdir / 'host_key'}\n"
        f"PidFile {workdir / 'sshd.pid'}\nAuthorizedKeysFile {workdir / 'authorized_keys'}\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
        "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nLogLevel ERROR\n"
        f"SetEnv PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin\nMaxStartups 200\nMaxSessions 200\n"
        + certificate
    )
    log = workdir / "sshd.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def listening() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited {process.returncode}: {log_tail(log)}")
        import socket

        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    wait_until(listening, 20, what="sshd")
    host_key = (workdir / "host_key.pub").read_text().split()
    return Sshd(
        process,
        port,
        getpass.getuser(),
        workdir / "client_key",
        f"{host_key[0]} {host_key[1]}",
        bin_dir,
        workdir,
    )


def install_engineroom(sshd: Sshd) -> None:
    (sshd.bin_dir / "engineroom").symlink_to(ROOT / ".venv" / "bin" / "engineroom")


def install_nvidia_smi_double(sshd: Sshd) -> None:
    shutil.copy(ROOT / "tests" / "nvidia_smi_double.py", sshd.bin_dir / "nvidia-smi")
    (sshd.bin_dir / "nvidia-smi").chmod(0o755)


def stop_sshd(sshd: Sshd) -> None:
    stop(sshd.process, grace=5)
