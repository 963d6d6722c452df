"""The gateway: one OpenAI front door across engines, live routes, and failover jobs."""
