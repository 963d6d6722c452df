"""Replacing a configuration file whole: a crash leaves the old text or the new, never half.

One piece of code for every file engineroom writes back into place (HAProxy's
configuration, the rules file; fleet.toml's save can use it too). The file is written where
it really lives: a symbolic link keeps being a link and its target gets the new text (an
adopted /etc/haproxy/haproxy.cfg is often a link into a configuration repository). The
text goes to a temporary file in the target's directory: fsync, the old file's mode (and
owner, only where it differs and the process may give files away), rename over, fsync the
directory.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

NEW_FILE_MODE = 0o644


def replace_text(
    path: str | os.PathLike[str],
    text: str,
    check: Callable[[os.stat_result | None], None] | None = None,
) -> Path:
    """Replace the file at `path` (its link's target, for a symbolic link) with `text`;
    returns the path written. `check(stat of the file before)` runs after the new text is
    on disk and just before the rename, the last moment to refuse (it raises); nothing is
    left behind when it does. OSError says what failed."""
    real = Path(os.path.realpath(path))
    try:
        before: os.stat_result | None = real.stat()
    except FileNotFoundError:
        before = None
    fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), stat.S_IMODE(before.st_mode) if before else NEW_FILE_MODE)
            if before is not None:
                _keep_owner(f.fileno(), before)
            os.fsync(f.fileno())
        if check is not None:
            check(before)
        os.replace(tmp, real)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(real.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return real


def _keep_owner(fd: int, before: os.stat_result) -> None:
    # Only where the new file's owner differs: a process that writes its own files never
    # makes the call (a service whose system-call filter denies chown would die of it).
    # Only root may give files away: anyone else's attempt is a denied call under the
    # gateway's unit (tests/test_deploy_units.py, a root-owned haproxy.cfg).
    now = os.fstat(fd)
    if os.geteuid() == 0 and (now.st_uid, now.st_gid) != (before.st_uid, before.st_gid):
        with contextlib.suppress(PermissionError):  # root without CAP_CHOWN
            os.fchown(fd, before.st_uid, before.st_gid)
