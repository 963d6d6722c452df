"""Per-call NVML cost on a real GPU: which fields make up the agent's sample time.

python3 bench/nvml_calls.py [ROUNDS]
"""

from __future__ import annotations

import statistics
import sys
import time

import pynvml as n


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    n.nvmlInit()
    handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
    calls = {
        "utilization": lambda h: n.nvmlDeviceGetUtilizationRates(h),
        "memory_v2": lambda h: n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2),
        "memory_v1": lambda h: n.nvmlDeviceGetMemoryInfo(h),
        "temperature": lambda h: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
        "power": lambda h: n.nvmlDeviceGetPowerUsage(h),
        "power_limit": lambda h: n.nvmlDeviceGetEnforcedPowerLimit(h),
        "sm_clock": lambda h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
        "mem_clock": lambda h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
        "clock_reasons": lambda h: n.nvmlDeviceGetCurrentClocksEventReasons(h),
        "ecc_volatile": lambda h: n.nvmlDeviceGetTotalEccErrors(
            h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC
        ),
        "remapped_rows": lambda h: n.nvmlDeviceGetRemappedRows(h),
        "processes": lambda h: n.nvmlDeviceGetComputeRunningProcesses(h),
        "mig_mode": lambda h: n.nvmlDeviceGetMigMode(h),
    }
    for name, fn in calls.items():
        times = []
        for _ in range(rounds):
            for h in handles:
                t0 = time.perf_counter()
                try:
                    fn(h)
                except n.NVMLError as exc:
                    print(f"{name}: {exc}")
                    break
                times.append((time.perf_counter() - t0) * 1e6)
        if times:
            print(
                f"{name:14s} median {statistics.median(times):7.1f} us  "
                f"p90 {sorted(times)[int(0.9 * len(times))]:7.1f} us"
            )


if __name__ == "__main__":
    main()
