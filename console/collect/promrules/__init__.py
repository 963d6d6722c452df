"""`engineroom rules`: the alerts and diagnoses as Prometheus rules."""
