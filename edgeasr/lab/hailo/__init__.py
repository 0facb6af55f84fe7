"""The Hailo work around the product: Whisper decoded the way Hailo's decoder HEF runs it
(`reference_decoder`, the bench's full-NPU row)."""
