"""Model bundles and the Hailo artefacts around them (`edgeasr models ...`)."""

# Declared here, not in the modules that use them, so the CLI offers them without importing numpy.
ARCHES = ("hailo8", "hailo8l")  # Hailo targets compile-hef builds for
DTYPES = ("bf16", "int8")  # what `models weights` writes weights in
