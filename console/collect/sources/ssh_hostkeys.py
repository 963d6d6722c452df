"""Host keys of SSH nodes: known_hosts as OpenSSH reads it, and trust on first use.

Every decision goes through asyncssh's own known_hosts matching (`SSHKnownHosts.match`),
so hashed entries (`|1|salt|hash`, the default on Debian and Ubuntu), wildcards
(`*.gpu.example`, `[10.0.0.?]:2222`), `@cert-authority` and `@revoked` lines count the
way they count for OpenSSH.

A host is *listed* when any line of the file matches it: a key, a CA or a revocation.
A listed host whose key is not trusted is refused, always: a changed key is never a
first use. Only a host that no line matches is trusted on first use, and only when the
node asks for it (`ssh_trust_on_first_use = true`); its key is appended to the file,
hashed when the file's own entries are hashed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
from pathlib import Path

from console.collect.sources.sshlib import asyncssh


def describe(key: asyncssh.SSHKey) -> str:
    """`ssh-ed25519 SHA256:...`, as ssh prints a key."""
    return f"{key.get_algorithm()} {key.get_fingerprint()}"


class HostKeyPolicy(asyncssh.SSHClient):
    """The host key check of one connection. asyncssh trusts what the file lists and
    asks `validate_host_public_key` about any other key; `refusal` then says why the key
    was refused, worded for the node row."""

    def __init__(self, path: Path, text: str, trust_on_first_use: bool) -> None:
        self.path = path
        self.text = text
        self.known = asyncssh.import_known_hosts(text)
        self.trust_on_first_use = trust_on_first_use
        self.refusal: str | None = None
        self.added: str | None = None  # the line appended on first use

    @classmethod
    def load(cls, path: Path, trust_on_first_use: bool) -> HostKeyPolicy:
        """The file as it is now; ValueError says what is wrong with it and where."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ValueError(
                f"known_hosts file {path} does not exist (host keys are always checked)"
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"known_hosts file {path}: cannot read: {exc}") from None
        try:
            return cls(path, text, trust_on_first_use)
        except ValueError as exc:
            line = _first_bad_line(text)
            raise ValueError(f"known_hosts file {path}:{line}: {exc}"[:300]) from None

    def validate_host_public_key(
        self, host: str, addr: str, port: int | None, key: asyncssh.SSHKey
    ) -> bool:
        matched = self.known.match(host, addr, port)
        if any(matched):
            host_keys, ca_keys = matched[0], matched[1]
            where = self._where(host, addr, port)
            if host_keys:
                self.refusal = (
                    f"host key {describe(key)} CHANGED: it does not match {where}; if the "
                    "host was reinstalled, check its new key out of band, then remove the old "
                    f"one: ssh-keygen -R '{_entry(host, port)}' -f {self.path}"
                )
            elif ca_keys:
                self.refusal = (
                    f"host key {describe(key)} is not a certificate signed by the "
                    f"@cert-authority that {where} lists for it"
                )
            else:
                self.refusal = f"host key {describe(key)} is not trusted by {where}"
            return False
        if not self.trust_on_first_use:
            self.refusal = f"host key {describe(key)} is not in {self.path}"
            return False
        self._append(host, port, key)
        return True

    def validate_host_ca_key(
        self, host: str, addr: str, port: int | None, key: asyncssh.SSHKey
    ) -> bool:
        # A CA is trusted only where the file says so: first use never trusts a CA.
        self.refusal = (
            f"host certificate signed by CA {describe(key)}, which {self.path} does not "
            "list as @cert-authority for this host"
        )
        return False

    def certificate_only(self, host: str, port: int) -> str | None:
        """Why a key exchange found no host key to agree on, when that is the file's doing:
        a host it lists only under @cert-authority is asked for a certificate alone (as
        OpenSSH does), and a host without one has nothing to offer."""
        addr = host if _is_address(host) else ""
        wanted = None if port == 22 else port
        host_keys, ca_keys, *_ = self.known.match(host, addr, wanted)
        if ca_keys and not host_keys:
            return (
                f"{self._where(host, addr, wanted)} trusts only a @cert-authority for this "
                "host, and the host offered no certificate signed by it"
            )
        return None

    def _where(self, host: str, addr: str, port: int | None) -> str:
        """`path:3,7`: the lines that match the host, for the operator to look at."""
        lines = []
        for number, line in enumerate(self.text.splitlines(), 1):
            try:
                one = asyncssh.import_known_hosts(line)
            except ValueError:
                continue
            if any(one.match(host, addr, port)):
                lines.append(str(number))
        return f"{self.path}:{','.join(lines[:5])}" if lines else str(self.path)

    def _append(self, host: str, port: int | None, key: asyncssh.SSHKey) -> None:
        name = _entry(host, port)
        if _hashed(self.text):
            salt = os.urandom(20)
            digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
            name = f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"
        public = " ".join(key.export_public_key("openssh").decode().split()[:2])
        line = f"{name} {public}\n"
        separator = "\n" if self.text and not self.text.endswith("\n") else ""
        with self.path.open("a", encoding="utf-8") as f:
            f.write(separator + line)
            f.flush()
            os.fsync(f.fileno())
        self.added = line


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _entry(host: str, port: int | None) -> str:
    """How known_hosts names a host: `host`, or `[host]:port` off port 22."""
    return host if port in (None, 22) else f"[{host}]:{port}"


def _hashed(text: str) -> bool:
    """Whether the file's entries are hashed (HashKnownHosts yes): new ones follow suit."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0].startswith("@"):
            fields = fields[1:]  # a marker: the host pattern comes next
        if fields and fields[0].startswith("|1|"):
            return True
    return False


def _first_bad_line(text: str) -> int:
    for number, line in enumerate(text.splitlines(), 1):
        try:
            asyncssh.import_known_hosts(line)
        except ValueError:
            return number
    return 0
