"""`engineroom serve --web`: the read-only console in a browser."""
