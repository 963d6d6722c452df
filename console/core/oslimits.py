"""Process limits a fleet-sized program needs: a console following a thousand agents
holds a thousand sockets, and so does the simulator serving them."""

from __future__ import annotations

import contextlib
import resource


def raise_open_files(wanted: int) -> None:
    """Lift the soft open-file limit towards `wanted` (as far as the hard limit allows)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
