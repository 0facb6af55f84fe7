"""A CPU-bound probe of the kinds of work the default bundle's import does: pure Python (the
graph builder's loops), numpy (int8 quantization of a weight matrix, a matrix product on one
thread), onnx (building and serializing a graph) and onnxruntime (a session opened and run on
one thread). Prints one JSON object: each part's CPU seconds, the least of a few rounds.

packaging/arm64-install-check.sh --speed runs it natively and in the emulated arm64 root, in
turns, to measure the emulator's slowdown per kind of work; see packaging/README.md.
"""

import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core, as the comparison needs

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

ROUNDS = 3
WIDTH, DEPTH = 384, 1536  # Whisper tiny's d_model and MLP width
BUILT_NODES, RUN_NODES = 4000, 400  # nodes of the graph built, and of the graph run
OPSET = 17


def python_part() -> None:
    words = [f"w{i % 997}x{i}" for i in range(200_000)]
    counts: dict[str, int] = {}
    for word in words:
        key = word.split("x")[0]
        counts[key] = counts.get(key, 0) + len(word)
    sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def numpy_part() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((DEPTH, WIDTH)).astype(np.float32)
    for _ in range(20):
        scale = np.abs(w).max(axis=1, keepdims=True) / 127
        q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
        w = (q.astype(np.float32) * scale) @ np.eye(WIDTH, dtype=np.float32)


def onnx_part(n_nodes: int) -> bytes:
    rng = np.random.default_rng(0)
    nodes, inits, last = [], [], "x"
    for i in range(n_nodes):
        inits.append(numpy_helper.from_array(rng.standard_normal(WIDTH).astype(np.float32), f"b{i}"))
        nodes.append(helper.make_node("Add", [last, f"b{i}"], [f"h{i}"]))
        last = f"h{i}"
    graph = helper.make_graph(nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
                              [helper.make_tensor_value_info(last, TensorProto.FLOAT, [1, WIDTH])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]).SerializeToString()


def onnxruntime_part(model: bytes) -> None:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    x = np.ones((1, WIDTH), np.float32)
    for _ in range(200):
        session.run(None, {"x": x})


def cpu_seconds(part, *args) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.process_time()
        part(*args)
        best = min(best, time.process_time() - start)
    return round(best, 4)


if __name__ == "__main__":
    model = onnx_part(RUN_NODES)
    json.dump({"python": cpu_seconds(python_part), "numpy": cpu_seconds(numpy_part),
               "onnx": cpu_seconds(onnx_part, BUILT_NODES), "onnxruntime": cpu_seconds(onnxruntime_part, model),
               "machine": os.uname().machine}, sys.stdout)
    print()
