"""The two-stage vocabulary projection (`edgeasr models import --with shortlist`).

A greedy step of the default graph multiplies the final hidden state by the whole int8 token
table (51,865 rows: two thirds of the bytes a tiny.en token reads) for one winning token. With
this extra the bundle holds, made from its own int8 decoder step:

- `decoder_step_shortlist` (int8): the step up to the final layer norm, then
  - `scores` [1, T']: a cheap first pass over the pickable text tokens (the T' tokens below
    end-of-text that no rule suppresses): h @ B, B a rank-r basis [d, r], then the int8 rows of
    the projection in that basis (one scale per row);
  - `tail_logits` [1, tail]: the exact logits of the block [end-of-text, the window's last
    timestamp] (the specials, the languages, every timestamp a window allows), with the step's
    own operators, so bit-identical to the full projection's;
  - `hidden_q`, `hidden_scale`, `hidden_zp`: the hidden state as the int8 projection quantizes
    it, from which the host computes any row's exact logit;
- `projection_rows.int8.npy` [V, d]: the projection's int8 rows, for the host's exact rescoring
  of the candidates;
- `decoder_verify` (int8): a window's steps at once over the T' text columns: their exact
  logits (bit-identical to the full projection's), their best few and log-sum-exp (the table
  read once a window, not once a token). A step's whole row is its text logits from here, its
  tail block's from the step and the rest (the suppressed text tokens, the timestamps past the
  window) from the int8 rows: no third copy of the table.

The runtime (asr/shortlist.py) decodes a window on the shortlist and verifies it; a step whose
best text token was not a candidate is taken from its full row and the window goes on from
there, so the texts are the full projection's.

The basis: where the weights are known (their sha256), the one fitted on real decodes and
shipped beside known.json (`shortlist/<sha256>.npy`, made by the lab's `edgeasr models
fit-shortlist`); for other weights a data-free one, the projection's own top singular
directions (fewer winners in the candidates: more steps redone, the same texts).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeasr.bundle import shortlist_text_ids
from edgeasr.errors import ModelError

# first-pass rank: a rank-64 basis fit on real hidden states keeps the exact pick among the
# best 512 in 99.4 % of tiny.en's held-out steps, 3.4 MB a token (plain SVD: 87 %)
RANK = 64
# candidates rescored exactly per step: at 512, 6 % of a window's steps are redone (15 % at 256)
CANDIDATES = 512
# best text tokens the verification returns per step: the first one a rule did not mask by id
# (the blank at the start of text) is the step's best
VERIFY_TOP = 4
KNOWN_BASES = Path(__file__).with_name("shortlist")
STEP_ROLE, VERIFY_ROLE, ROWS_ROLE = "decoder_step_shortlist", "decoder_verify", "projection_rows"
ROWS_FILE = "projection_rows.int8.npy"


@dataclass(frozen=True)
class Projection:
    """The int8 step's vocabulary projection as the quantizer wrote it: logits =
    MatMulInteger(q, weight, zp, 0) -> Cast -> Mul(scale_h * weight_scale)."""

    weight: np.ndarray  # [d, V] int8, zero point 0
    weight_name: str
    weight_scale: np.ndarray  # float32 scalar, per tensor
    nodes: tuple[str, ...]  # the MatMulInteger, Cast and output Mul nodes
    hidden: str  # the final layer norm's output
    quantized: tuple[str, str, str]  # its q, scale and zero point (DynamicQuantizeLinear)
    scales: str  # scale_h * weight_scale, as the step computes it


def find_projection(model) -> Projection:
    """The projection at the end of an int8 step graph (the Mul that outputs `logits`)."""
    from onnx import numpy_helper

    producer = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name: i for i in model.graph.initializer}
    out = producer.get("logits")
    cast = producer.get(out.input[0]) if out is not None else None
    matmul = producer.get(cast.input[0]) if cast is not None else None
    if out is None or out.op_type != "Mul" or cast is None or matmul is None or matmul.op_type != "MatMulInteger":
        raise ModelError("the decoder step's projection is not the int8 MatMulInteger the quantizer writes")
    q, weight, zp, weight_zp = matmul.input
    scales = producer[out.input[1]]
    dql = producer[q]
    if numpy_helper.to_array(inits[weight_zp]).any():
        raise ModelError("the decoder step's projection has a weight zero point")
    return Projection(numpy_helper.to_array(inits[weight]), weight, numpy_helper.to_array(inits[scales.input[1]]),
                      (matmul.name, cast.name, out.name), dql.input[0], (dql.output[0], dql.output[1], dql.output[2]),
                      scales.output[0])


def fit_basis(weight: np.ndarray, second_moment: np.ndarray, rank: int = RANK) -> np.ndarray:
    """An orthonormal basis [d, rank] of the subspace that keeps most of the logits' energy over
    hidden states whose second moment E[h h^T] is `second_moment`: the span of C^1/2 v_k, v_k the
    top right singular vectors of W C^1/2 (`weight` W [rows, d] dequantized)."""
    values, vectors = np.linalg.eigh(second_moment.astype(np.float64))
    half = (vectors * np.sqrt(np.maximum(values, 0))) @ vectors.T
    _, _, vt = np.linalg.svd(weight.astype(np.float64) @ half, full_matrices=False)
    q, _ = np.linalg.qr(half @ vt[:rank].T)
    return q.astype(np.float32)


def svd_basis(weight: np.ndarray, rank: int = RANK) -> np.ndarray:
    """The data-free basis: the projection's own top right singular directions [d, rank]."""
    _, _, vt = np.linalg.svd(weight.astype(np.float32), full_matrices=False)
    return np.ascontiguousarray(vt[:rank].T)


def known_basis(weights_sha256: str) -> np.ndarray | None:
    """The basis fitted on real decodes of these weights and shipped with edgeasr, if any."""
    path = KNOWN_BASES / f"{weights_sha256}.npy"
    return np.load(path).astype(np.float32) if weights_sha256 and path.is_file() else None


def text_rows(step_int8: Path, suppress_tokens: list[int], eot: int) -> np.ndarray:
    """The projection's dequantized rows of the first pass's text tokens [T', d], from an int8 step."""
    import onnx

    proj = find_projection(onnx.load(str(step_int8)))
    return proj.weight.T[shortlist_text_ids(suppress_tokens, eot)].astype(np.float32) * proj.weight_scale


def write_shortlist(step_int8: Path, out: Path, suppress_tokens: list[int], eot: int, tail_end: int,
                    basis: np.ndarray) -> tuple[dict[str, str], float]:
    """The extra's files in `out` from the int8 step `step_int8`; returns them by role, and the
    projection's weight scale (the host's exact rescoring multiplies by it)."""
    import onnx

    model = onnx.load(str(step_int8))
    proj = find_projection(model)
    d, v = proj.weight.shape
    if basis.shape[0] != d:
        raise ModelError(f"a shortlist basis of {basis.shape[0]} rows for a decoder of width {d}")
    text_ids = shortlist_text_ids(suppress_tokens, eot)
    np.save(out / ROWS_FILE, np.ascontiguousarray(proj.weight.T))
    _step(model, proj, text_ids, eot, min(v, tail_end), basis)
    onnx.save(model, str(out / f"{STEP_ROLE}.int8.onnx"))
    onnx.save(verify_graph(proj, text_ids), str(out / f"{VERIFY_ROLE}.int8.onnx"))
    roles = {f"{STEP_ROLE}_int8": f"{STEP_ROLE}.int8.onnx", ROWS_ROLE: ROWS_FILE,
             f"{VERIFY_ROLE}_int8": f"{VERIFY_ROLE}.int8.onnx"}
    return roles, float(proj.weight_scale)


def _step(model, proj: Projection, text_ids: np.ndarray, tail_start: int, tail_end: int,
          basis: np.ndarray) -> None:
    """The int8 step with the first pass and the exact tail block instead of the projection."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    g = model.graph
    renamed = dict(zip(proj.quantized, ("hidden_q", "hidden_scale", "hidden_zp")))
    kept = [n for n in g.node if n.name not in proj.nodes]
    for node in kept:
        node.input[:] = [renamed.get(x, x) for x in node.input]
        node.output[:] = [renamed.get(x, x) for x in node.output]
    del g.node[:]
    g.node.extend(kept)
    inits = [i for i in g.initializer if i.name != proj.weight_name]
    del g.initializer[:]
    g.initializer.extend(inits)
    outputs = [o for o in g.output if o.name != "logits"]
    del g.output[:]
    g.output.extend(outputs)

    # the first pass: z = h @ B, then the rows of the projection in that basis, int8 per row
    rows = proj.weight.T[text_ids].astype(np.float32) * proj.weight_scale @ basis  # [T', r]
    row_scale = np.abs(rows).max(axis=1) / 127
    row_scale[row_scale == 0] = 1
    rows8 = np.clip(np.rint(rows / row_scale[:, None]), -127, 127).astype(np.int8)
    g.initializer.extend(numpy_helper.from_array(a, n) for n, a in {
        "shortlist.basis": basis.astype(np.float32), "shortlist.rows": np.ascontiguousarray(rows8.T),
        "shortlist.row_scale": row_scale.astype(np.float32), "shortlist.zero_point": np.int8(0),
        "shortlist.tail": np.ascontiguousarray(proj.weight[:, tail_start:tail_end])}.items())
    g.node.extend([
        # the tail block: the full projection's operators on its columns (bit-identical logits)
        helper.make_node("MatMulInteger", ["hidden_q", "shortlist.tail", "hidden_zp", "shortlist.zero_point"],
                         ["tail_acc"], name="/tail/MatMulInteger"),
        helper.make_node("Cast", ["tail_acc"], ["tail_accf"], to=TensorProto.FLOAT, name="/tail/Cast"),
        helper.make_node("Mul", ["tail_accf", proj.scales], ["tail_logits"], name="/tail/Mul"),
        helper.make_node("MatMul", [proj.hidden, "shortlist.basis"], ["first_z"], name="/first/Basis"),
        helper.make_node("DynamicQuantizeLinear", ["first_z"], ["first_zq", "first_zs", "first_zzp"],
                         name="/first/Quantize"),
        helper.make_node("MatMulInteger", ["first_zq", "shortlist.rows", "first_zzp", "shortlist.zero_point"],
                         ["first_acc"], name="/first/MatMulInteger"),
        helper.make_node("Cast", ["first_acc"], ["first_accf"], to=TensorProto.FLOAT, name="/first/Cast"),
        helper.make_node("Mul", ["first_zs", "shortlist.row_scale"], ["first_scales"], name="/first/Scales"),
        helper.make_node("Mul", ["first_accf", "first_scales"], ["scores"], name="/first/Mul"),
    ])
    d = proj.weight.shape[0]
    g.output.extend([
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, len(text_ids)]),
        helper.make_tensor_value_info("tail_logits", TensorProto.FLOAT, [1, tail_end - tail_start]),
        helper.make_tensor_value_info("hidden_q", TensorProto.UINT8, [1, d]),
        helper.make_tensor_value_info("hidden_scale", TensorProto.FLOAT, []),
        helper.make_tensor_value_info("hidden_zp", TensorProto.UINT8, []),
    ])
    model.graph.name = "whisper_decoder_step_shortlist"
    onnx.checker.check_model(model)


def verify_graph(proj: Projection, text_ids: np.ndarray):
    """q [n, d] uint8, zp [n, 1] int32, scale [n, 1] (n steps' quantized hidden states) -> over
    the T' text columns, the exact `logits` [n, T'], their best VERIFY_TOP (`top_logits`, and
    `top_ids` as token ids) and their log-sum-exp `lse_text` [n]. (q - zp).w = q.w - zp * colsum(w) are the integers
    the step's MatMulInteger makes, scaled as it scales them: the step's logits to the bit."""
    from onnx import TensorProto

    from edgeasr.models.graphs import DECODER_OPSET
    from edgeasr.models.onnx_builder import GraphBuilder

    d = proj.weight.shape[0]
    weight = np.ascontiguousarray(proj.weight[:, text_ids])
    b = GraphBuilder(DECODER_OPSET)
    q, zp, scale = b.input("q", ["n", d], np.uint8), b.input("zp", ["n", 1], np.int32), b.input("scale", ["n", 1])
    b.output("logits", ["n", weight.shape[1]])
    for name, dtype in (("top_logits", np.float32), ("top_ids", np.int64), ("lse_text", np.float32)):
        b.output(name, ["n", VERIFY_TOP] if name != "lse_text" else ["n"], dtype)
    acc = b.op("MatMulInteger", q, b.constant("weight", weight), b.constant("q_zero", np.zeros((), np.uint8)),
               b.constant("weight_zero", np.zeros((), np.int8)))
    colsum = b.constant("colsum", weight.astype(np.int32).sum(axis=0, dtype=np.int32)[None])
    centred = b.op("Sub", acc, b.op("Mul", zp, colsum))
    scales = b.op("Mul", scale, b.constant("weight_scale", np.asarray(proj.weight_scale, np.float32)))
    logits = b.op("Mul", b.op("Cast", centred, to=TensorProto.FLOAT), scales, out="logits")
    top, at = b.op_n("TopK", 2, logits, b.ints("top", [VERIFY_TOP]), axis=1, out=["top_logits", None])
    b.op("Gather", b.ints("text_ids", text_ids), at, axis=0, out="top_ids")
    axis = b.ints("axis.1", [1])
    best = b.op("Slice", top, b.ints("zero", [0]), axis, axis)  # [n, 1]: each row's maximum
    total = b.op("ReduceSum", b.op("Exp", b.op("Sub", logits, best)), axis, keepdims=1)
    b.op("Squeeze", b.op("Add", b.op("Log", total), best), axis, out="lse_text")
    return b.model("whisper_decoder_verify")
