"""The fleet sources behind FleetSource: the agents' streams and SSH."""
