"""Rollouts run in the gateway: the record, a deployment's steps."""
