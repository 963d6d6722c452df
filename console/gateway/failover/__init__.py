"""Failover jobs: the weights' plan, the target's check, the steps."""
