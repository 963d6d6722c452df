"""fleet.toml: its typed model, loading and validation, names, lines."""
