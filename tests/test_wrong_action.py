"""A wrong action is worse than no action: the command reading takes no sentence when another
that asks something else of the home is nearly as likely, reads a command made only of free
text like text that is none, and makes no words of digits."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from edgeasr.asr.commands.reader import _has_letters, choose
from edgeasr.asr.commands.vocabulary import AMBIGUOUS
from edgeasr.home.names import load_home
from edgeasr.home.sentences import HomeSentences
from edgeasr.stages import Intent

HELD_OUT = Path(__file__).parent / "data" / "held-out-home.yaml"


@pytest.fixture(scope="module")
def held_out():
    vocabulary = load_home(HELD_OUT)
    return HomeSentences(vocabulary, "en"), [said for name in vocabulary.names for said in name.spoken]


def test_two_sentences_that_ask_different_things_alike_likely_give_none(held_out):
    """"unmute our Bose Soundbar" heard "I mute our bowl sound bar.": "Mute ..." came first by
    0.03 nats a token, and was taken."""
    sentences, names = held_out
    heard = "I mute our bowl sound bar."
    close = [("Mute our Bose Soundbar.", -0.70, 8), ("unmute our Bose Soundbar.", -0.73, 8)]
    assert choose(heard, -0.60, close, sentences, names) is None
    apart = [close[0], ("unmute our Bose Soundbar.", -0.70 - 1.1 * AMBIGUOUS / 8, 8)]
    taken = choose(heard, -0.60, apart, sentences, names)
    assert taken is not None and taken.intent.name == "HassMediaPlayerMute"


def test_sentences_that_ask_the_same_thing_are_no_rivals(held_out):
    """Ways of saying one command leave its action the same; a sentence the text could not have
    been heard as is no reading at all, so no rival either."""
    sentences, names = held_out
    same = [("Mute our Bose Soundbar.", -0.70, 8), ("Mute the Bose Soundbar.", -0.71, 8)]
    taken = choose("I mute our bowl sound bar.", -0.60, same, sentences, names)
    assert taken is not None and taken.text == "Mute our Bose Soundbar."
    unheard = [same[0], ("What is the temperature of the heat pump?", -0.71, 11)]
    assert choose("I mute our bowl sound bar.", -0.60, unheard, sentences, names) == taken
    assert choose("I mute our bowl sound bar.", -0.60, [], sentences, names) is None


def test_the_bar_is_nine_to_one():
    assert math.isclose(math.exp(AMBIGUOUS), 9.0)


def test_digits_alone_are_no_words_misheard():
    assert not _has_letters("1.5.5.") and not _has_letters("") and _has_letters("Oz time.")


def test_an_intent_says_which_slots_hold_free_text_without_changing_what_it_asks():
    delayed = Intent("HassStartTimer", (("conversation_command", "set a timer for 2 minutes"), ("seconds", "30")),
                     free=frozenset({"conversation_command"}))
    assert delayed == Intent("HassStartTimer", delayed.slots) and delayed.free


def test_home_assistants_matcher_says_which_slots_were_free_text():
    home = HomeSentences(load_home(Path(__file__).parent / "data" / "home.yaml"), "en")
    listed = home.recognize("add apples to my Groceries list")
    delayed = home.recognize("set a timer for 2 minutes in 30 seconds")
    timer = home.recognize("set a timer for 2 minutes and 30 seconds")
    assert listed is not None and listed.free == {"item"}
    assert delayed is not None and "conversation_command" in delayed.free
    assert timer is not None and not timer.free and timer.slots == (("minutes", "2"), ("seconds", "30"))


def test_a_windows_log_probabilities_are_the_models_own_under_a_boost(tiny_bundle, dev_dir):
    """The keyterm boost biases which token is chosen; what the quality gates judge is how likely
    the model finds the tokens chosen. Judged on boosted logits, a clear "Next." spoken quietly
    (every name's first token raised, its own lowered) fell under the log-probability gate and the
    request came back empty."""
    from dataclasses import replace

    from helpers.ct2_reference import CLIPS, mel_of

    from edgeasr.asr.decoding import DecoderSession, preset_options
    from edgeasr.asr.encoder import OnnxEncoder
    from edgeasr.asr.greedy import decode_window
    from edgeasr.asr.tokenizer import Tokenizer
    from edgeasr.bundle import load_bundle

    bundle = load_bundle(tiny_bundle)
    encoder, session = OnnxEncoder(bundle, "int8"), DecoderSession(bundle, "int8", 2)
    features = encoder.encode(mel_of(dev_dir, CLIPS[1], bundle))
    options = preset_options("balanced")
    names = [Tokenizer(bundle).encode(" " + name) for name in ("Zyxel Router", "Quooker Tap", "Vornado")]
    boosted = replace(options, keyterms=tuple(tuple(n) for n in names), keyterm_boost=1.0)
    plain, biased = (decode_window(session, features, o, 9.0) for o in (options, boosted))
    assert plain.tokens == biased.tokens  # no such name was said: the same text
    assert np.allclose(plain.logprobs, biased.logprobs, atol=1e-4)


def test_a_command_read_as_decoded_writes_its_numbers_apart_from_their_units(held_out):
    """Whisper writes "a 10-minute timer"; Home Assistant 2025.4's matcher takes no command so
    written (newer ones do), and both take "a 10 minute timer": the reading writes it so."""
    from edgeasr.asr.commands.reader import CommandReader, EncodedWindow, Heard
    from edgeasr.asr.decoding import DecodingOptions
    from edgeasr.asr.tail import WindowEnd
    from edgeasr.stages import TextSegment, Transcription

    sentences, _ = held_out

    class AsDecoded:
        """The hearing's answer for a text that is already one of the home's sentences."""

        def hear(self, text, *args, **kwargs):
            intent = sentences.recognize(text)
            return None if intent is None else Heard(text, intent)

    def read(text: str) -> Transcription:
        segment = TextSegment(0.0, 2.0, " " + text, (1, 2), -0.2, 0.01, 1.0)
        decoded = Transcription(text, (segment,), "en", windows=1, tokens=2, consumed_samples=32000)
        reader = CommandReader(AsDecoded(), lambda vocabulary, language: sentences, None,
                               DecodingOptions(), max_prompt=224)
        return reader.read(decoded, EncodedWindow(np.zeros((1, 1)), WindowEnd(0.0)), load_home(HELD_OUT))

    timer = read("Set a 10-minute timer.")
    assert timer.text == "Set a 10 minute timer." and timer.segments[0].text == " Set a 10 minute timer."
    assert timer.intent is not None and timer.intent.name == "HassStartTimer"
    assert timer.intent == sentences.recognize("Set a 10-minute timer.")
    spaced = read("Start a 30-second timer.")
    assert spaced.text == "Start a 30 second timer." and spaced.intent is not None
    plain = read("Set a timer for 5 minutes.")
    assert plain.text == "Set a timer for 5 minutes." and plain.intent is not None
