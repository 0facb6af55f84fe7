"""The "full-NPU" reference decoder: Whisper decoded the way Hailo's decoder HEF runs it.

hailo_decoder.onnx (edgeasr.models.hailo_decoder) has a fixed token sequence and no KV
cache, so every step re-runs the whole sequence: the host looks the tokens up in the
embedding table, feeds [1, 1, L, d] with the encoder features, concatenates the 4 logit
outputs on axis 2 and picks the next token from the current position's row. Here the
graph runs in onnxruntime, standing in for the HEF; `edgeasr bench` reports it as the
full-NPU row next to the cached CPU decoder. Greedy, without timestamps, with the same
prompt and token suppression as the CPU decoder (edgeasr.asr.decoding).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from edgeasr.asr import logits as rules
from edgeasr.asr.decoding import TableRows, start_sequence
from edgeasr.asr.encoder import ort_session
from edgeasr.bundle import Bundle
from edgeasr.config import DecoderConfig
from edgeasr.errors import ModelError
from edgeasr.models.hailo_decoder import EMBEDDING_ROLE, EMBEDDINGS_INPUT, FEATURES_INPUT, GRAPH_ROLE

PAD_TOKEN = 0  # fills the unused tail of the sequence; the causal mask hides it


@dataclass
class StepTimings:
    """Where the time of one decode went (seconds); per_step_ms has one entry per graph run."""

    steps: int = 0
    embed_s: float = 0.0  # host: embedding lookup
    graph_s: float = 0.0  # the fixed-length graph (the NPU's part)
    pick_s: float = 0.0  # host: concatenating outputs, suppression, argmax
    per_step_ms: list[float] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return self.embed_s + self.graph_s + self.pick_s


@dataclass
class Counters:
    """Running totals over every decode of this decoder."""

    decodes: int = 0
    steps: int = 0
    tokens: int = 0
    embed_s: float = 0.0
    graph_s: float = 0.0
    pick_s: float = 0.0

    def add(self, t: StepTimings, tokens: int) -> None:
        self.decodes += 1
        self.steps += t.steps
        self.tokens += tokens
        self.embed_s += t.embed_s
        self.graph_s += t.graph_s
        self.pick_s += t.pick_s


def prompt_tokens(bundle: Bundle, language: str = "en") -> list[int]:
    """The start sequence without timestamps: English-only [sot, no_timestamps];
    multilingual [sot, language, transcribe, no_timestamps]."""
    return start_sequence(bundle, language, timestamps=False)


def suppression_rules(bundle: Bundle) -> list[rules.LogitFilter]:
    """The CPU decoder's suppression, without timestamps: non-speech and special tokens,
    every timestamp, and blank / end-of-text as the first token."""
    tok = bundle.tokens
    return [rules.SuppressTokens(rules.suppressed_tokens(bundle, timestamps=False)),
            rules.SuppressBlank(tok.blank, tok.eot)]


class FullNpuReferenceDecoder:
    """Greedy decoding with the fixed-length, cache-free decoder graph of a bundle."""

    def __init__(self, bundle: Bundle, language: str = "en", threads: int = DecoderConfig.threads) -> None:
        if not bundle.has(GRAPH_ROLE):
            raise ModelError(f"{bundle.root}: no fixed-length Hailo decoder in this bundle "
                             "(import it with --with hailo)")
        self.bundle = bundle
        self.session = ort_session(bundle.path(GRAPH_ROLE), threads)
        self.embedding = TableRows(bundle.path(EMBEDDING_ROLE))  # [V, d], rows on demand
        inputs = {i.name: tuple(i.shape) for i in self.session.get_inputs()}
        if set(inputs) != {FEATURES_INPUT, EMBEDDINGS_INPUT}:
            raise ModelError(f"{bundle.path(GRAPH_ROLE)}: inputs {sorted(inputs)}, expected "
                             f"{FEATURES_INPUT} and {EMBEDDINGS_INPUT}")
        self.features_shape = inputs[FEATURES_INPUT]  # (1, T, d)
        self.embeddings_shape = inputs[EMBEDDINGS_INPUT]  # (1, 1, L, d)
        self.n_tokens = self.embeddings_shape[2]
        self._rows = np.zeros(self.embeddings_shape[2:], np.float32)  # [L, d]
        if self.embedding.shape != (bundle.n_vocab, bundle.d_model):
            raise ModelError(f"{bundle.path(EMBEDDING_ROLE)}: shape {self.embedding.shape}, "
                             f"expected ({bundle.n_vocab}, {bundle.d_model})")
        self.prompt = prompt_tokens(bundle, language)
        if len(self.prompt) >= self.n_tokens:
            raise ModelError(f"a {self.n_tokens}-token decoder leaves no room after the prompt")
        self.rules = suppression_rules(bundle)
        self.last = StepTimings()
        self.totals = Counters()

    @property
    def max_new_tokens(self) -> int:
        """Text tokens (and end-of-text) that fit after the prompt."""
        return self.n_tokens - len(self.prompt)

    def decode(self, audio_features: np.ndarray) -> list[int]:
        """audio_features [1, T, d] (a Hailo [1, 1, T, d] buffer is accepted) -> text tokens."""
        feats = self._features(audio_features)
        eot = self.bundle.tokens.eot
        sequence = np.full(self.n_tokens, PAD_TOKEN, dtype=np.int64)
        sequence[: len(self.prompt)] = self.prompt
        self.embedding.read(sequence.tolist(), self._rows)  # then each step reads its newest row
        timings = StepTimings()
        generated: list[int] = []
        for pos in range(len(self.prompt) - 1, self.n_tokens - 1):
            token = self._step(feats, sequence, pos, generated, timings)
            if token == eot:
                break
            generated.append(token)
            sequence[pos + 1] = token
        self.last = timings
        self.totals.add(timings, len(generated))
        return generated

    def _features(self, audio_features: np.ndarray) -> np.ndarray:
        want = self.features_shape
        a = np.asarray(audio_features, dtype=np.float32)
        if a.size != int(np.prod(want)) or a.shape[-1] != want[-1]:
            raise ModelError(f"audio features of shape {a.shape} do not fit the decoder's {want}")
        return np.ascontiguousarray(a.reshape(want))

    def _step(self, feats: np.ndarray, sequence: np.ndarray, pos: int, generated: list[int],
              timings: StepTimings) -> int:
        t0 = time.monotonic()
        self.embedding.read([int(sequence[pos])], self._rows[pos : pos + 1])  # the rest are in place
        embeddings = self._rows.reshape(self.embeddings_shape)
        t1 = time.monotonic()
        outputs = self.session.run(None, {FEATURES_INPUT: feats, EMBEDDINGS_INPUT: embeddings})
        t2 = time.monotonic()
        # the vocabulary parts ([1, L, V_i], joined on axis 2) at the one position read
        logits = np.concatenate([o[0, pos] for o in outputs])
        for rule in self.rules:
            rule.apply(logits, generated)
        token = int(np.argmax(logits))
        t3 = time.monotonic()
        timings.steps += 1
        timings.embed_s += t1 - t0
        timings.graph_s += t2 - t1
        timings.pick_s += t3 - t2
        timings.per_step_ms.append((t3 - t0) * 1e3)
        return token
