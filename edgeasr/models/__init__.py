"""Model bundles: Whisper's weights imported into one, the embedded default prepared on first
use, an encoder HEF built elsewhere attached (`edgeasr models ...`)."""

# Declared here, not in the module that uses it, so the CLI offers it without importing numpy.
DTYPES = ("bf16", "int8")  # what `models weights` writes weights in
# `models import --tail`: auto, the tail map shipped for known weights, else one fitted where a
# voice is installed, else none (the silence row); fit, always fitted at import; none
TAIL_MODES = ("auto", "fit", "none")
