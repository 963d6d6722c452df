"""The processes the agent starts: spawned, capped, signalled, stopped."""
