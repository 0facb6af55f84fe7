"""Whisper's decoder on the CPU, with a KV cache: its options, its session, a window's prompt.

`DecoderSession` runs the bundle's two decoder graphs through onnxruntime: the
cross-attention K/V once per window (into buffers the step reads in place), then per
token the step (fed the token's row of the token table; it returns the logits). The
self-attention cache is a preallocated [layers, 2, n_text_ctx, d_model] buffer that the
step reads in place, of which it uses the first `offset` rows; only the step's new rows
are copied in after it. Every input and output is bound once by address (IOBinding), so
a step of one token binds nothing. `greedy.decode_window` decodes a window with it; `prime`
and `score_texts` read given texts against a window. With decoder.projection: shortlist the step
is the bundle's two-stage one (asr/shortlist.py): `step_short` gives a step's shortlist, and
`step` the whole row as before.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgeasr.asr.encoder import ort_session, warm_run
from edgeasr.asr.shortlist import ShortlistProjection, ShortRow
from edgeasr.asr.tail import PaddingRows, WindowEnd
from edgeasr.bundle import SCORE_ROLE, SHORTLIST_STEP_ROLE, TOKEN_TABLE_ROLE, Bundle
from edgeasr.config import DecoderConfig, ModelConfig
from edgeasr.errors import ConfigError, ModelError

# how long the step's threads stay awake after a run, for the next token's (microseconds)
STEP_SPIN_US = 1000


def logsumexp(x: np.ndarray) -> float:
    m = np.max(x)
    return float(m + np.log(np.sum(np.exp(x - m)))) if np.isfinite(m) else float(m)


def logsumexp_rows(x: np.ndarray) -> np.ndarray:
    """logsumexp of each row of x [n, V] (finite)."""
    m = x.max(axis=1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]


def logprob_of_max(x: np.ndarray, index: int, scratch: np.ndarray) -> float:
    """log-softmax at `index`, the position of x's maximum (the greedy pick): -log sum
    exp(x - max), worked out in `scratch` (an array like x). The argmax already found the
    maximum, and no temporaries are made (measured: 59 -> 46 us per token)."""
    np.subtract(x, x[index], out=scratch)
    np.exp(scratch, out=scratch)
    return -math.log(float(scratch.sum()))


@dataclass(frozen=True)
class DecodingOptions:
    """How a window is decoded. The defaults are plain greedy decoding as Whisper was trained
    for (what `edgeasr models calibrate` starts from); a bundle's calibrated values or a preset
    replace them."""

    # multilingual bundles: language code, or None to detect it per window
    language: str | None = None
    # "transcribe" (X -> X) or "translate" (X -> English)
    task: str = ModelConfig.task
    # pad the audio features to this many positions with the encoder's output for silence
    # (0 = no padding); the decoder was trained on 1500
    encoder_padding: int = 1500
    # >1 lowers the logits of text tokens used in the last `repetition_window` tokens
    repetition_penalty: float = 1.0
    repetition_window: int = 16
    # end the window once p(end-of-text) reaches this (None: plain greedy; from 0.5 up it
    # changes no greedy pick: end-of-text is then the likeliest token anyway)
    eos_threshold: float | None = None
    # token cap per window = this * window seconds (runaway loops stop here)
    max_tokens_per_s: float = DecoderConfig.max_tokens_per_s
    # the first timestamp must come within this many seconds
    max_initial_timestamp_s: float = 1.0
    # 0: greedy; above: sample from the softmax of logits / temperature (the fallback's retries)
    temperature: float = 0.0
    # later windows of the same audio get the text kept so far as prompt (openai's option)
    condition_on_previous_text: bool = False
    # the request's names and terms, tokenized (asr/vocabulary.py): their tokens get a boost
    keyterms: tuple[tuple[int, ...], ...] = ()
    keyterm_boost: float = 0.0


# Named presets a user may pick instead of the bundle's calibrated values (chosen on tiny.en's
# dev set): padding, penalty, EOS threshold. A bundle's default is
# its calibration (`edgeasr models calibrate`, cross-validated by speaker), and where it
# holds none, plain decoding (DecodingOptions' defaults).
PRESETS: dict[str, dict] = {
    "conservative": dict(encoder_padding=1500, repetition_penalty=1.3, eos_threshold=0.3),
    "balanced": dict(encoder_padding=700, repetition_penalty=1.1, eos_threshold=0.5),
    "aggressive": dict(encoder_padding=0, repetition_penalty=1.0, eos_threshold=None),
}
# what `edgeasr models calibrate` measures and a bundle's manifest may hold (`decoding`)
CALIBRATED = ("encoder_padding", "repetition_penalty", "eos_threshold", "condition_on_previous_text")


def preset_options(name: str | None, calibrated: dict | None = None, **overrides) -> DecodingOptions:
    """A preset's options, or with name None the bundle's `calibrated` values (plain decoding
    for what was not calibrated); then the `overrides` that are not None."""
    if name is not None and name not in PRESETS:
        raise ConfigError(f"decoder.preset: {name!r} is not allowed ({', '.join(PRESETS)})")
    if name is None:
        values = {k: v for k, v in (calibrated or {}).items() if k in CALIBRATED}
    else:
        values = dict(PRESETS[name])
    values.update({k: v for k, v in overrides.items() if v is not None})
    return replace(DecodingOptions(), **values)


@dataclass
class WindowResult:
    tokens: list[int]  # generated tokens (text and timestamps), end-of-text excluded
    logprobs: list[float]  # log-probability of each generated token
    no_speech_prob: float
    language: str
    hit_cap: bool  # stopped by the token cap, not by end-of-text
    timings_ms: dict[str, float] = field(default_factory=dict)

    @property
    def avg_logprob(self) -> float:
        return sum(self.logprobs) / max(1, len(self.logprobs))


class TableRows:
    """Rows of a 2-D float32 .npy table, read from the file when asked for. The token
    table is the model's largest tensor and a window uses a few dozen of its rows; a
    memory map would not do (measured: the kernel maps neighbouring pages on each fault,
    and resident memory grew by 115 MB over the dev set)."""

    def __init__(self, path: Path) -> None:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)
            self._offset = f.tell()
        if len(shape) != 2 or fortran or dtype != np.float32:
            raise ModelError(f"{path}: not a float32 [rows, columns] table")
        self.shape = shape
        self._row_bytes = shape[1] * 4
        self._path = path
        self._fd = os.open(path, os.O_RDONLY)

    def read(self, ids: list[int], out: np.ndarray) -> None:
        """Rows `ids` into `out` [len(ids), columns], in place."""
        for i, row in enumerate(ids):
            if os.preadv(self._fd, [out[i]], self._offset + row * self._row_bytes) != self._row_bytes:
                raise ModelError(f"{self._path}: no row {row}")


class DecoderSession:
    def __init__(self, bundle: Bundle, precision: str = DecoderConfig.precision,
                 threads: int = DecoderConfig.threads, spin: bool = DecoderConfig.spin,
                 projection: str = DecoderConfig.projection) -> None:
        """`projection` "shortlist": the step is the bundle's two-stage one (`step_short`); `step`
        then adds the full projection to it, the same logits to the bit."""
        self.bundle, self.spin = bundle, spin
        if projection == "shortlist" and precision != "int8":
            raise ConfigError("decoder.projection: shortlist needs decoder.precision int8")
        self.shortlist = ShortlistProjection(bundle, threads) if projection == "shortlist" else None
        self.cross = ort_session(bundle.graph("decoder_cross", precision), threads)
        # the step is run token after token, ~0.2 ms apart (the logit rules): with `spin`, its
        # threads spin through the gap instead of sleeping (see encoder.ort_session)
        role = SHORTLIST_STEP_ROLE if self.shortlist is not None else "decoder_step"
        self.step_session = ort_session(bundle.graph(role, precision), threads, STEP_SPIN_US if spin else 0)
        # per layer, self-attention K and V: the first `length` rows are filled
        self.cache = np.zeros((bundle.decoder_layers, 2, bundle.n_text_ctx, bundle.d_model), np.float32)
        self.embedding = TableRows(bundle.path(TOKEN_TABLE_ROLE))
        self.padding_rows = PaddingRows(bundle)
        self.logits = np.zeros((1, bundle.n_vocab), np.float32)
        self.scratch = np.zeros(bundle.n_vocab, np.float32)  # for the logit maths of the loop
        self.offset = np.zeros(1, np.int64)  # cached positions, the step's `offset` input
        self.binding = self.step_session.io_binding()
        if self.shortlist is None:
            self.binding.bind_output("logits", "cpu", 0, np.float32, list(self.logits.shape),
                                     self.logits.ctypes.data)
        else:  # the first pass's scores, the tail block's logits, the quantized hidden state
            d, sl = bundle.d_model, self.shortlist
            self._short: dict[str, np.ndarray] = {
                "scores": np.zeros((1, len(sl.text_ids)), np.float32),
                "tail_logits": np.zeros((1, len(sl.tail_ids)), np.float32),
                "hidden_q": np.zeros((1, d), np.uint8), "hidden_scale": np.zeros((), np.float32),
                "hidden_zp": np.zeros((), np.uint8)}
            for name, array in self._short.items():
                self.binding.bind_output(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
        self.binding.bind_input("offset", "cpu", 0, np.int64, [1], self.offset.ctypes.data)
        for i in range(bundle.decoder_layers):
            for j, kind in enumerate("kv"):
                self.binding.bind_input(f"self_{kind}{i}", "cpu", 0, np.float32,
                                        list(self.cache.shape[2:]), self.cache[i, j].ctypes.data)
        # per step of n tokens, their rows of the token table go in here and the new cache
        # rows come out here (bound again only when n changes): binding nothing per step
        # saves ~80 us per token over binding the cache's first P rows each time (measured)
        self._rows = np.zeros((0, bundle.d_model), np.float32)
        self._new = np.zeros((bundle.decoder_layers, 2, 0, bundle.d_model), np.float32)
        self.cross_binding = self.cross.io_binding()
        self._cross_positions = 0
        self._cross: dict[str, np.ndarray] = {}
        self.cross_bias = np.zeros(0, np.float32)
        self.length = 0
        self.windows = 0  # cross K/V computed so far: what was read of one window is known by it
        # the encoder output (a new array per window), padding and window end `start` last ran
        self._window: tuple[np.ndarray, int, WindowEnd | None] | None = None
        # the step with every position's logits, where the bundle has it (made on first use:
        # only texts read by teacher forcing need it)
        self._score_graph = bundle.graph(SCORE_ROLE, precision) if bundle.has_graph(SCORE_ROLE, precision) else None
        self._score_session: Any = None
        self._score_lock = threading.Lock()  # `ready_scoring` may make it on another thread
        self._threads = threads

    def start(self, audio_features: np.ndarray, padding: int, end: WindowEnd | None = None) -> None:
        """Cross-attention K/V for a window; resets the self-attention cache.

        The decoder was trained on 30 s windows: 1500 positions, past the speech the
        encoder's output for the silence after it. Padding to `padding` positions stands for
        those without computing them: the window gets a few extra rows (`PaddingRows`: the
        tail map's K rows when its audio ends inside it, `end`, else one row for silence),
        whose attention scores are raised by log(count) so each weighs as the count of rows it
        stands for. Measured on the dev set, one silence row: WER 12.0 -> 10.2 % over zero rows.

        The same window again (a retry, the aligner, a command's readings) keeps its K/V.
        """
        window = (audio_features, padding, end)
        if self._window is not None and audio_features is self._window[0] and window[1:] == self._window[1:]:
            self.length = 0
            return
        t = audio_features.shape[1]
        bias = np.zeros(t, np.float32)
        if padding > t:
            rows, log_counts = self.padding_rows.rows(audio_features, padding - t, end)
            audio_features = np.concatenate([audio_features, rows[None]], axis=1)
            bias = np.concatenate([bias, log_counts])
        if audio_features.shape[1] != self._cross_positions:
            self._bind_cross(audio_features.shape[1])
        self.cross_binding.bind_cpu_input("audio_features", audio_features)
        self.cross.run_with_iobinding(self.cross_binding)
        self.binding.bind_cpu_input("cross_bias", bias)
        self.cross_bias = bias
        self.length = 0
        self._window = window
        self.windows += 1

    def _bind_cross(self, positions: int) -> None:
        """The cross-attention K/V land in buffers that the step graph reads in place; they
        are set up again only when a window's number of positions changes."""
        layers, heads, d = self.bundle.decoder_layers, self.bundle.decoder_heads, self.bundle.d_model
        shapes = {"k": [heads, d // heads, positions], "v": [heads, positions, d // heads]}
        self._cross = {kind: np.zeros((layers, *shape), np.float32) for kind, shape in shapes.items()}
        for i in range(layers):
            for kind, shape in shapes.items():
                address = self._cross[kind][i].ctypes.data
                self.cross_binding.bind_output(f"cross_{kind}{i}", "cpu", 0, np.float32, shape, address)
                self.binding.bind_input(f"cross_{kind}{i}", "cpu", 0, np.float32, shape, address)
        self._cross_positions = positions

    def cross_inputs(self) -> dict[str, np.ndarray]:
        """The window's cross K/V and score bias by graph input name, as `start` left them:
        what the word aligner and the beam's batched step read in place."""
        inputs = {f"cross_{kind}{i}": self._cross[kind][i] for kind in self._cross
                  for i in range(self.bundle.decoder_layers)}
        return {**inputs, "cross_bias": self.cross_bias}

    def step(self, tokens: list[int]) -> np.ndarray:
        """Feed tokens after the cached ones; returns the next token's logits [n_vocab].

        They are the session's output buffer: valid until the next step, and the caller
        may change them in place (the logit rules do), which saves a copy per token."""
        self._run(tokens)
        if self.shortlist is not None:
            short = self._short
            row = self.shortlist.tail_row(short["tail_logits"][0], short["hidden_q"][0], float(short["hidden_scale"]),
                                          int(short["hidden_zp"]))
            self.shortlist.full(row, self.logits[0])
        return self.logits[0]

    def step_short(self, tokens: list[int]) -> ShortRow:
        """`step` on the two-stage projection (decoder.projection: shortlist): the next token's
        scores over its shortlist."""
        if self.shortlist is None:
            raise ValueError("the session has no two-stage projection")
        self._run(tokens)
        short = self._short
        return self.shortlist.row(short["scores"][0], short["tail_logits"][0], short["hidden_q"][0],
                                  float(short["hidden_scale"]), int(short["hidden_zp"]))

    def _run(self, tokens: list[int]) -> None:
        """The step graph on tokens after the cached ones; their cache rows appended."""
        n, p = len(tokens), self.length
        if p + n > self.cache.shape[2]:
            raise ValueError("decoder context is full")
        if len(self._rows) != n:
            self._bind_rows(n)
        self.embedding.read(tokens, self._rows)
        self.offset[0] = p
        self.step_session.run_with_iobinding(self.binding)
        self.cache[:, :, p : p + n] = self._new
        self.length = p + n

    def every_logits(self, tokens: list[int], first: int = 0, keep: bool = False) -> np.ndarray | None:
        """The logits after each of tokens[first:] fed after the cached ones [n - first, n_vocab],
        in one run; None where the bundle has no scoring step. `keep`: the tokens' rows go into
        the cache, as `step` leaves them; else the cache is left as it was."""
        if self._score_graph is None or not tokens:
            return None
        session = self._scoring()
        n, p = len(tokens), self.length
        if p + n > self.cache.shape[2]:
            raise ValueError("decoder context is full")
        rows = np.zeros((n, self.bundle.d_model), np.float32)
        self.embedding.read(tokens, rows)
        feeds = {"token_embeddings": rows, "offset": np.array([p], np.int64), "first": np.array([first], np.int64),
                 **self.cross_inputs()}
        for i in range(self.bundle.decoder_layers):
            feeds[f"self_k{i}"], feeds[f"self_v{i}"] = self.cache[i, 0], self.cache[i, 1]
        kept = [f"new_{kind}{i}" for i in range(self.bundle.decoder_layers) for kind in "kv"] if keep else []
        logits, *new = session.run(["logits", *kept], feeds)
        if keep:
            self.cache[:, :, p : p + n] = np.reshape(new, self.cache[:, :, p : p + n].shape)
            self.length = p + n
        return logits

    def _scoring(self) -> Any:
        assert self._score_graph is not None  # asked for only where the bundle has it
        with self._score_lock:
            if self._score_session is None:
                self._score_session = ort_session(self._score_graph, self._threads)
            return self._score_session

    def ready_scoring(self, tokens: int) -> None:
        """The scoring step made (where the bundle has it) and run once on `tokens` tokens, off
        this session's buffers: made on first use, it kept the first command read with a home's
        sentences waiting 89 ms (base, measured); a decoding may run beside this."""
        if self._score_graph is not None and self._score_session is None:  # else made, and run
            warm_run(self._scoring(), {"n": tokens, "positions": self.bundle.audio.n_positions})

    def _bind_rows(self, n: int) -> None:
        layers, d = self.bundle.decoder_layers, self.bundle.d_model
        self._rows = np.zeros((n, d), np.float32)
        self.binding.bind_input("token_embeddings", "cpu", 0, np.float32, [n, d], self._rows.ctypes.data)
        self._new = np.zeros((layers, 2, n, d), np.float32)
        for i in range(layers):
            for j, kind in enumerate("kv"):
                self.binding.bind_output(f"new_{kind}{i}", "cpu", 0, np.float32, [n, d],
                                         self._new[i, j].ctypes.data)


def _detect_language(logits: np.ndarray, bundle: Bundle) -> str:
    langs = bundle.tokens.languages
    codes, ids = list(langs), np.fromiter(langs.values(), dtype=np.int64)
    return codes[int(np.argmax(logits[ids]))]


def start_sequence(bundle: Bundle, language: str | None, task: str = ModelConfig.task,
                   prompt: Sequence[int] = (), timestamps: bool = True) -> list[int]:
    """What every decoder feeds before the text (openai's sot_sequence): earlier text after
    <|startofprev|>, if any; the start of transcript; for multilingual bundles the language
    (None: not known yet, the sequence stops before it) and the task; without timestamps,
    <|notimestamps|>."""
    tok = bundle.tokens
    sequence = [tok.sot_prev, *prompt, tok.sot] if prompt else [tok.sot]
    if bundle.multilingual:
        if language is None:
            return sequence
        if language not in tok.languages:
            raise ConfigError(f"model.language: {language!r} is not a language of {bundle.name}")
        sequence += [tok.languages[language], tok.translate if task == "translate" else tok.transcribe]
    return sequence if timestamps else [*sequence, tok.no_timestamps]


def feed_prompt(session: DecoderSession, options: DecodingOptions,
                prompt: Sequence[int] = ()) -> tuple[np.ndarray, float, str]:
    """Run a window's start sequence (`start_sequence`) through the session just started: the
    first text token's logits, the no-speech probability and the language. The no-speech
    probability is read after the start of transcript, before the language and the task."""
    bundle, tok = session.bundle, session.bundle.tokens
    logits = session.step(start_sequence(bundle, None, options.task, prompt))  # up to the start of transcript
    no_speech_prob = float(np.exp(logits[tok.no_speech] - logsumexp(logits)))
    language = "en"
    if bundle.multilingual:
        language = options.language or _detect_language(logits, bundle)
        logits = session.step(start_sequence(bundle, language, options.task)[1:])  # the language and the task
    return logits, no_speech_prob, language


@dataclass(frozen=True)
class Primed:
    """A window's cross K/V and a prompt run through a session, then no-timestamps: where texts
    are read from (`score_texts`, the grammar's search), each from the same cache rows."""

    logits: np.ndarray  # the first text token's, read-only
    length: int  # the cache rows of the prompt
    text_score: float | None = None  # the text `prime` read after the prompt, as score_texts scores it


def prime(session: DecoderSession, audio_features: np.ndarray, options: DecodingOptions,
          end: WindowEnd | None = None, prompt: Sequence[int] = (), text: Sequence[int] = ()) -> Primed:
    """Start the session on a window and run the prompt: done once for every text read after it.
    With the language known, in one run (no no-speech probability is read before the text);
    `text` (its tokens) is then read in the same run and scored (`Primed.text_score`), where the
    bundle has the scoring step: measured, 6.5 ms against 10 for a prompt of 64 tokens and a
    text of 9 read one after the other."""
    session.start(audio_features, options.encoder_padding, end)
    bundle, language = session.bundle, options.language
    if bundle.multilingual and language is None:  # read from the logits after the start
        feed_prompt(session, options, prompt)
        start = []
    else:
        start = start_sequence(bundle, language, options.task, prompt)
    start.append(bundle.tokens.no_timestamps)
    every = session.every_logits([*start, *text], first=len(start) - 1, keep=True) if text else None
    if every is not None:
        session.length -= len(text)  # the text's rows are no part of the prompt
        logits, score = every[0].copy(), _mean_logprob(every, text, bundle.tokens.eot)
    else:
        logits, score = session.step(start).copy(), None
    logits.flags.writeable = False
    primed = Primed(logits, session.length, score)
    if text and score is None:  # no scoring step: the text read after the prompt
        primed = replace(primed, text_score=score_texts(session, primed, [text])[0])
    return primed


def score_texts(session: DecoderSession, primed: Primed, texts: Sequence[Sequence[int]]) -> list[float]:
    """How likely the decoder finds each text (its tokens, end-of-text added) for the window the
    session was `prime`d with: the mean log-probability per token, read by feeding the text
    (teacher forcing, without timestamps), no logit rule applied."""
    eot = session.bundle.tokens.eot
    scores = []
    for text in texts:
        session.length, logits, total = primed.length, primed.logits, 0.0
        every = session.every_logits(list(text))  # the bundle's scoring step: the text in one run
        if every is not None:
            scores.append(_mean_logprob(np.concatenate([primed.logits[None], every]), text, eot))
            continue
        sequence = [*text, eot]
        for i, token in enumerate(sequence):
            total += float(logits[token]) - logsumexp(logits)
            if i + 1 < len(sequence):
                logits = session.step([token])
        scores.append(total / len(sequence))
    return scores


def _mean_logprob(after: np.ndarray, text: Sequence[int], eot: int) -> float:
    """The mean log-probability of the text's tokens and the end of text, each read from its
    row of `after` (the logits before the text's first token, then after each of its tokens)."""
    lp = after[np.arange(len(text) + 1), [*text, eot]] - logsumexp_rows(after)
    return float(lp.mean())
