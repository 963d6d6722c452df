"""Drills' shared vocabulary: step templates, reports, releases."""
