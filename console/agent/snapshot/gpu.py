"""GPUs through NVML (nvidia-ml-py, imported as `pynvml`).

One sample reads every GPU's live fields; names, UUIDs and compute capability are read
once. A field a GPU does not support is None; any other failure is kept in the GPU's
`errors`, worded, and the rest of the sample goes on. XID critical errors arrive through
an NVML event set, watched by a background thread. Without NVML, `status` says why and
the agent carries on without GPUs.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from console.core.metrics.readings import decode_clock_event_reasons
from console.core.wire import Gpu, XidEvent

T = TypeVar("T")

# Power limit, memory clock, ECC and remapped rows change rarely: read them every
# SLOW_EVERY samples (10 s at the default 2 s interval) to keep the per-cycle cost low.
SLOW_EVERY = 5


def _why_unavailable(nvml: ModuleType, exc: Exception) -> str:
    checks = (
        ("NVMLError_LibraryNotFound", "no NVIDIA driver (NVML library not found)"),
        ("NVMLError_DriverNotLoaded", "NVIDIA driver not loaded"),
        ("NVMLError_NoPermission", "no permission to use NVML"),
        (
            "NVMLError_LibRmVersionMismatch",
            "NVML library and kernel driver versions differ (driver upgraded without reload?)",
        ),
    )
    for name, words in checks:
        cls = getattr(nvml, name, None)
        if cls is not None and isinstance(exc, cls):
            return words
    return f"NVML unavailable: {exc}"


class GpuSampler:
    """Reads every GPU on the node. `sample()` blocks on NVML: run it in a thread."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self.status = "ok"
        self.driver_version: str | None = None
        self.cuda_driver_version: str | None = None
        self._handles: list[Any] = []
        self._static: list[dict[str, Any]] = []
        self._xid: dict[int, deque[XidEvent]] = {}
        self._stop = threading.Event()
        self._xid_thread: threading.Thread | None = None
        self._samples = 0
        self._slow: dict[int, dict[str, Any]] = {}
        self._proc_slots = 32
        self.nvml: ModuleType | None = None
        if nvml is None:
            try:
                import pynvml
            except ImportError:
                self.status = "nvidia-ml-py is not installed"
                return
            nvml = pynvml
        self.nvml = nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:
            self.status = _why_unavailable(nvml, exc)
            self.nvml = None
            return
        try:
            self.driver_version = str(nvml.nvmlSystemGetDriverVersion())
            cuda = int(nvml.nvmlSystemGetCudaDriverVersion_v2())
            self.cuda_driver_version = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        except nvml.NVMLError:
            pass
        try:
            count = nvml.nvmlDeviceGetCount()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except nvml.NVMLError as exc:
            self.status = f"NVML could not list GPUs: {exc}"
            return
        self._static = [self._read_static(i, h) for i, h in enumerate(self._handles)]
        self._start_xid_watch()

    @property
    def available(self) -> bool:
        return self.nvml is not None and self.status == "ok"

    def _call(self, errors: list[str], what: str, fn: Callable[..., T], *args: Any) -> T | None:
        assert self.nvml is not None
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            if not isinstance(exc, self.nvml.NVMLError_NotSupported):
                errors.append(f"{what}: {exc}")
            return None

    def _read_static(self, index: int, handle: Any) -> dict[str, Any]:
        assert self.nvml is not None
        nvml, errors = self.nvml, list[str]()
        cc = self._call(
            errors, "compute capability", nvml.nvmlDeviceGetCudaComputeCapability, handle
        )
        mig = self._call(errors, "MIG mode", nvml.nvmlDeviceGetMigMode, handle)
        return {
            "index": index,
            "uuid": self._call(errors, "uuid", nvml.nvmlDeviceGetUUID, handle),
            "name": self._call(errors, "name", nvml.nvmlDeviceGetName, handle),
            "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
            "mig_mode": bool(mig[0]) if mig else None,
        }

    def read(self) -> list[Gpu]:
        """Every GPU as a wire model: `sample()` plus validation into `Gpu`."""
        return [Gpu.model_validate(fields) for fields in self.sample()]

    def sample(self) -> list[dict[str, Any]]:
        """The NVML part: every GPU's fields as plain values (what the benchmark times)."""
        if not self.available:
            return []
        slow = self._samples % SLOW_EVERY == 0
        self._samples += 1
        return [
            self._sample_one(h, s, slow) for h, s in zip(self._handles, self._static, strict=True)
        ]

    def _sample_one(self, handle: Any, static: dict[str, Any], slow: bool) -> dict[str, Any]:
        assert self.nvml is not None
        nvml = self.nvml
        errors: list[str] = []
        index = static["index"]
        f: dict[str, Any] = dict(static)
        util = self._call(errors, "utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
        if util is not None:
            f["utilization_pct"] = float(util.gpu)
            f["memory_utilization_pct"] = float(util.memory)
        mem = self._memory(handle, errors)
        if mem is not None:
            f["memory_used_bytes"] = int(mem.used)
            f["memory_total_bytes"] = int(mem.total)
            f["memory_reserved_bytes"] = int(getattr(mem, "reserved", 0)) or None
        temp = self._call(
            errors, "temperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
        )
        f["temperature_c"] = float(temp) if temp is not None else None
        power = self._call(errors, "power", nvml.nvmlDeviceGetPowerUsage, handle)
        f["power_w"] = power / 1000 if power is not None else None
        f["sm_clock_mhz"] = self._call(
            errors, "SM clock", nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM
        )
        reasons = self._call(errors, "clock event reasons", self._clock_reasons, handle)
        f["clock_event_reasons"] = (
            decode_clock_event_reasons(reasons) if reasons is not None else None
        )
        if slow:
            self._slow[index] = self._sample_slow(handle, errors)
        f.update(self._slow.get(index, {}))
        f["processes"] = self._call(errors, "processes", self._processes, handle)
        f["xid_events"] = [{"time": e.time, "xid": e.xid} for e in self._xid.get(index, ())]
        f["errors"] = errors
        return f

    def _sample_slow(self, handle: Any, errors: list[str]) -> dict[str, Any]:
        """Fields that change rarely, read every SLOW_EVERY samples to keep cycles cheap."""
        assert self.nvml is not None
        nvml = self.nvml
        f: dict[str, Any] = {}
        limit = self._call(errors, "power limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        f["power_limit_w"] = limit / 1000 if limit is not None else None
        f["mem_clock_mhz"] = self._call(
            errors, "memory clock", nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM
        )
        f["ecc_uncorrected"] = self._call(
            errors,
            "ECC",
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        rows = self._call(errors, "remapped rows", nvml.nvmlDeviceGetRemappedRows, handle)
        if rows is not None:
            corr, unc, pending, failure = rows
            f["remapped_rows"] = {
                "correctable": corr,
                "uncorrectable": unc,
                "pending": bool(pending),
                "failure": bool(failure),
            }
        return f

    def _processes(self, handle: Any) -> list[dict[str, Any]]:
        """Compute processes in one driver call where pynvml allows it.

        pynvml's own wrapper calls the driver twice (once for the count) and converts
        each struct through a slow generic helper; under load that is most of a sample.
        """
        assert self.nvml is not None
        nvml = self.nvml
        info = getattr(nvml, "c_nvmlProcessInfo_v3_t", None)
        pointer = getattr(nvml, "_nvmlGetFunctionPointer", None)
        if info is None or pointer is None:
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            return [
                {
                    "pid": int(p.pid),
                    "used_memory_bytes": None if p.usedGpuMemory is None else int(p.usedGpuMemory),
                }
                for p in procs
            ]
        from ctypes import byref, c_uint

        size = self._proc_slots
        while True:
            count = c_uint(size)
            buffer = (info * size)()
            ret = pointer("nvmlDeviceGetComputeRunningProcesses_v3")(handle, byref(count), buffer)
            if ret == nvml.NVML_ERROR_INSUFFICIENT_SIZE and size < 4096:
                size = self._proc_slots = max(size * 2, count.value + 8)
                continue
            if ret != nvml.NVML_SUCCESS:
                raise nvml.NVMLError(ret)
            break
        unknown = nvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
        out = []
        for i in range(count.value):
            used = buffer[i].usedGpuMemory
            out.append(
                {
                    "pid": int(buffer[i].pid),
                    "used_memory_bytes": None if used == unknown else int(used),
                }
            )
        return out

    def _memory(self, handle: Any, errors: list[str]) -> Any:
        assert self.nvml is not None
        nvml = self.nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None:
            try:
                # v2 `used` leaves out the driver-reserved part, as nvidia-smi shows it.
                return nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            except (nvml.NVMLError, TypeError):
                pass
        return self._call(errors, "memory", nvml.nvmlDeviceGetMemoryInfo, handle)

    def _clock_reasons(self, handle: Any) -> int:
        assert self.nvml is not None
        fn = (
            getattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return int(fn(handle))

    # XID critical errors: NVML has no "last XID" getter, only events.
    def _start_xid_watch(self) -> None:
        assert self.nvml is not None
        nvml = self.nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError:
            return
        watched = 0
        for index, handle in enumerate(self._handles):
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
                watched += 1
                self._xid[index] = deque(maxlen=20)
            except nvml.NVMLError:
                continue
        if not watched:
            nvml.nvmlEventSetFree(event_set)
            return
        self._xid_thread = threading.Thread(
            target=self._watch_xid, args=(event_set,), name="nvml-xid", daemon=True
        )
        self._xid_thread.start()

    def _watch_xid(self, event_set: Any) -> None:
        assert self.nvml is not None
        nvml = self.nvml
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        while not self._stop.is_set():
            try:
                data = wait(event_set, 500)
            except nvml.NVMLError_Timeout:
                continue
            except nvml.NVMLError:
                time.sleep(1.0)  # the driver refused; don't spin
                continue
            try:
                index = int(nvml.nvmlDeviceGetIndex(data.device))
            except nvml.NVMLError:
                continue
            self._xid.setdefault(index, deque(maxlen=20)).append(
                XidEvent(time=time.time(), xid=int(data.eventData))
            )
        nvml.nvmlEventSetFree(event_set)

    def close(self) -> None:
        self._stop.set()
        if self._xid_thread is not None:
            self._xid_thread.join(timeout=2)
        if self.nvml is not None:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()
