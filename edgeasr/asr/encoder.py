"""Encoder backends: log-mel window -> audio features, on the CPU (onnxruntime) or a Hailo NPU.

The backend is chosen by a pure function of the request and what is present, so the
choice can be tested without either runtime; `edgeasr.asr.hailo` is imported only when
the hailo backend is chosen. Either backend comes wrapped in a SupervisedEncoder
(edgeasr.asr.supervision), which reopens the device after failures and reports its health.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from edgeasr.asr.supervision import SupervisedEncoder
from edgeasr.bundle import Bundle
from edgeasr.config import ENCODER_BACKENDS, EncoderConfig
from edgeasr.errors import ConfigError, DeviceError, ModelError

log = logging.getLogger(__name__)

# The CPU encoder's windows, as parts of the full one: a window whose audio ends early is
# encoded over the smallest that holds its audio (whisper.cpp's audio_ctx), and the decoder
# reads the rest as the silence row. The full window only: with (0.75, 1.0) a command took
# 1/1.22 of the time, base's short pool utterances lost 0.5 points of WER, but tiny.en lost 2
# of 315 commands with the home's vocabulary and 3 without (the pool's WER 7.03 -> 7.09 %);
# quarter and half windows made short commands repeat their end ("What time is it? What time"),
# past the audio the silence row or, position by position, the encoder's output for silence.
WINDOW_PARTS = (1.0,)


class Encoder(Protocol):
    backend: str

    def encode(self, mel: np.ndarray) -> np.ndarray:
        """NHWC mel [1, 1, n_frames, n_mels] float32 -> audio features [1, n_positions, d_model]."""

    def close(self) -> None: ...


def choose_backend(requested: str, *, hailo_present: bool, hef_present: bool) -> str:
    """`auto` means the NPU when its SDK, a device and a compiled HEF are all there."""
    if requested not in ENCODER_BACKENDS:
        raise ConfigError(f"encoder.backend: {requested!r} is not allowed ({', '.join(ENCODER_BACKENDS)})")
    if requested == "auto":
        return "hailo" if hailo_present and hef_present else "onnx"
    if requested == "hailo" and not hailo_present:
        raise DeviceError(
            "encoder.backend is hailo but no Hailo device or HailoRT (hailo_platform) is present"
        )
    return requested


def ort_session(path: Path, threads: int, spin_after_run_us: int = 0, arena: bool = False):
    """An onnxruntime CPU session with a pool of `threads` threads that sleep, never spin,
    while they wait for work.

    A spinning pool holds its cores between operators, and an operator waits for its slowest
    thread: beside other work (Home Assistant on the same Pi) every operator then waits for
    the scheduler. Against spinning (within a run, and 1 ms after each decoder step), on two
    shared cores with other work on them, interleaved: the encoder 0.51x to 0.75x the time
    per window, the decoder 0.43x to 0.55x per token, under every load `edgeasr bench --load`
    knows. Two sleeping threads beat one as well (the scheduler gives two threads two shares
    of a busy core), except beside a process that wakes every 5 ms: the encoder 391 ms on two,
    323 on one.
    On an idle machine sleeping costs the encoder about 3 % (noise) and the decoder 13-17 % per
    token; `decoder.spin` (`spin_after_run_us`: how long threads stay awake after a run, for
    the next one) buys that back where nothing else runs.

    `arena`: keep the buffers from run to run (a graph whose intermediates are megabytes, run
    again and again: the shortlist's verification, 6.2 -> 3.6 ms for 20 steps).
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    # no arena and no memory pattern: buffers are freed after each run instead of kept for
    # the largest input seen; peak RSS 254 -> 202 MB on the dev set at the same speed
    opts.enable_cpu_mem_arena = arena
    opts.enable_mem_pattern = arena
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin_after_run_us else "0")
    if spin_after_run_us:
        opts.add_session_config_entry("session.intra_op.spin_duration_us", str(spin_after_run_us))
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    try:
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except (state.Fail, state.InvalidGraph, state.InvalidProtobuf, state.NoSuchFile, state.EngineError,
            RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{path}: onnxruntime cannot load this graph ({first}); re-create the bundle "
                         "with `edgeasr models import`") from exc


def warm_run(session, sizes: dict[str, int]) -> None:
    """One run of `session` on zeros, its named dimensions `sizes`, into buffers of its own: a
    graph's first run at a shape costs more than its next ones (buffers first allocated and
    touched), which a run here pays ahead, beside whatever else runs the session (onnxruntime's
    runs are thread-safe)."""
    feeds = {i.name: np.zeros([d if isinstance(d, int) else sizes[d] for d in i.shape],
                              np.int64 if i.type == "tensor(int64)" else np.float32)
             for i in session.get_inputs()}
    session.run(None, feeds)


def window_sizes(n_frames: int, parts: tuple[float, ...] = WINDOW_PARTS) -> tuple[int, ...]:
    """The encoder's window sizes in mel frames (even: the second convolution halves them)."""
    return tuple(sorted({2 * max(1, round(n_frames * part / 2)) for part in parts} | {n_frames}))


def audio_frames(mel: np.ndarray) -> int:
    """The frames of an NHWC log-mel window before its padding: the trailing frames that are
    all at the window's floor (zero audio, or the clamp 8 decades below the loudest) hold none."""
    frames = mel[0, 0]
    floor = frames.min()
    holding = np.flatnonzero((frames != floor).any(axis=1))
    return int(holding[-1]) + 1 if len(holding) else 0


class OnnxEncoder:
    """The encoder in onnxruntime. A graph that takes any number of frames (the bundle's int8
    one) encodes a window over the smallest of `frame_sizes` that holds its audio."""

    backend = "onnx"

    def __init__(self, bundle: Bundle, precision: str = EncoderConfig.precision,
                 threads: int = EncoderConfig.threads, role: str | None = None,
                 parts: tuple[float, ...] = WINDOW_PARTS) -> None:
        role = role or ("encoder_int8" if precision == "int8" else "encoder")
        self.session = ort_session(bundle.path(role), threads)
        mel = self.session.get_inputs()[0]
        self.input_name = mel.name
        any_length = isinstance(mel.shape[2], str)  # a named axis: the frames are the input's
        sizes = window_sizes(bundle.audio.n_frames, parts)
        # one size is the full window: no window is cut, so none is scanned for its audio
        self.frame_sizes = sizes if any_length and len(sizes) > 1 else ()

    def encode(self, mel: np.ndarray) -> np.ndarray:
        if self.frame_sizes and mel.shape[2] == self.frame_sizes[-1]:
            needed = audio_frames(mel)
            mel = mel[:, :, : next(size for size in self.frame_sizes if size >= needed)]
        return self.session.run(None, {self.input_name: np.ascontiguousarray(mel, np.float32)})[0]

    def close(self) -> None:
        self.session = None


def create_encoder(
    bundle: Bundle,
    options: EncoderConfig,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> SupervisedEncoder:
    """The encoder the `encoder:` config section asks for (backend auto: the NPU when present),
    opened, inside a SupervisedEncoder that reopens its device after failures (clock and sleep:
    for its backoff, injectable in tests). The one place the backend is chosen."""
    from importlib.util import find_spec

    hef = options.hef or (bundle.path("encoder_hef") if bundle.has("encoder_hef") else None)
    hailo_present = False
    if options.backend != "onnx" and find_spec("hailo_platform") is not None:
        from edgeasr.asr.hailo import hailo_available

        hailo_present = hailo_available()
    chosen = choose_backend(options.backend, hailo_present=hailo_present,
                            hef_present=hef is not None and hef.is_file())
    log.info("encoder backend: %s (requested %s)", chosen, options.backend)
    open_encoder: Callable[[], Encoder]
    if chosen == "hailo":
        if hef is None or not hef.is_file():
            raise DeviceError(f"encoder.hef: no compiled HEF at {hef} (run `edgeasr models compile-hef`)")
        from edgeasr.asr.hailo import HailoEncoder

        def open_encoder() -> Encoder:
            return HailoEncoder(hef, bundle, options.timeout_ms, options.scheduler, options.service_group)
    else:
        def open_encoder() -> Encoder:
            return OnnxEncoder(bundle, options.precision, options.threads)
    return SupervisedEncoder(open_encoder, max_failures=options.max_failures,
                             reopen_timeout_s=options.reopen_timeout_s, clock=clock, sleep=sleep)
