"""Commands in German, French, Spanish, Italian and Dutch: each language's home loads, Home
Assistant's sentences of that language hear its names, and the command reading puts a name
heard wrong right, or takes nothing when two commands are alike likely (engine-free: the
sentences and scores the search would give)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeasr.asr.commands.reader import choose, withheld
from edgeasr.asr.commands.vocabulary import AMBIGUOUS, DOUBTFUL_LIKENESS, unsure
from edgeasr.home.names import load_home
from edgeasr.home.sentences import HomeSentences

DATA = Path(__file__).parent / "data"
# language: (the heard text, a name misheard; the home's sentence meant; its rival, the
# opposite command; the name)
CASES = {
    "de": ("Schalte Kaffee Maschine ein.", "schalte Kaffeemaschine ein", "schalte Kaffeemaschine aus",
           "Kaffeemaschine"),
    "fr": ("Allume la cafe tière.", "allume la Cafetière", "éteins la Cafetière", "Cafetière"),
    "es": ("Enciende la cafe tera.", "enciende la Cafetera", "apaga la Cafetera", "Cafetera"),
    "it": ("Accendi presa vemo.", "accendi Presa Wemo", "spegni Presa Wemo", "Presa Wemo"),
    "nl": ("Zet koffie zet apparaat aan.", "zet Koffiezetapparaat aan", "zet Koffiezetapparaat uit",
           "Koffiezetapparaat"),
}
OWN = -0.60  # the heard text's mean log-probability per token
TOKENS = 9


@pytest.fixture(scope="module", params=sorted(CASES))
def home(request):
    vocabulary = load_home(DATA / f"home-{request.param}.yaml")
    names = [said for name in vocabulary.names for said in name.spoken]
    return request.param, HomeSentences(vocabulary, request.param), names


def test_the_homes_language_is_its_own_and_its_sentences_hear_its_names(home):
    lang, sentences, _ = home
    _, meant, rival, name = CASES[lang]
    assert sentences.language == lang
    on, off = sentences.recognize(meant), sentences.recognize(rival)
    assert on is not None and off is not None and on.name != off.name
    assert dict(on.slots)["name"] == dict(off.slots)["name"] == name


def test_a_name_heard_wrong_is_put_right_in_each_language(home):
    lang, sentences, names = home
    heard, meant, _, name = CASES[lang]
    assert sentences.recognize(heard) is None
    taken = choose(heard, OWN, [(meant, OWN - 1.0, TOKENS)], sentences, names)
    assert taken is not None and taken.text == meant and ("name", name) in taken.intent.slots


def test_two_commands_alike_likely_give_none_in_each_language(home):
    lang, sentences, names = home
    heard, meant, rival, _ = CASES[lang]
    close = [(meant, OWN - 0.50, TOKENS), (rival, OWN - 0.52, TOKENS)]
    assert choose(heard, OWN, close, sentences, names) is None
    apart = [close[0], (rival, OWN - 0.50 - 1.1 * AMBIGUOUS / TOKENS, TOKENS)]
    taken = choose(heard, OWN, apart, sentences, names)
    assert taken is not None and taken.text == meant


def test_a_question_heard_as_nonsense_becomes_no_command():
    """Base heard "warum ist der Himmel blau" as "Warum ist mir Timmellau?", and found two of the
    German home's sentences within the margin: the likelier says off, the other on. A rival
    that says other letters than the text is still a rival: neither is taken."""
    vocabulary = load_home(DATA / "home-de.yaml")
    names = [said for name in vocabulary.names for said in name.spoken]
    found = [("Lumi Streifen, Schlafzimmer, Aus.", -1.669, 13), ("Lumi Streifen, Schlafzimmer, ein", -1.710, 12)]
    sentences = HomeSentences(vocabulary, "de")
    assert choose("Warum ist mir Timmellau?", -1.638, found, sentences, names) is None
    # the likeliest reading says names and spells nothing of the text: nothing is taken
    unlike = [("Lumi Streifen, Schlafzimmer, Aus!", -1.0, 13)]
    assert choose("den Armen mehr Zudrager zu übschicken.", -0.9, unlike, sentences, names) is None


def test_a_window_the_decoder_did_not_know_is_read_only_as_letters_alike():
    """Base heard "Timer Status" (espeak-ng) as "Time Start." and failed its gates at every
    temperature; the likeliest of the German home's sentences, "Thermostat, aus.", came within
    the margin and would have turned the heating off. Over such a window outside English the
    sentence must spell the text's letters about alike: "Timer, Fortsetzen," for
    "Timerfortizen" still does."""
    vocabulary = load_home(DATA / "home-de.yaml")
    names = [said for name in vocabulary.names for said in name.spoken]
    sentences = HomeSentences(vocabulary, "de")
    wrong = [("Thermostat, aus.", -1.364, 6), ("Die Thermostat, aus.", -1.869, 7)]
    needed = DOUBTFUL_LIKENESS
    assert choose("Time Start.", -1.027, wrong, sentences, names) is not None  # a gate passed: read as before
    assert choose("Time Start.", -1.027, wrong, sentences, names, needed) is None
    right = [("Timer, Fortsetzen,", -1.607, 8), ("Timer, 40.", -1.769, 6)]
    taken = choose("Timerfortizen", -0.959, right, sentences, names, needed)
    assert taken is not None and taken.intent.name == "HassUnpauseTimer"


def test_only_doubtful_windows_outside_english_are_unsure():
    """tiny.en's and base's readings of English windows that failed their gates were right
    (tiny.en 35 of 35, base 30 of 30 on 665 commands): English is read as before."""
    assert unsure("de", doubtful=True) and unsure("fr", doubtful=True)
    assert not unsure("de", doubtful=False) and not unsure("en", doubtful=True)
    assert 0.5 < DOUBTFUL_LIKENESS < 1.0


def test_free_text_from_a_window_the_decoder_did_not_know_is_no_command():
    """Base heard "ma sœur vient dîner vendredi soir" (espeak-ng) as "Mais c'est mieux d'y aller
    mon œuvres d" and failed its gates at every temperature. Home Assistant's French sentences
    take "mais" for "mets" (its `mets_dirty` rule) and would have played a search for the rest:
    such a text is withheld. Commands without free text, and any text from a window a gate
    passed, go out as before."""
    french = HomeSentences(load_home(DATA / "home-fr.yaml"), "fr")
    search = french.recognize("Mais c'est mieux d'y aller mon œuvres d")
    assert search is not None and search.name == "HassMediaSearchAndPlay" and search.free == {"search_query"}
    assert withheld(search, unsure("fr", doubtful=True))
    assert not withheld(search, unsure("fr", doubtful=False))
    assert not withheld(french.recognize("allume la Cafetière"), unsure("fr", doubtful=True))
    assert not withheld(french.recognize("ma sœur vient dîner vendredi soir"), unsure("fr", doubtful=True))


def test_a_withheld_reading_leaves_the_transcription_empty():
    """The reader asks the hearing whether the window was unsure (its language and its doubtful
    windows) and leaves a withheld window's transcription empty: no text, no intent, and
    nothing of it carried as the next window's prompt."""
    import numpy as np

    from edgeasr.asr.commands.reader import WITHHELD, CommandReader, EncodedWindow
    from edgeasr.asr.decoding import DecodingOptions
    from edgeasr.asr.tail import WindowEnd
    from edgeasr.stages import TextSegment, Transcription

    vocabulary = load_home(DATA / "home-fr.yaml")
    french = HomeSentences(vocabulary, "fr")

    class FreeTextOnly:
        """The hearing's answer for a text no sentence of the home was taken for."""

        def hear(self, text, *args, unsure=False, **kwargs):
            return WITHHELD if withheld(french.recognize(text), unsure) else None

    def read(doubtful: int, language: str = "fr") -> Transcription:
        text = "Mais c'est mieux d'y aller mon œuvres d"
        segment = TextSegment(0.0, 2.0, " " + text, (7, 8), -1.2, 0.01, 1.0)
        decoded = Transcription(text, (segment,), language, windows=1, tokens=2, consumed_samples=32000,
                                doubtful_windows=doubtful, context=(5, 6, 7, 8))
        reader = CommandReader(FreeTextOnly(), lambda vocabulary, language: french, None,
                               DecodingOptions(), max_prompt=224)
        return reader.read(decoded, EncodedWindow(np.zeros((1, 1)), WindowEnd(0.0)), vocabulary, said_before=(5, 6))

    gone = read(doubtful=1)
    assert gone.text == "" and gone.segments == () and gone.intent is None and gone.context == (5, 6)
    kept = read(doubtful=0)
    assert kept.text.startswith("Mais c'est mieux") and kept.context == (5, 6, 7, 8)
    assert read(doubtful=1, language="en").text.startswith("Mais")
