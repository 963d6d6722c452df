"""The rollout planner and the plan file."""
