"""The console's clients of the agents' and the gateway's APIs."""
