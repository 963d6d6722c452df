"""The gateway's HTTP: the front door, the relay, Triton, the admin API."""
