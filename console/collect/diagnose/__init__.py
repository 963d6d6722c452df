"""The diagnoses: finders, the Diagnoser, `engineroom diagnose`."""
