"""Where the agent's NVML sample spends its time on a real GPU (cProfile, tottime)."""

from __future__ import annotations

import cProfile
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from console.agent.snapshot.gpu import GpuSampler

sampler = GpuSampler()
sampler.sample()
profile = cProfile.Profile()
profile.enable()
for _ in range(500):
    sampler.sample()
profile.disable()
sampler.close()
pstats.Stats(profile).sort_stats("tottime").print_stats(18)
