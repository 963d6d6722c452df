"""Writing to the terminal: only the cells whose text changed."""
