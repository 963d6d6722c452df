"""The data planes a failover drives: built-in, HAProxy, router."""
