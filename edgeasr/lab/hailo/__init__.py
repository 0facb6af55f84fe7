"""The Hailo work around the product: the Dataflow Compiler's steps (`compile_hef`), what its
ONNX parser accepts (`lint`), the calibration set of real speech it quantizes with
(`calibration_set`), and Whisper decoded the way Hailo's decoder HEF runs it
(`reference_decoder`, the bench's full-NPU row). A HEF built elsewhere is the product's:
`edgeasr models import --hef` (edgeasr/models/hef_import.py)."""

# Declared here, not in compile_hef, so the CLI offers them without importing numpy.
ARCHES = ("hailo8", "hailo8l")  # Hailo targets compile-hef builds for
