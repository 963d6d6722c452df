"""SimulatedNvml: a pynvml-compatible module object whose GPUs follow SIMULATED engine load.

It answers every call the agent's GpuSampler makes (console/agent/snapshot/gpu.py), so the demo's
agents run their real NVML code path. Each GPU is an H200 (143771 MiB, 700 W, compute
capability 9.0) named "NVIDIA H200 (SIMULATED)". Utilization, power, temperature and
clocks move towards targets set by the engines on the GPU, smoothed over time with a
little noise; clock-event reasons follow from them (idle, software power cap near the
limit, thermal slowdown when hot). The engines on a GPU are the layout's tenants and,
read at each call, those the node's agent started (`launched`). A GPU can be marked hot,
carry volatile uncorrected ECC errors, or report an XID now and then, so the console's
alerts have something to show.
"""

from __future__ import annotations

import math
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any, Protocol

MIB = 2**20
TOTAL_MEMORY = 143771 * MIB
RESERVED_MEMORY = 570 * MIB  # what NVML's v2 memory info keeps out of "used"
IDLE_MEMORY = 4 * MIB
POWER_LIMIT_MW = 700_000
IDLE_POWER_W = 75.0
MAX_SM_MHZ, IDLE_SM_MHZ, MEM_MHZ = 1980, 345, 3201
XID_EVERY_S = 900.0  # the rare XID repeats this often, first after XID_FIRST_S
XID_FIRST_S = 75.0  # late enough that a demo starts clean, early enough to be seen
# What a SIMULATED node has: the demo's drill probe (console/sim/trtllm_double.py) and the
# engines' provenance are told the same, so every screen names one driver and one GPU.
DRIVER_VERSION = "580.95.05-sim"
CUDA_DRIVER_VERSION = 13000  # NVML's encoding: 13.0
GPU_NAME = "NVIDIA H200 (SIMULATED)"
COMPUTE_CAPABILITY = (9, 0)

# NVML's clock-event reason bits (the ones this simulation raises).
IDLE, SW_POWER_CAP, SW_THERMAL = 0x1, 0x4, 0x20


class NVMLError(Exception):
    def __str__(self) -> str:
        return self.__class__.__name__.removeprefix("NVMLError_") or "Unknown Error"


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class Load(Protocol):
    """What a GPU knows of the engine on it (console.sim.load.Workload has it)."""

    @property
    def gpu_busy(self) -> float: ...

    @property
    def batch_fill(self) -> float: ...


@dataclass(slots=True)
class Tenant:
    """An engine process on a GPU: its pid, its load and the memory it holds."""

    pid: int
    load: Load
    memory_fraction: float  # vLLM's gpu_memory_utilization, TensorRT-LLM's KV fraction


@dataclass(slots=True)
class GpuSpec:
    tenants: list[Tenant] = field(default_factory=list)
    hot: bool = False  # a failing fan or a blocked airflow: runs at ~88-92 C under load
    ecc_uncorrected: int = 0
    xid: int | None = None  # an XID critical error this GPU reports now and then


Launched = Callable[[int], list[Tenant]]  # a GPU's index -> the tenants started on it now


def _none_launched(index: int) -> list[Tenant]:
    return []


class _Gpu:
    """One GPU's live state, moved towards its targets whenever it is read."""

    def __init__(
        self,
        node: str,
        index: int,
        spec: GpuSpec,
        rng: random.Random,
        launched: Callable[[], Launched],
    ) -> None:
        self.index = index
        self.spec = spec
        self.rng = rng
        self._launched = launched
        self.uuid = f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.simulated/{index}')}"
        self._at = time.monotonic()
        self.util, self.power_w, self.temp = self._targets()
        self.fill = 0.0

    @property
    def tenants(self) -> list[Tenant]:
        """The engines on it: the layout's, and those the node's agent started, read now
        (a stopped engine leaves its GPU at once, as NVML's process list shows it)."""
        return [*self.spec.tenants, *self._launched()(self.index)]

    def _targets(self) -> tuple[float, float, float]:
        tenants = self.tenants
        busy = min(1.0, sum(t.load.gpu_busy for t in tenants))
        fill = min(1.0, max((t.load.batch_fill for t in tenants), default=0.0))
        power = IDLE_POWER_W + 640 * busy * (0.5 + 0.5 * fill)
        # A hot GPU (failing fan, blocked airflow) sits near its slowdown point even idle.
        temp = 87.5 + 3.5 * busy if self.spec.hot else 28 + 0.065 * power
        return 100 * busy, power, temp

    def advance(self) -> None:
        now = time.monotonic()
        dt = now - self._at
        if dt < 0.05:
            return  # one sample reads every field: keep them consistent
        self._at = now
        util, power, temp = self._targets()
        self.fill = max((t.load.batch_fill for t in self.tenants), default=0.0)

        def toward(value: float, target: float, tau_s: float) -> float:
            return value + (target - value) * (1 - math.exp(-dt / tau_s))

        self.util = toward(self.util, util, 2.0)
        self.power_w = toward(self.power_w, power, 2.0)
        self.temp = toward(self.temp, temp, 20.0)

    # Readings, with the noise a real sensor shows.
    @property
    def utilization(self) -> int:
        if self.util < 1:
            return 0
        return int(min(100, max(0, self.util + self.rng.gauss(0, 2))))

    @property
    def power_mw(self) -> int:
        watts = self.power_w + self.rng.gauss(0, 6) if self.util >= 1 else self.power_w
        return int(min(POWER_LIMIT_MW / 1000, max(60.0, watts)) * 1000)

    @property
    def temperature(self) -> int:
        return round(self.temp + self.rng.gauss(0, 0.3))

    @property
    def memory_used(self) -> int:
        used = sum(int(t.memory_fraction * TOTAL_MEMORY) for t in self.tenants)
        return min(TOTAL_MEMORY - RESERVED_MEMORY, used or IDLE_MEMORY)

    @property
    def reasons(self) -> int:
        mask = 0
        if self.util < 5:
            mask |= IDLE
        if self.power_w >= 0.95 * POWER_LIMIT_MW / 1000:
            mask |= SW_POWER_CAP
        if self.temp >= 87:
            mask |= SW_THERMAL
        return mask

    @property
    def sm_clock(self) -> int:
        reasons = self.reasons
        if reasons & IDLE:
            return IDLE_SM_MHZ
        clock = float(MAX_SM_MHZ)
        if reasons & SW_POWER_CAP:
            clock -= 210
        if reasons & SW_THERMAL:
            clock -= 420
        return int(clock + self.rng.choice((-15, 0, 0, 15)))


class SimulatedNvml(ModuleType):
    """A stand-in for the `pynvml` module: pass it to GpuSampler(nvml=...)."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 0x8
    nvmlMemory_v2 = 0x02000028
    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Timeout = NVMLError_Timeout

    def __init__(
        self, node: str, gpus: list[GpuSpec], *, seed: int = 0, xid_after_s: float = XID_FIRST_S
    ) -> None:
        super().__init__("pynvml (SIMULATED)")
        rng = random.Random(seed)
        self.node = node
        # The engines the node's agent starts (launch profiles): set once the agent is.
        self.launched: Launched = _none_launched
        self._gpus = [
            _Gpu(node, i, spec, random.Random(rng.random()), lambda: self.launched)
            for i, spec in enumerate(gpus)
        ]
        self._closed = threading.Event()
        has_xid = any(g.xid for g in gpus)
        self._next_xid = time.monotonic() + xid_after_s if has_xid else math.inf

    def _gpu(self, handle: _Gpu) -> _Gpu:
        handle.advance()
        return handle

    # System
    def nvmlInit(self) -> None:
        self._closed.clear()

    def nvmlShutdown(self) -> None:
        self._closed.set()

    def nvmlSystemGetDriverVersion(self) -> str:
        return DRIVER_VERSION

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return CUDA_DRIVER_VERSION

    # Devices
    def nvmlDeviceGetCount(self) -> int:
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Gpu:
        return self._gpus[index]

    def nvmlDeviceGetIndex(self, handle: _Gpu) -> int:
        return handle.index

    def nvmlDeviceGetUUID(self, handle: _Gpu) -> str:
        return handle.uuid

    def nvmlDeviceGetName(self, handle: _Gpu) -> str:
        return GPU_NAME

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Gpu) -> tuple[int, int]:
        return COMPUTE_CAPABILITY

    def nvmlDeviceGetMigMode(self, handle: _Gpu) -> list[int]:
        return [0, 0]

    def nvmlDeviceGetUtilizationRates(self, handle: _Gpu) -> Any:
        gpu = self._gpu(handle)
        util = gpu.utilization
        # Decode is memory-bound: the memory controller is busy most of the time the SMs are.
        return SimpleNamespace(gpu=util, memory=int(util * (0.55 + 0.35 * gpu.fill)))

    def nvmlDeviceGetMemoryInfo(self, handle: _Gpu, version: int | None = None) -> Any:
        used = self._gpu(handle).memory_used
        free = TOTAL_MEMORY - RESERVED_MEMORY - used
        return SimpleNamespace(total=TOTAL_MEMORY, used=used, free=free, reserved=RESERVED_MEMORY)

    def nvmlDeviceGetTemperature(self, handle: _Gpu, sensor: int) -> int:
        return self._gpu(handle).temperature

    def nvmlDeviceGetPowerUsage(self, handle: _Gpu) -> int:
        return self._gpu(handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Gpu) -> int:
        return POWER_LIMIT_MW

    def nvmlDeviceGetClockInfo(self, handle: _Gpu, kind: int) -> int:
        return self._gpu(handle).sm_clock if kind == self.NVML_CLOCK_SM else MEM_MHZ

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Gpu) -> int:
        return self._gpu(handle).reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: _Gpu, kind: int, counter: int) -> int:
        return handle.spec.ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, handle: _Gpu) -> tuple[int, int, int, int]:
        # An uncorrectable error leaves a row remapping pending until the next GPU reset.
        errors = handle.spec.ecc_uncorrected
        return (0, 1, 1, 0) if errors else (0, 0, 0, 0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Gpu) -> list[Any]:
        return [
            SimpleNamespace(pid=t.pid, usedGpuMemory=int(t.memory_fraction * TOTAL_MEMORY))
            for t in handle.tenants
        ]

    # XID critical errors arrive as events, as with the real driver.
    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, handle: _Gpu, kind: int, event_set: object) -> None:
        pass

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        """Block up to `timeout_ms` like the driver does; an XID that falls due wakes it."""
        now = time.monotonic()
        wait_s = timeout_ms / 1000
        due = self._next_xid - now
        if due <= wait_s:
            if self._closed.wait(max(0.0, due)):
                raise NVMLError_Timeout()
            self._next_xid += XID_EVERY_S
            gpu = next(g for g in self._gpus if g.spec.xid)
            return SimpleNamespace(
                device=gpu,
                eventType=self.nvmlEventTypeXidCriticalError,
                eventData=gpu.spec.xid,
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )
        self._closed.wait(wait_s)
        raise NVMLError_Timeout()

    def nvmlEventSetFree(self, event_set: object) -> None:
        pass
