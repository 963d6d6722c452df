"""The agent's HTTP API: routes, tokens and roles, /metrics."""
