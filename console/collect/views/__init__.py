"""The fleet view built from the sources, and `check` over it."""
