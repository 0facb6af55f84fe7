"""The lab: what measures the product and builds for it, and is not the product.

The benches and their sub-commands (`lab/commands/`), the evaluation behind them and behind
`edgeasr models calibrate`, `ablate` and `command-set` (`lab/evaluation/`), and the Hailo
compiler's toolchain with the full-NPU reference decoder (`lab/hailo/`). A checkout's editable
install (`pip install -e '.[bench]'`) has it; the wheel and the .deb leave it out
(pyproject.toml), and nothing the daemon runs imports it (tests/test_layout.py).
"""
