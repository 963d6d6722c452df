#!/usr/bin/env python3
"""TEST DOUBLE for `nvidia-smi` (these machines have no GPU): answers the two CSV queries
the console's SSH fallback makes, for two H200s, one busy and one idle, the way
nvidia-smi 580 prints them (`--format=csv,noheader,nounits`). Anything else: exit 2.
"""

import os
import sys

GPUS = [
    "0, GPU-0b6c7d5e-0000-0000-0000-000000000000, NVIDIA H200, 87, 41, 120210, 143771, 61, "
    "512.34, 700.00, 1980, 3201, 580.159.04",
    "1, GPU-1f2e3d4c-0000-0000-0000-000000000000, NVIDIA H200, 0, 0, 1, 143771, 29, "
    "74.12, 700.00, 345, 3201, 580.159.04",
]


def main() -> int:
    args = sys.argv[1:]
    query = next((a for a in args if a.startswith("--query-")), "")
    if query.startswith("--query-gpu="):
        print("\n".join(GPUS))
        return 0
    if query.startswith("--query-compute-apps="):
        # The caller's own shell stands for the process on GPU 0 (a real pid, so the
        # process listing names it).
        print(f"{os.getppid()}, 118000, GPU-0b6c7d5e-0000-0000-0000-000000000000, python3")
        return 0
    print(f"nvidia-smi double: unsupported arguments {args}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
