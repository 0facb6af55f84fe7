"""Speech -> text: walk the audio window by window, seeking on timestamps.

When the audio goes on past a window, the window ends in a pause if the VAD finds one in
its last seconds (the segmenter's cut rule, `PauseFinding`), and is then decoded as
complete. Otherwise it is decoded with timestamps: greedy decoding loops when speech runs
into the window edge (measured; padding the encoder output does not help), so such a
window keeps only its segments closed by a timestamp and the next window starts at the
last complete timestamp. The last window of final audio keeps everything but closing words
with no audio under them. A call can decode part of the audio (`max_windows`) and a later one
carry on from its text (`prompt` = the earlier `Transcription.context`): the Wyoming sessions
and the pipeline's carried tails read long speech as one call would.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from edgeasr.asr.cleanup import tidy
from edgeasr.asr.decoding import DecoderSession, DecodingOptions, WindowResult, decode_window
from edgeasr.asr.encoder import Encoder
from edgeasr.asr.features import MelSpec, MelStream, log_mel, silence_level
from edgeasr.asr.gates import WindowStats, check, compression_ratio, default_gates
from edgeasr.asr.pieces import Piece, TokenTimes, find_loop, split_segments, trim_repeats
from edgeasr.asr.spoken import SpeechMap, keep_segment
from edgeasr.asr.tokenizer import Tokenizer
from edgeasr.asr.words import WordAligner, text_of
from edgeasr.bundle import Bundle
from edgeasr.errors import ConfigError
from edgeasr.stages import TextSegment, Transcription, Word

log = logging.getLogger(__name__)

MIN_WINDOW_S = 0.1  # a shorter remainder holds no word
MIN_ADVANCE_S = 1.0  # a window that would seek less than this is taken whole (no stalls)
EDGE_S = 0.5  # a segment "closed" this close to the edge of a cut window was closed by the edge
MIN_S_PER_TOKEN = 0.05  # a closed segment shorter than this per token has bogus timestamps
ON_GATE_FAIL = ("drop", "retry", "keep")
SAMPLING_SEED = 0


@dataclass(frozen=True)
class Fallback:
    """Temperatures to decode a failed window again at: step, 2*step, ... up to 1.0."""

    step: float = 0.2
    # above this temperature the retry is decoded without the earlier text as prompt
    prompt_reset_temperature: float = 0.5

    def temperatures(self) -> tuple[float, ...]:
        n = int(round(1.0 / self.step)) if self.step > 0 else 0
        return (0.0, *(round(self.step * i, 3) for i in range(1, n + 1)))


def _best(attempts: list[tuple[_Decoded, WindowStats]], gates) -> tuple[_Decoded, WindowStats]:
    """Of attempts that all failed a gate, the likeliest one that does not repeat itself
    (faster-whisper's choice), judged again for silence."""
    ratio = next((g.compression_ratio_threshold for g in gates if g.name == "compression_ratio"), None)
    sane = [a for a in attempts if ratio is None or a[1].compression_ratio <= ratio] or attempts
    decoded, stats = max(sane, key=lambda a: a[1].avg_logprob)
    silence = next((g for g in gates if g.name == "no_speech"), None)
    decoded.failed_gate = "no_speech" if silence is not None and silence.fails(stats) else decoded.failed_gate
    return decoded, stats


@dataclass
class _Decoded:
    pieces: list[Piece]  # the pieces to keep
    result: WindowResult  # of the last attempt
    advance: int  # samples the kept pieces account for
    failed_gate: str | None
    decoder_ms: float  # all attempts
    decoder_steps: int  # all attempts


class PauseFinding(Protocol):
    """The VAD side's rules for audio in memory (`audio.segmenter.PauseFinder`)."""

    @property
    def frame_s(self) -> float: ...

    def find(self, audio: np.ndarray) -> int | None:
        """Where a window of long audio can end in a pause (samples), or None."""

    def speech(self, audio: np.ndarray) -> np.ndarray:
        """Speech or not, per frame of `frame_s` seconds."""


class Transcriber:
    def __init__(self, bundle: Bundle, encoder: Encoder, decoder: DecoderSession,
                 options: DecodingOptions, gates=None, on_gate_fail: str = "drop",
                 fallback: Fallback | None = None, pauses: PauseFinding | None = None) -> None:
        if on_gate_fail not in ON_GATE_FAIL:
            raise ConfigError(f"decoder.on_gate_fail: {on_gate_fail!r} is not allowed ({', '.join(ON_GATE_FAIL)})")
        self.bundle, self.encoder, self.decoder, self.options = bundle, encoder, decoder, options
        self.gates = gates if gates is not None else default_gates()
        self.on_gate_fail = on_gate_fail
        self.fallback = fallback or Fallback()
        self.pauses = pauses
        self.tokenizer = Tokenizer(bundle)
        a = bundle.audio
        self.spec = MelSpec(a.sample_rate, a.n_fft, a.hop_length, a.n_mels, a.n_frames)
        self.gate_failures: dict[str, int] = {}
        # hooks the engine sets (asr/engine.py): how a window is decoded (decode_window is
        # greedy or sampled; beam.BeamDecoder has its signature), word timestamps for the
        # transcripts (output.words), and, without those, a factory of the aligner that judges
        # words by the audio under them (a window's closing words, a repeat inside a segment;
        # made on first use: most windows never need it)
        self.decode: Callable[..., WindowResult] = decode_window
        self.aligner: WordAligner | None = None
        self.judging_aligner: Callable[[], WordAligner] | None = None

    def feature_stream(self) -> MelStream:
        return MelStream(self.spec)

    def transcribe(self, audio: np.ndarray, *, final: bool = True, language: str | None = None,
                   should_stop: Callable[[], bool] | None = None,
                   features: np.ndarray | None = None, prompt: Sequence[int] = (),
                   max_windows: int | None = None) -> Transcription:
        """audio: float32 mono at the bundle's rate. final=False: speech goes on after it; the
        tail after the last complete timestamp is left unconsumed. language: this request's
        (multilingual bundles), else model.language's. should_stop() is asked between decoded
        tokens; when it says yes, errors.Cancelled is raised. features: the log-mel of `audio`
        computed while it arrived (feature_stream()), used when it fits one window. prompt:
        the text tokens said just before `audio` (an earlier call's `context`), so that audio
        decoded call by call reads as it would in one call. max_windows: decode at most this
        many windows; the audio after them is left unconsumed."""
        sr, window = self.spec.sample_rate, self.spec.n_samples
        audio = np.asarray(audio, dtype=np.float32)
        seek, segments, n_tokens, windows, dropped, runaway, steps = 0, [], 0, 0, 0, 0, 0
        if language is None or not self.bundle.multilingual:
            language = self.options.language  # None: detected in the first window, then kept
        context = list(prompt)  # text tokens kept so far (the prompt of the next window)
        timings = {"features": 0.0, "encoder": 0.0, "decoder": 0.0}
        while len(audio) - seek >= MIN_WINDOW_S * sr:
            if max_windows is not None and windows >= max_windows:
                final = False  # audio is left: it is not consumed
                break
            chunk = audio[seek : seek + window]
            reaches_end = seek + window >= len(audio)
            complete = reaches_end and final
            if not reaches_end and self.pauses is not None:
                # speech goes on past the window: end it in a pause if there is one
                cut = self.pauses.find(chunk)
                if cut is not None and cut >= MIN_ADVANCE_S * sr:
                    chunk, complete = chunk[:cut], True
            t0 = time.monotonic()
            whole = seek == 0 and len(chunk) == len(audio)
            mel = features if features is not None and whole else log_mel(chunk, self.spec)
            t1 = time.monotonic()
            encoded = self.encoder.encode(mel)
            t2 = time.monotonic()
            timings["features"] += (t1 - t0) * 1e3
            timings["encoder"] += (t2 - t1) * 1e3
            prompt = context[-self.max_prompt:] if self.options.condition_on_previous_text else []
            speech = SpeechMap(self.pauses.speech(chunk), self.pauses.frame_s) if self.pauses else None
            decoded = self._decode(encoded, silence_level(mel), chunk, complete, prompt, language, speech,
                                   should_stop, more=not reaches_end)
            pieces, result = decoded.pieces, decoded.result
            timings["decoder"] += decoded.decoder_ms
            steps += decoded.decoder_steps
            windows += 1
            n_tokens += len(result.tokens)
            runaway += int(result.hit_cap)
            language = result.language
            if decoded.failed_gate is not None:
                dropped += 1
                pieces = []
            offset = seek / sr
            pieces, words = self._words(pieces, chunk, result, offset, timings, complete)
            for p, piece_words in zip(pieces, words):
                text = self.tokenizer.decode(p.tokens)
                if not text.strip():
                    continue
                segments.append(TextSegment(
                    start=round(offset + p.start, 3),
                    end=round(offset + (p.end if p.end is not None else len(chunk) / sr), 3),
                    text=text, tokens=tuple(p.tokens),
                    avg_logprob=float(np.mean(p.logprobs)), no_speech_prob=result.no_speech_prob,
                    compression_ratio=compression_ratio(text), words=piece_words))
                context += p.tokens
            seek += decoded.advance
            if not final and reaches_end:
                break
        if final:
            seek = len(audio)
        segments = tidy(segments, complete=final)
        text = "".join(s.text for s in segments).strip()
        return Transcription(text=text, segments=tuple(segments), language=language or "en", windows=windows,
                             tokens=n_tokens, consumed_samples=seek, dropped_windows=dropped,
                             runaway_windows=runaway, decoder_steps=steps, timings_ms=timings,
                             context=tuple(context[-self.max_prompt:]))

    @property
    def max_prompt(self) -> int:
        """Prompt tokens at most: openai's half of the text context, less <|startofprev|>."""
        return self.bundle.n_text_ctx // 2 - 1

    def _decode(self, features: np.ndarray, silence: float, chunk: np.ndarray, last: bool,
                prompt: list[int], language: str | None, speech: SpeechMap | None = None,
                should_stop: Callable[[], bool] | None = None, more: bool = False) -> _Decoded:
        """Decode a window; if it fails a gate and on_gate_fail is "retry", again at each
        fallback temperature (openai's and faster-whisper's temperature fallback). A window
        that fails them all keeps its best attempt, unless it is silence (the no_speech gate)."""
        options = replace(self.options, language=language)
        temperatures = self.fallback.temperatures() if self.on_gate_fail == "retry" else (0.0,)
        spent, steps = 0.0, 0
        attempts: list[tuple[_Decoded, WindowStats]] = []
        rng = np.random.default_rng(SAMPLING_SEED)  # seeded per window: the same audio, the same text
        for temperature in temperatures:
            # a high temperature's sample does not follow the prompt: drop it (faster-whisper)
            text_before = prompt if temperature <= self.fallback.prompt_reset_temperature else []
            result = self.decode(self.decoder, features, replace(options, temperature=temperature),
                                 len(chunk) / self.spec.sample_rate, silence, prompt=text_before,
                                 rng=rng, should_stop=should_stop)
            spent += result.timings_ms["decoder"]
            steps += int(result.timings_ms["steps"])
            pieces, advance = self._keep(result, chunk, last, speech, more)
            stats = self._stats(result, pieces)
            verdict = check(self.gates, stats)
            attempts.append((_Decoded(pieces, result, advance, verdict, spent, steps), stats))
            if verdict is None:
                break
            self.gate_failures[verdict] = self.gate_failures.get(verdict, 0) + 1
            log.debug("window failed the %s gate at temperature %.1f", verdict, temperature)
            if verdict == "no_speech":
                break
        decoded, stats = attempts[-1] if len(attempts) == 1 else _best(attempts, self.gates)
        decoded.decoder_ms, decoded.decoder_steps = spent, steps
        if decoded.failed_gate is not None and (
                self.on_gate_fail == "keep" or (self.on_gate_fail == "retry" and decoded.failed_gate != "no_speech")):
            decoded.failed_gate = None
        return decoded

    def _words(self, pieces: list[Piece], chunk: np.ndarray, result: WindowResult, offset: float,
               timings: dict[str, float], complete: bool) -> tuple[list[Piece], list[tuple[Word, ...]]]:
        """Each kept piece's words, timed from the audio start (none without output.words). The
        last window of audio decoded in several, when its text runs to the end of its audio,
        loses the words at its end that have no audio under them (`drop_unspoken_tail`): such a
        window holds the end of the speech only, and with little audio the decoder runs on."""
        sr = self.spec.sample_rate
        runs_to_end = (bool(pieces) and complete and offset > 0
                       and _end(pieces[-1], chunk, sr) > len(chunk) / sr - EDGE_S)
        aligner = self._judge() if runs_to_end else self.aligner
        if aligner is None:
            return pieces, [() for _ in pieces]
        t0 = time.monotonic()
        words = aligner.words(pieces, len(chunk), result.language, self.options.task, offset)
        if runs_to_end:
            pieces, words = self.drop_unspoken_tail(pieces, words, offset + len(chunk) / sr)
        timings["words"] = timings.get("words", 0.0) + (time.monotonic() - t0) * 1e3
        return pieces, words if self.aligner is not None else [() for _ in pieces]

    def drop_unspoken_tail(self, pieces: list[Piece], words: list[tuple[Word, ...]],
                           audio_end: float) -> tuple[list[Piece], list[tuple[Word, ...]]]:
        """Without the last piece's closing words that the alignment squeezes into no time at the
        very end of the audio: they have no audio under them. A window that ends in a pause makes
        the decoder run on past the speech (measured on base, a stream's segment cut in a pause:
        "... he makes me harshly feel. He makes me", its last three words at 9.90-9.90 s of 9.93)."""
        last = list(words[-1]) if words else []
        n = len(last)
        while n and last[n - 1].end <= last[n - 1].start and last[n - 1].start >= audio_end - EDGE_S:
            n -= 1
        if n == len(last):
            return pieces, words
        log.debug("dropped %d unspoken words at the end of a window", len(last) - n)
        piece, kept = pieces[-1], text_of(last[:n]).strip()
        k = len(piece.tokens)
        while k and self.tokenizer.decode(piece.tokens[:k]).strip() != kept:
            k -= 1
        if k == 0:
            return pieces[:-1], words[:-1]
        cut = Piece(piece.start, piece.end, piece.tokens[:k], piece.logprobs[:k])
        return [*pieces[:-1], cut], [*words[:-1], tuple(last[:n])]

    def _stats(self, result: WindowResult, pieces: list[Piece]) -> WindowStats:
        text = self.tokenizer.decode([t for p in pieces for t in p.tokens])
        lps = [lp for p in pieces for lp in p.logprobs]
        return WindowStats(text, float(np.mean(lps)) if lps else result.avg_logprob,
                           result.no_speech_prob, compression_ratio(text))

    def _keep(self, result: WindowResult, chunk: np.ndarray, last: bool,
              speech: SpeechMap | None = None, more: bool = False) -> tuple[list[Piece], int]:
        """The pieces to keep and how many samples they account for: up to where the text
        starts repeating itself over audio that does not (a short window makes the decoder
        run on past the speech), and, given the VAD's `speech`, only pieces spoken. `more`:
        audio follows the window (a loop's phrase can be decoded again in the next one)."""
        sr = self.spec.sample_rate
        decoded = split_segments(result, self.bundle.tokens.timestamp_begin, self.bundle.audio.seconds_per_position)
        times = self._token_times(decoded, chunk, result)
        # a window that ran to the token cap is looping: speech under a repeat proves nothing
        _, loop_from = find_loop(decoded, None if result.hit_cap else speech, times)
        if loop_from is not None and more and decoded[loop_from].start >= MIN_ADVANCE_S:
            # a loop (the window's edge makes greedy decoding run on) stamps even the looped
            # phrase's first saying too early: decode from where that piece began again
            # (measured on base: "feel. He makes me harshly feel.<7.92><7.92> He makes me...")
            pieces, advance = decoded[:loop_from], int(decoded[loop_from].start * sr)
        else:
            pieces, advance = self._closed(decoded, result, chunk, last)
            pieces = trim_repeats(pieces, speech, times)  # a prefix of `decoded`: the same times
        if speech is not None:
            pieces = [p for p in pieces
                      if keep_segment(speech, p.start, _end(p, chunk, sr), self.tokenizer.decode(p.tokens))]
        return pieces, advance

    def _token_times(self, pieces: list[Piece], chunk: np.ndarray, result: WindowResult) -> TokenTimes | None:
        """The window's token times from the alignment heads, for the repeat rule; aligned at
        most once, and only if asked for (a repeat inside a segment), before the next decode."""
        if self.aligner is None and self.judging_aligner is None:
            return None

        @functools.cache
        def times() -> Sequence[float]:
            aligner = self._judge()
            assert aligner is not None
            return aligner.token_times(pieces, len(chunk), result.language, self.options.task)

        return times

    def _judge(self) -> WordAligner | None:
        """The aligner for the rules that judge words by their audio (None: they are off)."""
        if self.aligner is not None:
            return self.aligner
        return self.judging_aligner() if self.judging_aligner is not None else None

    def _stopped_early(self, result: WindowResult, pieces: list[Piece], chunk: np.ndarray) -> int | None:
        """Where to go on if the decoder opened a segment and stopped at once ("<6.26><6.26>"
        then end-of-text) well before the window's end: the speech after it was never
        transcribed (measured: a pause-cut window lost the 2.5 s after such a stop). openai
        seeks to that timestamp too."""
        begin, sr = self.bundle.tokens.timestamp_begin, self.spec.sample_rate
        if result.hit_cap or len(result.tokens) < 2 or min(result.tokens[-2:]) < begin or not pieces:
            return None
        stop = int(pieces[-1].end * sr) if pieces[-1].end is not None else len(chunk)
        return stop if MIN_ADVANCE_S * sr <= stop <= len(chunk) - MIN_WINDOW_S * sr else None

    def _closed(self, pieces: list[Piece], result: WindowResult, chunk: np.ndarray,
                last: bool) -> tuple[list[Piece], int]:
        sr = self.spec.sample_rate
        stopped_at = self._stopped_early(result, pieces, chunk)
        if last and not result.hit_cap:
            # the audio ends here: an open tail is complete too
            return pieces, stopped_at or len(chunk)
        good: list[Piece] = []  # closed pieces with believable timestamps, in order
        ends: list[float] = []
        for p in pieces:
            if p.end is None or p.end - p.start < MIN_S_PER_TOKEN * len(p.tokens):
                break  # open, or squeezed into a few ms: the loop has begun
            good.append(p)
            ends.append(p.end)
        if not good:
            # no usable timestamp: keep the text up to where it starts repeating
            return pieces[:1], len(chunk)
        if len(good) > 1 and ends[-1] > len(chunk) / sr - EDGE_S:
            good.pop()  # closed by the window edge, maybe mid-word: decode it again
        elif len(good) == len(pieces) and not result.hit_cap:
            return good, stopped_at or len(chunk)  # ended on a timestamp: the window is done
        advance = int(ends[len(good) - 1] * sr)
        return good, (len(chunk) if advance < MIN_ADVANCE_S * sr else min(advance, len(chunk)))


def _end(piece: Piece, chunk: np.ndarray, sample_rate: int) -> float:
    return piece.end if piece.end is not None else len(chunk) / sample_rate
