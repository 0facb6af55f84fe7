"""Long-form streams made from an evaluation pool, clean and with real noise mixed in.

A stream is what the daemon hears from an always-on microphone: utterances with pauses
between them. Each stream takes `UTTERANCES` utterances of one set, in order, each brought to
one level, with 1.0 s of silence before and after and gaps drawn from 1-3 s between them (the
dev set's own streams are made the same way).

The noise is recorded, not synthesised: the room tone found in the pool's own recordings (the
stretches a level-robust VAD, Silero, calls non-speech) with babble of other speakers under it
(other utterances of the pool, a few at a time), scaled so that the speech's mean power over
its spans is `snr_db` above the noise's.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeasr.lab.evaluation.scoring import Utterance
from edgeasr.stages import SAMPLE_RATE

UTTERANCES = 7  # per stream
EDGE_S = 1.0  # silence before the first utterance and after the last
GAP_S = (1.0, 3.0)  # between utterances, uniform
BABBLE_TALKERS = 3  # utterances summed into the babble
BABBLE_DB = -6.0  # the babble's power against the room tone's, before scaling to the SNR
LEVEL_DBFS = -26.0  # each utterance's level in a stream (RMS)
PEAK = 0.99  # ... unless its peaks would pass this
MIN_QUIET_S = 0.3  # a stretch of non-speech shorter than this is not room tone
DIGITAL_SILENCE = 1e-9  # frame power (full scale 1): below it a frame is padding, not a room
MAX_OVER_MEDIAN_DB = 6.0  # louder frames of a stretch are clicks or breaths


@dataclass(frozen=True)
class Stream:
    id: str
    audio: np.ndarray  # float32
    spans: tuple[tuple[int, int], ...]  # each utterance's samples in the stream
    references: tuple[str, ...]
    ids: tuple[str, ...]  # the utterances'


def make_streams(pool: Sequence[Utterance], seed: int = 0) -> list[Stream]:
    """Clean streams of the pool's utterances, set by set, UTTERANCES each (fewer in the last)."""
    rng = np.random.default_rng(seed)
    streams = []
    for set_name in dict.fromkeys(u.set_name for u in pool):
        members = [u for u in pool if u.set_name == set_name]
        for k in range(0, len(members), UTTERANCES):
            group = members[k : k + UTTERANCES]
            streams.append(_stream(f"{set_name}_stream_{k // UTTERANCES:02d}", group, rng))
    return streams


def _stream(name: str, group: Sequence[Utterance], rng: np.random.Generator) -> Stream:
    edge = np.zeros(int(EDGE_S * SAMPLE_RATE), np.float32)
    parts, spans, at = [edge], [], len(edge)
    for i, u in enumerate(group):
        spans.append((at, at + len(u.audio)))
        parts.append(_at_level(u.audio))
        at += len(u.audio)
        gap = edge if i == len(group) - 1 else np.zeros(int(rng.uniform(*GAP_S) * SAMPLE_RATE), np.float32)
        parts.append(gap)
        at += len(gap)
    return Stream(name, np.concatenate(parts), tuple(spans), tuple(u.reference for u in group),
                  tuple(u.id for u in group))


def _at_level(audio: np.ndarray) -> np.ndarray:
    """The utterance at LEVEL_DBFS (as one microphone hears people in one room alike: the
    pool's sources lie 40 dB apart, and one SNR for the stream would bury the quiet ones),
    its peaks kept under full scale."""
    power = float(np.mean(np.square(audio, dtype=np.float64)))
    if power <= 0:
        return audio
    gain = min(10 ** (LEVEL_DBFS / 20) / np.sqrt(power), PEAK / max(float(np.max(np.abs(audio))), 1e-9))
    return (audio * gain).astype(np.float32)


def room_tone(pool: Sequence[Utterance]) -> np.ndarray:
    """The non-speech stretches of the pool's recordings, one after another, each brought to
    unit power (they were recorded at different levels). Digital silence (trimmed or padded
    recordings) is not room tone and is left out, and so are clicks and breaths louder than
    `MAX_OVER_MEDIAN_DB` over their stretch's median frame."""
    from edgeasr.audio.vad import make_detector
    from edgeasr.config import VadOptions

    options = VadOptions(detector="silero")
    frame = SAMPLE_RATE * options.frame_ms // 1000
    pieces = []
    for u in pool:
        detector = make_detector(options)
        n = len(u.audio) // frame
        frames = u.audio[: n * frame].reshape(n, frame)
        pcm = (np.clip(frames, -1, 1) * 32767).astype(np.int16)
        power = np.mean(np.square(frames, dtype=np.float64), axis=1)
        quiet = np.array([not detector.is_speech(f) for f in pcm]) & (power > DIGITAL_SILENCE)
        for start, end in _runs(quiet):
            if (end - start) * frame < MIN_QUIET_S * SAMPLE_RATE:
                continue
            median = float(np.median(power[start:end]))
            keep = power[start:end] <= median * 10 ** (MAX_OVER_MEDIAN_DB / 10)
            pieces.append(frames[start:end][keep].reshape(-1) / np.sqrt(median))
    if not pieces:
        raise ValueError("the pool holds no stretch of room tone")
    return np.concatenate(pieces).astype(np.float32)


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], flags.astype(np.int8), [0]])))
    return list(zip(edges[::2], edges[1::2]))


def noise_for(stream: Stream, tone: np.ndarray, others: Sequence[Utterance], rng: np.random.Generator) -> np.ndarray:
    """Room tone (from a random place in the bank, looped) with babble of `others` under it."""
    n = len(stream.audio)
    start = int(rng.integers(0, len(tone)))
    noise = np.resize(np.roll(tone, -start), n).astype(np.float32)
    babble = np.zeros(n, np.float32)
    for u in rng.choice(len(others), size=min(BABBLE_TALKERS, len(others)), replace=False):
        voice = np.resize(others[int(u)].audio, n)
        power = float(np.mean(voice**2))
        if power > 0:
            babble += voice / np.sqrt(power)
    babble_power = float(np.mean(babble**2))
    if babble_power > 0:
        noise += babble * np.sqrt(10 ** (BABBLE_DB / 10) / babble_power)
    return noise


def mix(stream: Stream, noise: np.ndarray, snr_db: float) -> Stream:
    """The stream with `noise` at `snr_db` below the speech's mean power over its spans."""
    speech = np.concatenate([stream.audio[a:b] for a, b in stream.spans])
    gain = np.sqrt(float(np.mean(speech**2)) / (float(np.mean(noise**2)) * 10 ** (snr_db / 10)))
    audio = np.clip(stream.audio + gain * noise, -1.0, 1.0).astype(np.float32)
    return Stream(f"{stream.id}_noise{snr_db:g}db", audio, stream.spans, stream.references, stream.ids)


def write(streams: Sequence[Stream], out: Path) -> Path:
    """The streams as WAVs and a manifest.tsv (id, file, duration_s, reference) beside
    segments.tsv (each utterance's span), as the dev set's longform/ holds them."""
    import soundfile as sf

    out.mkdir(parents=True, exist_ok=True)
    with (out / "manifest.tsv").open("w", newline="") as f, (out / "segments.tsv").open("w", newline="") as g:
        manifest, segments = csv.writer(f, delimiter="\t"), csv.writer(g, delimiter="\t")
        manifest.writerow(["id", "file", "duration_s", "reference"])
        segments.writerow(["stream_id", "index", "utt_id", "start_sample", "end_sample", "reference"])
        for s in streams:
            sf.write(out / f"{s.id}.wav", s.audio, SAMPLE_RATE, subtype="PCM_16")
            manifest.writerow([s.id, f"{s.id}.wav", f"{len(s.audio) / SAMPLE_RATE:.3f}", " ".join(s.references)])
            for i, ((a, b), ref, uid) in enumerate(zip(s.spans, s.references, s.ids)):
                segments.writerow([s.id, i, uid, a, b, ref])
    return out / "manifest.tsv"
