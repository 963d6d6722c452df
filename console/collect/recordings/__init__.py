"""Recordings: format, writer, reader, replay and the timeline."""
