"""The agent's snapshot cycle: GPUs, host, engines found and probed."""
