"""The engine on real speech: window walking with timestamp seek, carry-over, gates, languages."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
from helpers.audio import as_float, dev_clip
from helpers.engines import make_engine
from helpers.text import normalize, wer

from edgeasr.asr.decoding import WindowResult
from edgeasr.asr.engine import EngineOptions, Fallback
from edgeasr.asr.gates import LowConfidence
from edgeasr.asr.text.kept_pieces import KeptPieces
from edgeasr.asr.transcriber import Transcriber
from edgeasr.bundle import load_bundle


@pytest.fixture(scope="module")
def kept(tiny_engine):
    """The rules that choose a window's pieces, as the engine has them."""
    o = tiny_engine.options
    return KeptPieces(tiny_engine.bundle, tiny_engine.sessions.tokenizer, o.gates, o.guards, o.decoding.task)


def loops(text: str, n: int = 3, times: int = 3) -> bool:
    """True when some n-word phrase repeats `times` times in a row: a decoding loop."""
    words = normalize(text).split()
    for i in range(len(words) - n * times + 1):
        gram = words[i : i + n]
        if all(words[i + k * n : i + (k + 1) * n] == gram for k in range(times)):
            return True
    return False


def test_jfk_across_the_window_edge(tiny_engine, dev_dir, dev_manifest):
    ref = next(r["reference"] for r in dev_manifest if r["id"] == "jfk_inaugural-1961")
    result = tiny_engine.transcribe(as_float(dev_clip("jfk_inaugural-1961")))
    assert result.windows == 2  # 11 s: the second window starts at the last timestamp
    assert wer(ref, result.text) <= 0.05
    assert not loops(result.text)
    starts = [s.start for s in result.segments]
    assert starts == sorted(starts) and result.segments[-1].end <= 11.5


def test_long_utterances_do_not_loop(tiny_engine, dev_dir, dev_manifest):
    long = [r for r in dev_manifest if float(r["duration_s"]) > 10.0]
    assert len(long) >= 5
    refs, hyps = [], []
    for row in long:
        result = tiny_engine.transcribe(as_float(dev_clip(row["id"])))
        assert not loops(result.text), (row["id"], result.text)
        assert result.windows >= 2
        refs.append(row["reference"])
        hyps.append(result.text)
    import jiwer

    assert jiwer.wer([normalize(r) for r in refs], [normalize(h) for h in hyps]) < 0.25


def test_cut_window_carries_the_unfinished_tail(tiny_engine, dev_dir, dev_manifest):
    """A segment cut mid-speech (final=False) leaves its open tail for the next call."""
    name = "ls_dev-clean_2412-153948-0000"  # 11.7 s, one sentence running over 10 s
    ref = next(r["reference"] for r in dev_manifest if r["id"] == name)
    audio = as_float(dev_clip(name))
    cut = 16000 * 9
    first = tiny_engine.transcribe(audio[:cut], final=False)
    assert 0 < first.consumed_samples < cut
    rest = tiny_engine.transcribe(np.concatenate([audio[first.consumed_samples : cut], audio[cut:]]))
    assert wer(ref, first.text + " " + rest.text) <= 0.1


def test_numpy_blas_runs_on_one_thread(tiny_engine):
    """An OpenBLAS worker spinning after the log-mel's matrix product took the second core
    from the encoder and the decoder (engine.single_threaded_blas)."""
    from threadpoolctl import threadpool_info

    pools = [p for p in threadpool_info() if p["user_api"] == "blas"]
    assert pools and all(p["num_threads"] == 1 for p in pools)


def test_no_thread_spins_once_the_audio_is_done(tiny_engine, dev_dir):
    """onnxruntime's threads spin while they wait for work, which an always-on daemon can
    only afford while it works: the encoder's stop when its run ends, the decoder's ~1 ms
    after a window's last token. (One pool at onnxruntime's default spin took ~35 ms of CPU
    after its last run; ours take ~5 ms.)"""
    import time

    tiny_engine.transcribe(as_float(dev_clip("jfk_inaugural-1961"))[: 16000 * 4])
    cpu = time.process_time()  # every thread of this process
    time.sleep(0.5)
    assert time.process_time() - cpu < 0.02


def test_silence_gives_no_text(tiny_engine):
    result = tiny_engine.transcribe(np.zeros(16000 * 4, np.float32))
    assert result.text == ""


def test_an_engine_is_built_whole_and_a_variant_shares_its_sessions(tiny_engine):
    with pytest.raises(AttributeError, match="built whole"):
        tiny_engine.options = replace(tiny_engine.options, beam_size=3)
    greedy = tiny_engine.variant(replace(tiny_engine.options, on_gate_fail="drop"))
    assert greedy.sessions is tiny_engine.sessions and greedy.options.on_gate_fail == "drop"
    assert tiny_engine.options.on_gate_fail == "retry"


def test_noise_is_dropped_by_the_gates(tiny_engine):
    rng = np.random.default_rng(7)
    noise = (0.05 * rng.standard_normal(16000 * 6)).astype(np.float32)
    result = tiny_engine.transcribe(noise)
    assert result.text == "" or result.dropped_windows >= 1


@pytest.mark.parametrize("on_fail", ["drop", "retry", "keep"])
def test_a_window_that_fails_a_gate_is_dropped_retried_or_kept(tiny_engine, dev_dir, on_fail):
    """A gate no window can pass (every log-probability is below 0.1): "retry" decodes the
    window again at each fallback temperature (0.2 ... 1.0), counts every failure and the
    decoder passes of every attempt, and keeps the best attempt, the window not being
    silence; "keep" keeps the text; "drop" drops it."""
    strict = Transcriber(tiny_engine.sessions, EngineOptions(tiny_engine.options.decoding, gates=(LowConfidence(0.1),),
                                                        on_gate_fail=on_fail, fallback=Fallback(0.2)))
    result = strict.transcribe(as_float(dev_clip("alsa_front-center")))
    assert strict.gate_failures == {"avg_logprob": 6 if on_fail == "retry" else 1}
    assert result.windows == 1
    # a pass per generated token and one for end-of-text; a retry adds the other attempts'
    other_attempts = result.decoder_steps - (result.tokens + 1)
    assert other_attempts >= 5 if on_fail == "retry" else other_attempts == 0
    if on_fail == "drop":
        assert result.dropped_windows == 1 and result.text == ""
    else:
        assert result.dropped_windows == 0 and "center" in result.text.lower()


def test_the_fallback_is_reproducible(tiny_engine, dev_dir):
    """The retries sample, from a generator seeded per window: the same audio, the same text."""
    strict = Transcriber(tiny_engine.sessions, EngineOptions(tiny_engine.options.decoding, gates=(LowConfidence(0.1),),
                                                        on_gate_fail="retry"))
    audio = as_float(dev_clip("ls_test-other_2414-128291-0008"))
    assert strict.transcribe(audio).text == strict.transcribe(audio).text


def test_a_silent_window_is_dropped_even_when_retrying(tiny_engine):
    retrying = Transcriber(tiny_engine.sessions, EngineOptions(tiny_engine.options.decoding, on_gate_fail="retry"))
    result = retrying.transcribe(np.zeros(16000 * 4, np.float32))
    assert result.text == ""


def test_multilingual_bundle_detects_english(base_bundle, dev_dir, dev_manifest):
    bundle = load_bundle(base_bundle)
    assert bundle.multilingual and bundle.tokens.sot == 50258 and bundle.tokens.languages["en"] == 50259
    engine = make_engine(base_bundle)
    name = "ls_test-other_1688-142285-0003"
    ref = next(r["reference"] for r in dev_manifest if r["id"] == name)
    result = engine.transcribe(as_float(dev_clip(name)))
    assert result.language == "en"
    assert wer(ref, result.text) <= 0.15
    assert re.search(r"[a-z]", result.text.lower())


def test_speech_past_the_window_is_cut_in_a_pause(tiny_engine, dev_dir, dev_manifest):
    """Two sentences 0.15 s apart (with their own quiet, 0.6 s), 11.3 s in all: the first
    window ends in the pause (the
    segmenter's rule) and both sentences come out whole."""
    a, b = "ls_test-other_1998-15444-0004", "ls_test-other_1688-142285-0002"
    pause = np.zeros(2400, np.float32)
    audio = np.concatenate([as_float(dev_clip(a)), pause, as_float(dev_clip(b))])
    result = tiny_engine.transcribe(audio)
    pause_at = len(as_float(dev_clip(a))) / 16000
    assert result.windows == 2
    assert any(abs(s.end - pause_at) < 0.6 for s in result.segments)  # a segment ends in the pause
    refs = {row["id"]: row["reference"] for row in dev_manifest}
    reference = refs[a] + " " + refs[b]
    assert wer(reference, result.text) <= 0.2


def test_a_window_that_stops_after_opening_a_segment_goes_on_from_there(tiny_engine, kept):
    """"<0.00> text <6.26><6.26>" then end-of-text with 3.7 s of the window left: the decoder
    never transcribed the speech after 6.26 s, so the next window starts there (as openai
    seeks). A window that stops on a single closing timestamp is done."""
    tok, per_pos, sr = tiny_engine.bundle.tokens, tiny_engine.bundle.audio.seconds_per_position, 16000
    text = tiny_engine.sessions.tokenizer.encode(" I am free to confess that the")

    def result(tokens):
        return WindowResult(tokens, [-0.1] * len(tokens), 0.01, "en", hit_cap=False)

    def ts(seconds):
        return tok.timestamp_begin + round(seconds / per_pos)

    chunk = np.zeros(int(9.96 * sr), np.float32)
    for last in (True, False):
        pieces, advance = kept.keep(result([ts(0), *text, ts(6.26), ts(6.26)]), chunk, last)
        assert advance == int(6.26 * sr) and pieces[0].tokens == text
        _, advance = kept.keep(result([ts(0), *text, ts(6.26)]), chunk, last)
        assert advance == len(chunk)
    _, advance = kept.keep(result([ts(0), *text, ts(9.92), ts(9.92)]), chunk, True)
    assert advance == len(chunk)  # less than a word's worth left


def test_a_loop_at_the_window_edge_is_decoded_again_from_the_looped_phrase(tiny_engine, kept):
    """base on a 15 s utterance: "...is good.<6.92><6.92> But his, he makes me harshly
    feel.<7.92><7.92> He makes me harshly feel.<8.92>..." to the token cap. The loop's
    timestamps are made up, the first saying's end too: with audio after the window, the
    next window starts where that phrase began; at the end of the audio the loop is cut."""
    tok, per_pos, sr = tiny_engine.bundle.tokens, tiny_engine.bundle.audio.seconds_per_position, 16000
    first = tiny_engine.sessions.tokenizer.encode(" There is iron, they say, in all our blood.")
    phrase = tiny_engine.sessions.tokenizer.encode(" But his, he makes me harshly feel.")
    again = tiny_engine.sessions.tokenizer.encode(" He makes me harshly feel.")

    def ts(seconds):
        return tok.timestamp_begin + round(seconds / per_pos)

    tokens = [ts(0), *first, ts(6.92), ts(6.92), *phrase, ts(7.92), ts(7.92), *again, ts(8.92),
              ts(8.92), *again, ts(9.42), ts(9.42), *again[:2]]
    looping = WindowResult(tokens, [-0.1] * len(tokens), 0.01, "en", hit_cap=True)
    chunk = np.zeros(10 * sr, np.float32)
    pieces, advance = kept.keep(looping, chunk, False, more=True)
    assert [p.tokens for p in pieces] == [first] and advance == int(6.92 * sr)
    pieces, advance = kept.keep(looping, chunk, True, more=False)  # nothing after it: cut
    assert [p.tokens for p in pieces][:2] == [first, phrase]
    assert sum(p.tokens == again for p in pieces) <= 1


def test_the_last_second_after_kept_text_is_dropped_when_the_model_calls_it_silence(tiny_engine, kept):
    """base read "...lobster fat." and then "Mr. Fat." over the 0.8 s left after it (no-speech
    probability 0.54): text kept before, under a second, likelier silence than speech. The
    same window alone (a one-word command), or with the model sure of speech, is kept."""
    tok, per_pos, sr = tiny_engine.bundle.tokens, tiny_engine.bundle.audio.seconds_per_position, 16000
    text = tiny_engine.sessions.tokenizer.encode(" Mr. Fat.")
    tokens = [tok.timestamp_begin, *text, tok.timestamp_begin + round(0.78 / per_pos)]
    chunk = np.zeros(int(0.785 * sr), np.float32)

    def keep(no_speech: float, follows: bool):
        return kept.keep(WindowResult(tokens, [-0.9] * len(tokens), no_speech, "en", hit_cap=False), chunk, True,
                         follows=follows)

    assert keep(0.54, follows=True) == ([], len(chunk))
    assert [p.tokens for p in keep(0.54, follows=False)[0]] == [text]
    assert [p.tokens for p in keep(0.2, follows=True)[0]] == [text]
    longer = np.zeros(int(1.5 * sr), np.float32)
    kept_longer, _ = kept.keep(WindowResult(tokens, [-0.9] * len(tokens), 0.54, "en", hit_cap=False), longer, True,
                               follows=True)
    assert [p.tokens for p in kept_longer] == [text]
