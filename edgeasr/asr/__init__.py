"""Speech to text: log-mel features, the encoder (CPU or Hailo NPU), the KV-cached decoder,
the logit rules and quality gates, and the transcriber that walks audio window by window."""
