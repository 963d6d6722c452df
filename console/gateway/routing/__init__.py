"""The live route table, its record, upstreams and measures."""
