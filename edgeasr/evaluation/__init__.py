"""Measuring the engine: evaluation sets, their scores, the benchmarks and the decoding calibration."""
