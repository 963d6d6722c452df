"""FakeNvml: a TEST DOUBLE for the pynvml module, for CPU machines that have no GPU.

It answers the calls the agent's GpuSampler makes, with values a test sets, so that the
decoding, the NotSupported handling, the XID event path, the pid-to-engine mapping and
a hung driver can be tested here. The real NVML path is checked on the device machine
(docs/agent-on-h200.md); nothing here stands in for that.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class NVMLError_GpuIsLost(NVMLError):
    def __str__(self) -> str:
        return "GPU is lost"


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    util: int = 0
    mem_used: int = 0
    mem_total: int = 143771 * 2**20
    temp: int = 35
    power_mw: int = 90_000
    limit_mw: int = 700_000
    reasons: int = 0x1
    ecc: int | None = 0  # None: not supported
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, bytes)
    lost: bool = False
    uuid: str | None = None  # None: "GPU-fake-NNNN" by its index


class FakeNvml:
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8
    nvmlMemory_v2 = 0x02000028
    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Timeout = NVMLError_Timeout

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.hang = threading.Event()  # set: utilization calls block until released
        self.release = threading.Event()
        self.xid_queue: list[tuple[int, int]] = []  # (gpu index, xid)

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.159.04"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 13000

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetIndex(self, h: int) -> int:
        return h

    def _gpu(self, h: int) -> FakeGpu:
        gpu = self.gpus[h]
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        return gpu

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.gpus[h].uuid or f"GPU-fake-{h:04d}"

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.gpus[h].name

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        return [0, 0]

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        if self.hang.is_set():
            self.release.wait(30)
        return SimpleNamespace(gpu=self._gpu(h).util, memory=self._gpu(h).util // 2)

    def nvmlDeviceGetMemoryInfo(self, h: int, version: int | None = None) -> Any:
        g = self._gpu(h)
        return SimpleNamespace(
            total=g.mem_total, used=g.mem_used, free=g.mem_total - g.mem_used, reserved=512 * 2**20
        )

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self._gpu(h).temp

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._gpu(h).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return self._gpu(h).limit_mw

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return 1980 if kind == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._gpu(h).reasons

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        ecc = self._gpu(h).ecc
        if ecc is None:
            raise NVMLError_NotSupported()
        return ecc

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return (0, 0, 0, 0)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in self._gpu(h).processes]

    # XID events
    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, h: int, kind: int, event_set: object) -> None:
        pass

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        if self.xid_queue:
            index, xid = self.xid_queue.pop(0)
            return SimpleNamespace(device=index, eventData=xid)
        time.sleep(min(timeout_ms, 50) / 1000)
        raise NVMLError_Timeout()

    def nvmlEventSetFree(self, event_set: object) -> None:
        pass
