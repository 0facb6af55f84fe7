"""The bytes a greedy decoder step reads per token (`edgeasr bench`'s MB/token): what bounds a
token's time where memory, not the cores, is the limit (a Raspberry Pi 5: 2 MB of L3).

- weights: every initializer of the step graph (the positional table: the one row a token
  takes), the token's row of the token table; with the two-stage projection, also the
  candidates' int8 rows and the verification's table once per window, spread over its tokens;
- cross K/V: every layer's keys and values over the window's positions and the padding row;
- self K/V: every layer's cached keys and values, at the row's mean cached length.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from edgeasr.bundle import SHORTLIST_STEP_ROLE, VERIFY_ROLE, Bundle

MB = 1e6
FLOAT32 = 4
POSITIONS_TABLE = "decoder.embed_positions.weight"  # a token reads one of its rows


@dataclass(frozen=True)
class TokenBytes:
    weights_mb: float
    cross_kv_mb: float
    self_kv_mb: float

    @property
    def total_mb(self) -> float:
        return self.weights_mb + self.cross_kv_mb + self.self_kv_mb

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 2) for k, v in {**asdict(self), "total_mb": self.total_mb}.items()}


def graph_bytes(path) -> tuple[int, int]:
    """A graph's initializers' bytes, and the bytes of one row of its positional table (if any)."""
    import onnx
    from onnx import numpy_helper

    total, row = 0, 0
    for init in onnx.load(str(path)).graph.initializer:
        array = numpy_helper.to_array(init)
        if init.name == POSITIONS_TABLE:
            row = array.nbytes // array.shape[0]
            continue
        total += array.nbytes
    return total, row


def token_bytes(bundle: Bundle, precision: str, projection: str, steps_per_window: float,
                prompt: int = 1) -> TokenBytes:
    """Per token of a greedy window of `steps_per_window` steps after a `prompt` of that many tokens."""
    shortlisted = projection == "shortlist"
    graph, row = graph_bytes(bundle.graph(SHORTLIST_STEP_ROLE if shortlisted else "decoder_step", precision))
    weights = float(graph + row + bundle.d_model * FLOAT32)  # the positional row and the token table's row
    if shortlisted:
        weights += int(bundle.shortlist["candidates"]) * bundle.d_model  # the candidates' int8 rows
        weights += graph_bytes(bundle.graph(VERIFY_ROLE, "int8"))[0] / max(1.0, steps_per_window)
    layer_kv = 2 * bundle.d_model * FLOAT32 * bundle.decoder_layers  # one position's keys and values
    cross = layer_kv * (bundle.audio.n_positions + 1)
    cached = layer_kv * (prompt + steps_per_window / 2)
    return TokenBytes(weights / MB, cross / MB, cached / MB)
