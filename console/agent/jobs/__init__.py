"""The agent's jobs: the runner, its kinds, engine jobs and their record."""
