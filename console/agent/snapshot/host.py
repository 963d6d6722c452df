"""The host through psutil: CPU, load, memory, and the disks under model and engine dirs."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import psutil

from console.core.wire import Disk, Host


class HostSampler:
    def __init__(self, disk_paths: list[str]) -> None:
        self.disk_paths = [str(Path(p).expanduser()) for p in disk_paths]
        self._mounts = self._mount_points()
        psutil.cpu_percent(interval=None)  # the first call only starts the measurement
        self._cpu_since = time.monotonic()

    def _mount_points(self) -> list[str]:
        try:
            mounts = [p.mountpoint for p in psutil.disk_partitions(all=False)]
        except OSError:
            return []
        return sorted(mounts, key=len, reverse=True)

    def _mount_of(self, path: str) -> str | None:
        real = os.path.realpath(path)
        for mount in self._mounts:
            if real == mount or real.startswith(mount.rstrip("/") + "/"):
                return mount
        return None

    def sample(self) -> Host:
        cpu = psutil.cpu_percent(interval=None)
        # Over a too-short span the percentage means nothing: say unknown.
        measured = time.monotonic() - self._cpu_since >= 0.05
        self._cpu_since = time.monotonic()
        host = Host(cpu_pct=cpu if measured else None, cpu_count=psutil.cpu_count())
        with contextlib.suppress(OSError):
            host.load1, host.load5, host.load15 = os.getloadavg()
        mem = psutil.virtual_memory()
        host.mem_total_bytes = int(mem.total)
        host.mem_used_bytes = int(mem.total - mem.available)
        for path in self.disk_paths:
            try:
                usage = psutil.disk_usage(path)
                host.disks.append(
                    Disk(
                        path=path,
                        mount=self._mount_of(path),
                        used_bytes=usage.used,
                        total_bytes=usage.total,
                    )
                )
            except OSError as exc:
                host.disks.append(Disk(path=path, error=exc.strerror or str(exc)))
        return host
