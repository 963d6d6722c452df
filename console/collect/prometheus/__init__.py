"""The fleet read from Prometheus: queries, answers, health."""
