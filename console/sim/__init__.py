"""The SIMULATED fleet behind `engineroom demo` and the console's scale benchmark.

- `fleet.serve_demo_fleet`: simulated GPUs (`nvml.SimulatedNvml`) and engines
  (`vllm_engine.VllmEngine`, `triton_engine.TritonEngine`, built on `engines`, driven by
  `load.Workload`), read by REAL agents over real HTTP on 127.0.0.1.
- `scale.serve_scale_fleet`: many lightweight simulated agents serving generated snapshots.
- `python -m console.sim`: either one, until SIGINT or SIGTERM.

Everything here is labelled SIMULATED where it shows. Never imports Textual.
"""
