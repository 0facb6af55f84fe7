"""Rules that judge decoded text by the audio under it, and the text repairs: on real dev audio
and on transcripts tiny.en and base once wrote."""

from __future__ import annotations

import numpy as np
import pytest

from edgeasr.asr.text.cleanup import drop_unpaired_quotes, join_bare_punctuation, tidy, unpaired_quotes
from edgeasr.asr.text.pieces import Piece, find_loop, trim_repeats
from edgeasr.asr.text.spoken import SpeechMap, silent, stock_phrase, stock_phrase_unspoken
from edgeasr.audio.files import load_audio
from edgeasr.audio.vad import SpeechJudge
from edgeasr.config import VadOptions
from edgeasr.stages import TextSegment, Word


def seg(start: float, end: float, text: str) -> TextSegment:
    return TextSegment(start, end, text, (1, 2), -0.2, 0.01, 1.0)


def test_a_lone_full_stop_joins_the_text_before_it():
    out = join_bare_punctuation([seg(0, 4, " They were all sleeping"), seg(4, 4.3, " .")])
    assert [s.text for s in out] == [" They were all sleeping."]
    assert out[0].end == 4.3
    assert join_bare_punctuation([seg(0, 0.3, " ."), seg(0.3, 2, " Hello")])[0].text == " Hello"


def test_a_quote_without_its_pair_is_removed_and_a_paired_one_kept():
    text = ' which led me to leave my native country." The narrative would be tedious to him.'
    assert unpaired_quotes(text) == {text.index('"')}
    parts = [seg(0, 5, ' which led me to leave my native country."'), seg(5, 9, " The narrative would be tedious to him.")]
    out = drop_unpaired_quotes(parts)
    assert "".join(s.text for s in out) == text.replace('"', "")
    paired = [seg(0, 3, ' He said "stop" and left.')]
    assert tidy(paired) == paired  # a quote with its pair stays


def worded(start: float, text: str) -> TextSegment:
    """A segment whose words (one per space-led piece, half a second each) spell its text."""
    words = tuple(Word(" " + w, start + i / 2, start + (i + 1) / 2, 0.9) for i, w in enumerate(text.split()))
    return TextSegment(start, start + len(words) / 2, text, (1, 2), -0.2, 0.01, 1.0, words)


def test_the_repairs_keep_the_words_spelling_the_text():
    out = tidy([worded(0, ' which led me to leave my native country."'), worded(4, " The end"), worded(5, " .")])
    assert [s.text for s in out] == [" which led me to leave my native country.", " The end."]
    for s in out:
        assert "".join(w.word for w in s.words) == s.text
    assert out[1].words[-1] == Word(" end.", 4.5, 5.5, 0.9)  # the full stop's end


def test_a_complete_transcription_ends_in_a_full_stop_not_an_ellipsis():
    """tiny.en on ls_test-other_1688-142285-0000 ends "... too much of steel. Anon...": scored
    after Whisper's normalizer that is "anon ." with a lone "." as a word."""
    from helpers.text import normalize

    out = tidy([worded(0, " has got a little too much of steel."), worded(4, " Anon...")])
    assert out[-1].text == " Anon." and "".join(w.word for w in out[-1].words) == " Anon."
    assert normalize("".join(s.text for s in out)).split()[-1] == "anon"
    unfinished = [worded(0, " and it was natural therefore...")]
    assert tidy(unfinished, complete=False) == unfinished  # speech goes on: it may continue
    assert tidy([worded(0, " ...")]) == []  # no words: nothing to end


def test_stock_phrases_are_recognised_whatever_the_punctuation():
    assert stock_phrase(" Thank you.") and stock_phrase("you") and stock_phrase("Thanks for watching!")
    assert not stock_phrase(" Thank you for the fence.")


@pytest.fixture(scope="module")
def front_center(dev_dir):
    """cmu_goforward ("go forward ten meters", 2.8 s) then 3 s of digital silence, as a speech map."""
    speech = load_audio(dev_dir / "audio" / "cmu_goforward.wav", 16000)
    audio = np.concatenate([speech, np.zeros(16000 * 3, np.float32)])
    judge = SpeechJudge(VadOptions())
    return SpeechMap(judge.judge(audio).flags, judge.frame / 16000), len(speech) / 16000


def test_a_segment_over_silence_is_found_and_a_stock_phrase_needs_speech_under_most_of_it(front_center):
    speech, speech_end = front_center
    assert not silent(speech, 0.0, speech_end)
    assert silent(speech, speech_end + 0.6, speech_end + 2.0)
    assert stock_phrase_unspoken(speech, speech_end - 0.3, speech_end + 1.5, " Thank you.")
    assert not stock_phrase_unspoken(speech, 0.0, speech_end, " Thank you.")
    assert not stock_phrase_unspoken(speech, speech_end - 0.3, speech_end + 1.5, " Go forward ten meters.")


def test_a_repeat_over_speech_is_kept_and_one_over_silence_cut(front_center):
    """"go forward ten meters" said twice, as two timestamped segments: kept if the second has speech
    under it, cut where it lies over the silence after the speech (a loop)."""
    speech, speech_end = front_center
    words = [100, 200, 300, 400, 13]  # any five tokens: compared by their `key` (here the id)
    half = speech_end / 2
    said_twice = [Piece(0.0, half, words, [-0.1] * 5), Piece(half, speech_end, words, [-0.1] * 5)]
    assert trim_repeats(said_twice, speech) == said_twice
    looping = [Piece(0.0, speech_end, words, [-0.1] * 5), Piece(speech_end + 0.5, speech_end + 2.5, words, [-0.1] * 5)]
    assert trim_repeats(looping, speech) == looping[:1]
    assert trim_repeats(said_twice) == said_twice[:1]  # without the VAD, every repeat is a loop


def test_a_repeat_inside_a_segment_is_judged_by_its_token_times(front_center):
    """The same phrase twice in one segment (no timestamp between them): kept when the
    alignment puts the second saying over speech, as long as the first; cut when it squeezes
    it into the last moment of the audio, or puts it over the silence after the speech."""
    speech, speech_end = front_center
    words = [100, 200, 300, 400, 13]
    one_segment = [Piece(0.0, speech_end, words * 2, [-0.1] * 10)]
    half = speech_end / 2

    def times(first: float, second: float, end: float):
        """Token starts for the two sayings, each spread evenly, then the end of the text."""
        return lambda: [*np.linspace(first, second, 6)[:5], *np.linspace(second, end, 6)]

    assert trim_repeats(one_segment, speech, times(0.0, half, speech_end)) == one_segment
    squeezed = times(0.0, speech_end - 0.1, speech_end)
    assert trim_repeats(one_segment, speech, squeezed)[0].tokens == words
    past_the_speech = times(0.0, speech_end + 0.5, speech_end + 0.5 + half)
    assert trim_repeats(one_segment, speech, past_the_speech)[0].tokens == words
    assert trim_repeats(one_segment, speech)[0].tokens == words  # no times: a loop, as ever


def test_a_repeat_joined_to_its_phrase_by_a_word_is_judged_too(front_center):
    """"...he makes me harshly feel, and he makes me harshly feel." (tiny.en, a window of
    dev_stream_02): a loop often joins the phrase to its repeat with a word. Judged like an
    immediate repeat: cut when squeezed into the end, kept when said again over speech."""
    speech, speech_end = front_center
    phrase, joined = [100, 200, 300, 400, 500], [600]  # five tokens, then "and"
    one_segment = [Piece(0.0, speech_end, phrase + joined + phrase, [-0.1] * 11)]
    half = speech_end / 2

    def times(second: float, end: float):
        return lambda: [*np.linspace(0.0, second, 7)[:6], *np.linspace(second, end, 6)]

    assert trim_repeats(one_segment, speech, times(half, speech_end)) == one_segment
    assert trim_repeats(one_segment, speech, times(speech_end - 0.05, speech_end))[0].tokens == phrase + joined


def test_a_loop_is_found_whatever_its_case_and_marks():
    """A loop rarely repeats its tokens exactly ("interviews and views. She missed the pleasant
    little interviews, the first ..."): tokens are compared by a key that folds case and leaves
    punctuation out."""
    spelling = {1: " she", 2: " She", 3: " missed", 4: " the", 5: " pleasant", 6: " little", 7: " interviews",
                8: ",", 9: ".", 10: " and", 11: " views"}

    def key(token: int) -> str:
        return "".join(c for c in spelling[token].lower() if c.isalnum())

    first = Piece(0.0, 4.0, [1, 3, 4, 5, 6, 7, 10, 11, 9], [-0.1] * 9)
    loop = Piece(4.0, None, [2, 3, 4, 5, 6, 7, 8, 4], [-0.1] * 8)
    kept, loop_from = find_loop([first, loop], key=key)
    assert kept == [first] and loop_from == 0
    assert find_loop([first, loop])[1] is None  # by token ids alone, " she" is not " She"
