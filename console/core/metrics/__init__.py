"""Metric math: the exposition parser, windows, a probe's readings."""
