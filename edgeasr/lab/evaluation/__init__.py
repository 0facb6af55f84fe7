"""Measuring the engine: evaluation sets, their scores, the benchmarks, the decoding calibration and a real Home Assistant as the judge of commands."""
