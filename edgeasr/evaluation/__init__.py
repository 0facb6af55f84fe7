"""Measuring edgeasr: benchmarks, scoring and the harnesses they run in."""
