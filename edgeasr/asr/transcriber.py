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

import difflib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from edgeasr.asr.beam import BatchDecoderSession
from edgeasr.asr.cleanup import tidy
from edgeasr.asr.commands_heard import CommandHearing
from edgeasr.asr.decoding import DecoderSession, DecodingOptions, WindowResult, decode_window, feed_prompt
from edgeasr.asr.encoder import Encoder
from edgeasr.asr.features import MelSpec, MelStream, log_mel, silence_level
from edgeasr.asr.gates import NoSpeech, WindowStats, check, compression_ratio, default_gates
from edgeasr.asr.pieces import Piece, TokenTimes, find_loop, split_segments, trim_repeats
from edgeasr.asr.spoken import SpeechMap, silent, stock_phrase_unspoken
from edgeasr.asr.tokenizer import Tokenizer
from edgeasr.asr.vocabulary import KEYTERM_BOOST, MEANS, VOCABULARY_CACHE, keyterms
from edgeasr.asr.words import WordAligner, text_of
from edgeasr.bundle import Bundle
from edgeasr.config import GATE_FAILURE_ACTIONS, DecoderConfig
from edgeasr.errors import ConfigError
from edgeasr.stages import Sentences, TextSegment, Transcription, Vocabulary, Word

log = logging.getLogger(__name__)

MIN_WINDOW_S = 0.1  # a shorter remainder holds no word
MIN_ADVANCE_S = 1.0  # a window that would seek less than this is taken whole (no stalls)
EDGE_S = 0.5  # a segment "closed" this close to the edge of a cut window was closed by the edge
MIN_S_PER_TOKEN = 0.05  # a closed segment shorter than this per token has bogus timestamps
SAMPLING_SEED = 0
NO_VOCABULARY = Vocabulary()
SEAM_WORDS = 4  # the longest phrase a seam repeats (two words measured)
SEAM_TOKENS = 16  # the kept text's last tokens: enough for SEAM_WORDS words
SEAM_FUZZY_LETTERS = 8  # a misheard repeat is judged on this many letters at least
SEAM_FUZZY_RATIO = 0.8  # ... and must share this much of them ("andformerrainbow", "andformarainbow")


@dataclass(frozen=True)
class Fallback:
    """Temperatures to decode a failed window again at: step, 2*step, ... up to 1.0."""

    step: float = DecoderConfig.fallback_temperature_step
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


@dataclass(frozen=True)
class Guards:
    """The rules that can remove decoded text beside the quality gates, each of which can be
    turned off: `edgeasr models ablate` turns them off one at a time and counts the words each
    removes that the reference holds against the made-up ones (docs/benchmarks.md)."""

    repeats: bool = True  # a window's text cut where it starts repeating itself (pieces.find_loop)
    silent_segments: bool = True  # a segment with no speech under it that the decoder doubts too
    stock_phrases: bool = True  # "Thank you." and the like over little speech (spoken.stock_phrase)


@dataclass(frozen=True)
class _Window:
    """The audio of one encoder window and where it stands in the audio being transcribed."""

    audio: np.ndarray
    seek: int  # its first sample in the audio
    complete: bool  # the speech ends in it: an open tail is complete too
    more: bool  # audio follows it (a looped phrase can be decoded again in the next one)


@dataclass
class _Walk:
    """What a transcription has gathered, window after window."""

    language: str | None  # None: detected in the first window, then kept
    context: list[int]  # text tokens kept so far (the prompt of the next window)
    keyterms: tuple[tuple[int, ...], ...]  # the vocabulary's names and terms, tokenized
    continues: bool  # the audio goes on from a call before (a prompt was given)
    before: int = 0  # tokens of `context` said before this call (the prompt)
    last: tuple[np.ndarray, float] | None = None  # the last window's encoder output and silence level
    seek: int = 0  # the first sample not yet accounted for
    segments: list[TextSegment] = field(default_factory=list)
    windows: int = 0
    tokens: int = 0
    dropped: int = 0
    runaway: int = 0
    steps: int = 0
    timings: dict[str, float] = field(default_factory=lambda: {"features": 0.0, "encoder": 0.0, "decoder": 0.0})


class Transcriber:
    def __init__(self, bundle: Bundle, encoder: Encoder, decoder: DecoderSession,
                 options: DecodingOptions, gates=None, on_gate_fail: str = DecoderConfig.on_gate_fail,
                 fallback: Fallback | None = None, pauses: PauseFinding | None = None,
                 guards: Guards = Guards()) -> None:
        if on_gate_fail not in GATE_FAILURE_ACTIONS:
            raise ConfigError(f"decoder.on_gate_fail: {on_gate_fail!r} is not allowed "
                              f"({', '.join(GATE_FAILURE_ACTIONS)})")
        self.bundle, self.encoder, self.decoder, self.options = bundle, encoder, decoder, options
        self.gates = gates if gates is not None else default_gates()
        self.on_gate_fail = on_gate_fail
        self.fallback = fallback or Fallback()
        self.pauses = pauses
        self.guards = guards
        self.tokenizer = Tokenizer(bundle)
        a = bundle.audio
        self.spec = MelSpec(a.sample_rate, a.n_fft, a.hop_length, a.n_mels, a.n_frames)
        self.gate_failures: dict[str, int] = {}
        self._keyterms = functools.lru_cache(maxsize=VOCABULARY_CACHE)(
            lambda vocabulary: keyterms(vocabulary, self.tokenizer.encode))
        # a final window heard with a vocabulary: the home's command it says (its names prompt
        # and its searches kept per vocabulary)
        self.commands = CommandHearing(decoder, self.tokenizer, bundle.tokens.eot)
        # a text token's letters and digits, lower-cased: what the repeat rule compares
        self._word_key = functools.lru_cache(maxsize=bundle.n_vocab)(
            lambda token: "".join(c for c in self.tokenizer.decode([token]).lower() if c.isalnum()))
        # hooks the engine sets (asr/engine.py): how a window is decoded (decode_window is
        # greedy or sampled; beam.BeamDecoder has its signature), word timestamps for the
        # transcripts (output.words), and, without those, a factory of the aligner that judges
        # words by the audio under them (a window's closing words, a repeat inside a segment;
        # made on first use: most windows never need it)
        self.decode: Callable[..., WindowResult] = decode_window
        self.aligner: WordAligner | None = None
        self.judging_aligner: Callable[[], WordAligner] | None = None
        # the home's sentences for a vocabulary and a language (home.sentences, set by whoever
        # builds the engine: asr does not import it), None where no language has them
        self.sentences: Callable[[Vocabulary, str], Sentences | None] | None = None
        # the batched step for that search's hypotheses, where the bundle has it (made on first use)
        self.batch_session: Callable[[], BatchDecoderSession] | None = None
        # which of vocabulary.MEANS a vocabulary is heard with (all; bench-commands measures each)
        self.hearing: frozenset[str] = frozenset(MEANS)

    def feature_stream(self) -> MelStream:
        return MelStream(self.spec)

    def transcribe(self, audio: np.ndarray, *, final: bool = True, language: str | None = None,
                   should_stop: Callable[[], bool] | None = None,
                   features: np.ndarray | None = None, prompt: Sequence[int] = (),
                   max_windows: int | None = None, vocabulary: Vocabulary = NO_VOCABULARY,
                   partial: bool = False) -> Transcription:
        """audio: float32 mono at the bundle's rate. final=False: speech goes on after it; the
        tail after the last complete timestamp is left unconsumed. language: this request's
        (multilingual bundles), else model.language's. should_stop() is asked between decoded
        tokens; when it says yes, errors.Cancelled is raised. features: the log-mel of `audio`
        computed while it arrived (feature_stream()), used when it fits one window. prompt:
        the text tokens said just before `audio` (an earlier call's `context`), so that audio
        decoded call by call reads as it would in one call. max_windows: decode at most this
        many windows; the audio after them is left unconsumed. vocabulary: the home's names
        and terms this request should be heard with (asr/vocabulary.py). partial: a look at
        speech still under way: its names are heard, its commands not read (stages.Engine)."""
        audio = np.asarray(audio, dtype=np.float32)
        if language is None or not self.bundle.multilingual:
            language = self.options.language
        walk = _Walk(language=language, context=list(prompt), continues=bool(prompt), before=len(prompt),
                     keyterms=self._keyterms(vocabulary) if "boost" in self.hearing else ())
        while len(audio) - walk.seek >= MIN_WINDOW_S * self.spec.sample_rate:
            if max_windows is not None and walk.windows >= max_windows:
                final = False  # audio is left: it is not consumed
                break
            window = self._next_window(audio, walk.seek, final)
            whole = window.seek == 0 and len(window.audio) == len(audio)
            self._transcribe_window(window, walk, features if whole else None, should_stop)
            if not final and not window.more:
                break
        if final:
            walk.seek = len(audio)
        result = self._transcription(walk, complete=final)
        if (vocabulary and final and not partial and walk.windows == 1 and walk.last is not None and self.sentences is not None
                and "grammar" in self.hearing):
            result = self._as_command(result, walk, vocabulary)
        return result

    def _next_window(self, audio: np.ndarray, seek: int, final: bool) -> _Window:
        """The window from `seek`: the model's length, or up to a pause near its end when the
        audio goes on past it (the segmenter's cut rule): it then holds complete speech."""
        sr = self.spec.sample_rate
        chunk = audio[seek : seek + self.spec.n_samples]
        more = seek + self.spec.n_samples < len(audio)
        complete = not more and final
        if more and self.pauses is not None:
            cut = self.pauses.find(chunk)
            if cut is not None and cut >= MIN_ADVANCE_S * sr:
                chunk, complete = chunk[:cut], True
        return _Window(chunk, seek, complete, more)

    def _transcribe_window(self, window: _Window, walk: _Walk, features: np.ndarray | None,
                           should_stop: Callable[[], bool] | None) -> None:
        """Encode and decode one window; its kept segments and tokens join `walk`."""
        chunk = window.audio
        t0 = time.monotonic()
        mel = features if features is not None else log_mel(chunk, self.spec)
        t1 = time.monotonic()
        encoded = self.encoder.encode(mel)
        walk.timings["features"] += (t1 - t0) * 1e3
        walk.timings["encoder"] += (time.monotonic() - t1) * 1e3
        earlier = walk.context[-self.max_prompt:] if self.options.condition_on_previous_text else []
        speech = SpeechMap(self.pauses.speech(chunk), self.pauses.frame_s) if self.pauses else None
        decoded = self._decode(encoded, silence_level(mel), chunk, window.complete, earlier, walk.language,
                               speech, should_stop, more=window.more, keyterms=walk.keyterms)
        result = decoded.result
        walk.timings["decoder"] += decoded.decoder_ms
        walk.steps += decoded.decoder_steps
        walk.windows += 1
        walk.tokens += len(result.tokens)
        walk.runaway += int(result.hit_cap)
        walk.language = result.language
        pieces = decoded.pieces
        if decoded.failed_gate is not None:
            walk.dropped += 1
            pieces = []
        offset = window.seek / self.spec.sample_rate
        pieces = self._without_seam_repeat(pieces, walk.context)
        pieces, words = self._words(pieces, chunk, result, offset, walk.timings, window.complete,
                                    continues=window.seek > 0 or walk.continues)
        for p, piece_words in zip(pieces, words):
            segment = self._segment(p, piece_words, offset, len(chunk), result)
            if segment is not None:
                walk.segments.append(segment)
                walk.context += p.tokens
        walk.seek += decoded.advance
        walk.last = (encoded, silence_level(mel))

    def _without_seam_repeat(self, pieces: list[Piece], before: Sequence[int]) -> list[Piece]:
        """A window that goes on from text kept before it (an earlier window's, or the prompt of
        a carried tail) reads again the words said across the seam, alike or misheard; its first
        words that repeat the last ones kept are dropped (measured: "...free to confess that the |
        the old temptation", "...sherry, lobster fat. | lobster fat.", "...and form a rainbow. |
        and former rainbow."). Only at the window's very start: a phrase said twice has audio of
        its own there."""
        if not pieces or not before or not self.guards.repeats or pieces[0].start > EDGE_S:
            return pieces
        kept = self._words_of(before[-SEAM_TOKENS:])
        first = pieces[0]
        for n in range(min(SEAM_WORDS, len(kept)), 0, -1):
            cut = self._after_words(first.tokens, n)
            if cut is not None and self._said_again(self._words_of(first.tokens[:cut]), kept):
                log.debug("dropped %d words repeated across a window seam", n)
                rest = Piece(first.start, first.end, first.tokens[cut:], first.logprobs[cut:])
                return ([rest] if rest.tokens else []) + pieces[1:]
        return pieces

    @staticmethod
    def _said_again(head: list[str], kept: list[str]) -> bool:
        """Do the words `head` repeat the end of `kept`: the same words, or nearly the same
        letters over as many words give or take one (a word cut by the seam is heard otherwise)?"""
        if kept[-len(head):] == head:
            return True
        letters = "".join(head)
        for m in (len(head) - 1, len(head), len(head) + 1):
            tail = "".join(kept[-m:]) if 0 < m <= len(kept) else ""
            if min(len(letters), len(tail)) >= SEAM_FUZZY_LETTERS and difflib.SequenceMatcher(
                    None, letters, tail, autojunk=False).ratio() >= SEAM_FUZZY_RATIO:
                return True
        return False

    def _words_of(self, tokens: Sequence[int]) -> list[str]:
        """The tokens' text as words of letters and digits, lower-cased."""
        words = ("".join(c for c in w if c.isalnum()) for w in self.tokenizer.decode(list(tokens)).lower().split())
        return [w for w in words if w]

    def _after_words(self, tokens: Sequence[int], n: int) -> int | None:
        """How many of the tokens make up their first n words (with the marks after them)."""
        for k in range(1, len(tokens) + 1):
            if len(self._words_of(tokens[:k])) > n:
                return k - 1
        return len(tokens) if len(self._words_of(tokens)) == n else None

    def _segment(self, piece: Piece, words: tuple[Word, ...], offset: float, n_samples: int,
                 result: WindowResult) -> TextSegment | None:
        text = self.tokenizer.decode(piece.tokens)
        if not text.strip():
            return None
        start, end = offset + piece.start, offset + (piece.end if piece.end is not None else n_samples / self.spec.sample_rate)
        if words:  # a closing timestamp can come seconds early ("... yolks of four eggs.<7.00>" for 8.9 s)
            start, end = min(start, words[0].start), max(end, words[-1].end)
        return TextSegment(start=round(start, 3), end=round(end, 3), text=text,
                           tokens=tuple(piece.tokens), avg_logprob=float(np.mean(piece.logprobs)),
                           no_speech_prob=result.no_speech_prob, compression_ratio=compression_ratio(text),
                           words=words)

    def _as_command(self, result: Transcription, walk: _Walk, vocabulary: Vocabulary) -> Transcription:
        """One window of speech heard with the home's vocabulary: the home's command it says
        (asr/commands_heard.py), if any, with its intent; the text put right when the command
        was heard slightly wrong."""
        assert walk.last is not None and self.sentences is not None
        sentences = self.sentences(vocabulary, result.language)
        if sentences is None or not result.text:
            return result
        t0 = time.monotonic()
        batch = self.batch_session() if self.batch_session is not None else None
        heard = self.commands.hear(result.text, sentences, *walk.last, replace(self.options, language=result.language),
                                   vocabulary, batch, prompt="prompt" in self.hearing)
        result.timings_ms["command"] = (time.monotonic() - t0) * 1e3
        if heard is None:
            return result
        if heard.score is None:  # the text as decoded
            return replace(result, intent=heard.intent)
        first, last = result.segments[0], result.segments[-1]
        tokens = tuple(self.tokenizer.encode(" " + heard.text))
        segment = TextSegment(start=first.start, end=last.end, text=" " + heard.text, tokens=tokens,
                              avg_logprob=heard.score, no_speech_prob=first.no_speech_prob,
                              compression_ratio=compression_ratio(heard.text))
        return replace(result, text=heard.text, segments=(segment,), intent=heard.intent,
                       context=tuple([*walk.context[: walk.before], *tokens][-self.max_prompt:]))

    def _transcription(self, walk: _Walk, complete: bool) -> Transcription:
        segments = tidy(walk.segments, complete=complete)
        return Transcription(text="".join(s.text for s in segments).strip(), segments=tuple(segments),
                             language=walk.language or "en", windows=walk.windows, tokens=walk.tokens,
                             consumed_samples=walk.seek, dropped_windows=walk.dropped,
                             runaway_windows=walk.runaway, decoder_steps=walk.steps,
                             timings_ms=walk.timings, context=tuple(walk.context[-self.max_prompt:]))

    @property
    def max_prompt(self) -> int:
        """Prompt tokens at most: openai's half of the text context, less <|startofprev|>."""
        return self.bundle.n_text_ctx // 2 - 1

    def _decode(self, features: np.ndarray, silence: float, chunk: np.ndarray, last: bool,
                prompt: list[int], language: str | None, speech: SpeechMap | None = None,
                should_stop: Callable[[], bool] | None = None, more: bool = False,
                keyterms: tuple[tuple[int, ...], ...] = ()) -> _Decoded:
        """Decode a window; if it fails a gate and on_gate_fail is "retry", again at each
        fallback temperature (openai's and faster-whisper's temperature fallback). A window
        that fails them all keeps its best attempt, unless it is silence (the no_speech gate).
        `prompt`: the earlier text; `keyterms`: the vocabulary's names and terms, whose tokens get
        a boost. The names are no prompt here: before free speech they cost more words than they
        put right (docs/benchmarks.md); they are the prompt of the home's sentences only."""
        options = replace(self.options, language=language, keyterms=keyterms,
                          keyterm_boost=KEYTERM_BOOST if keyterms else 0.0)
        temperatures = self.fallback.temperatures() if self.on_gate_fail == "retry" else (0.0,)
        spent, steps = 0.0, 0
        attempts: list[tuple[_Decoded, WindowStats]] = []
        rng = np.random.default_rng(SAMPLING_SEED)  # seeded per window: the same audio, the same text
        # the window's no-speech probability without the padding rows, read once per prompt
        unpadded = functools.cache(lambda before: self._unpadded_no_speech(features, options, list(before)))
        for temperature in temperatures:
            # a high temperature's sample does not follow the prompt: drop it (faster-whisper)
            earlier = prompt if temperature <= self.fallback.prompt_reset_temperature else []
            text_before = earlier[-self.max_prompt:]
            result = self.decode(self.decoder, features, replace(options, temperature=temperature),
                                 len(chunk) / self.spec.sample_rate, silence, prompt=text_before,
                                 rng=rng, should_stop=should_stop)
            spent += result.timings_ms["decoder"]
            steps += int(result.timings_ms["steps"])
            pieces, advance = self._keep(result, chunk, last, speech, more, temperature)
            stats = self._stats(result, pieces)
            if self._over_no_speech(stats) and options.encoder_padding > features.shape[1]:
                stats = replace(stats, no_speech_prob=min(stats.no_speech_prob, unpadded(tuple(text_before))))
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
               timings: dict[str, float], complete: bool,
               continues: bool = False) -> tuple[list[Piece], list[tuple[Word, ...]]]:
        """Each kept piece's words, timed from the audio start (none without output.words). The
        last window of audio decoded in several (`continues`: windows or a call before it),
        when its text runs to the end of its audio, loses the words at its end that have no
        audio under them (`drop_unspoken_tail`): such a window holds the end of the speech
        only, and with little audio the decoder runs on."""
        sr = self.spec.sample_rate
        runs_to_end = (bool(pieces) and complete and continues
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

    def _over_no_speech(self, stats: WindowStats) -> bool:
        gate = next((g for g in self.gates if isinstance(g, NoSpeech)), None)
        return gate is not None and stats.no_speech_prob > gate.no_speech_threshold

    def _unpadded_no_speech(self, features: np.ndarray, options: DecodingOptions, prompt: list[int]) -> float:
        """The window's no-speech probability without the padding rows, which silence is judged on
        when the padded one is over the no_speech gate's threshold. The rows stand for the 20 s
        of silence past a 10 s window and raise it for short speech (base, German "fortsetzen"
        said by espeak-ng: 0.61 padded, 0.51 without, 0.30 in faster-whisper's 30 s window),
        which then came back empty; over silence it stays high either way."""
        self.decoder.start(features, 0)
        return feed_prompt(self.decoder, options, prompt)[1]

    def _keep(self, result: WindowResult, chunk: np.ndarray, last: bool, speech: SpeechMap | None = None,
              more: bool = False, temperature: float = 0.0) -> tuple[list[Piece], int]:
        """The pieces to keep and how many samples they account for: up to where the text
        starts repeating itself over audio that does not (a short window makes the decoder
        run on past the speech), and, given the VAD's `speech`, only pieces spoken. `more`:
        audio follows the window (a loop's phrase can be decoded again in the next one)."""
        sr = self.spec.sample_rate
        decoded = split_segments(result, self.bundle.tokens.timestamp_begin, self.bundle.audio.seconds_per_position)
        times = self._token_times(decoded, chunk, result)
        loop_from = None
        if self.guards.repeats:
            # a window that ran to the token cap is looping: speech under a repeat proves nothing
            _, loop_from = find_loop(decoded, None if result.hit_cap else speech, times, self._word_key)
        if loop_from is not None and more and decoded[loop_from].start >= MIN_ADVANCE_S:
            # a loop (the window's edge makes greedy decoding run on) stamps even the looped
            # phrase's first saying too early: decode from where that piece began again
            # (measured on base: "feel. He makes me harshly feel.<7.92><7.92> He makes me...")
            pieces, advance = decoded[:loop_from], int(decoded[loop_from].start * sr)
        else:
            pieces, advance = self._closed(decoded, result, chunk, last)
            if self.guards.repeats:
                pieces = trim_repeats(pieces, speech, times, self._word_key)  # a prefix of `decoded`: the same times
        if speech is not None:
            spoken = [p for p in pieces if self._spoken(p, _end(p, chunk, sr), result, speech, temperature)]
            # the rules never empty a window the VAD hears speech in: its only text may be what
            # was said ("mute", heard as "You...", is no "you" over silence)
            if spoken or not speech.is_spoken(0.0, len(chunk) / sr):
                pieces = spoken
        return pieces, advance

    def _spoken(self, piece: Piece, end: float, result: WindowResult, speech: SpeechMap,
                temperature: float) -> bool:
        """Keep a piece unless the audio under it says it was not spoken: no speech under it
        while the decoder doubts it too (`_doubted`), or a stock phrase over little speech. The
        VAD alone is not enough: it misses quiet speech (measured: webrtcvad heard 3 frames of a
        FLEURS sentence at -67 dBFS that Whisper read right at once)."""
        text = self.tokenizer.decode(piece.tokens)
        if self.guards.silent_segments and silent(speech, piece.start, end) and self._doubted(
                piece, text, result, temperature):
            return False
        return not (self.guards.stock_phrases and stock_phrase_unspoken(speech, piece.start, end, text))

    def _doubted(self, piece: Piece, text: str, result: WindowResult, temperature: float) -> bool:
        """Does the decoder doubt a piece? Its window needed the temperature fallback, ran to the
        token cap or is likelier silence than not, or a quality gate fails on the piece alone
        (measured: a window of the silence after a VCTK sentence, read "and former rainbow." at
        temperature 0.6 after three failed attempts)."""
        silence = next((g.no_speech_threshold for g in self.gates if isinstance(g, NoSpeech)), 1.0)
        if temperature > 0 or result.hit_cap or result.no_speech_prob > silence:
            return True
        stats = WindowStats(text, float(np.mean(piece.logprobs)), result.no_speech_prob, compression_ratio(text))
        return check(self.gates, stats) is not None

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
