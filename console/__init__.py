"""engineroom: a terminal ops console for GPU fleets serving LLMs."""

__version__ = "0.1.0"
