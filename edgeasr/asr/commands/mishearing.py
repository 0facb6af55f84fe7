"""Could a home's sentence have been heard as the text the decoder wrote? The letters-and-words
tests the command reading (asr/commands_heard.py) applies before it takes a sentence for the
text: a mishearing changes words and keeps their number roughly; a name heard wrong spells
about the same letters; a sentence of the home's names is no reading of a text that spells
nothing like them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

# a name heard as a near name spells at least this share of the same letters (difflib's ratio)
NAME_LIKENESS = 0.5
# a name of n words is heard as up to n + 1 words, and a long one as up to one word per this many
# of its letters: a German or Dutch compound is heard in its parts ("koffie zet apparaat" for
# "Koffiezetapparaat")
COMPOUND_PART = 6


def misheard_as(sentence: str, heard: str) -> bool:
    """Could `sentence`, said, have been heard as the text `heard`? A mishearing changes words:
    it does not only leave some out ("what time is it in Denver" is not "what time is it": taking
    it would put nothing right, only drop words the decoder heard), and it seldom loses or adds
    most of them: a sentence of fewer than half the words heard, or more than twice and one, is
    other speech (base heard a French sentence as 9 words of nonsense, and "Lampe de la cuisine"
    came within the margin; tiny.en heard a LibriSpeech sentence as "D'Awalsu D'Awalsu.", and
    "What is the value of the Lumi Strip?" did). Else a sentence is never taken, whatever its
    score.
    Measured: of 145 texts the search changed on both English command sets, all but one had 0.5
    to 1.33 times the words heard; that one, turned away, was wrong."""
    said, kept = _text_words(heard), _text_words(sentence)
    if len(said) > 2 * len(kept) or len(kept) > 2 * len(said) + 1:  # "Timer." for "Cancel the timer."
        return False
    rest = iter(said)
    return not (len(kept) < len(said) and all(word in rest for word in kept))


def names_misheard(sentence: str, heard: str, names: Iterable[str]) -> bool:
    """Does `sentence` differ from the text `heard` only where it says some of the home's
    `names`, the heard text there spelling about the same letters ("Start the row burah." for
    "Start the Roborock."), and say at least one word besides them? Home Assistant's own
    near-miss name matching does this on text; here the decoder's score must also agree
    (commands_heard.NAME_MARGIN)."""
    said, kept = _text_words(heard), _text_words(sentence)
    forms = _name_forms(names)
    pattern, spans, i = [], [], 0
    while i < len(kept):
        form = _name_at(kept, i, forms)
        if form is None:
            pattern.append(re.escape(kept[i]))
            i += 1
        else:  # a name of n words may be heard as one to n + 1 words, or in its parts
            pattern.append(rf"(\S+(?: \S+){{0,{_heard_words(form) - 1}}})")
            spans.append(form)
            i += len(form)
    # the words besides the names must be the text's own: a sentence of names alone ("Vornado,"
    # for "pause" heard as "For now.") has nothing of the text to agree with
    match = re.fullmatch(" ".join(pattern), " ".join(said)) if spans and len(pattern) > len(spans) else None
    if match is None:
        return False
    pairs = [(tuple(got.split()), form) for got, form in zip(match.groups(), spans)]
    return any(got != form for got, form in pairs) and all(got == form or _alike(got, form) for got, form in pairs)


def names_alone_unlike(sentence: str, heard: str, names: Iterable[str]) -> bool:
    """Does `sentence` say nothing but some of the home's `names` (a name said alone turns it on
    in Home Assistant) while the text `heard` spells other letters? Primed with the names, the
    decoder finds a name likely for any word it heard unclearly ("Bose Soundbar," for "pause"
    heard as "Ours.", 0.78 nats a token below it): with no word of the text to agree with it,
    only the letters can."""
    kept, i, forms = _text_words(sentence), 0, _name_forms(names)
    while i < len(kept):
        form = _name_at(kept, i, forms)
        if form is None:
            return False
        i += len(form)
    return bool(kept) and letters_likeness(sentence, heard) < NAME_LIKENESS


def names_unlike(sentence: str, heard: str, names: Iterable[str]) -> bool:
    """Does `sentence` say some of the home's `names` while the text `heard` spells other letters
    throughout? Base found sentences of names and areas likely for speech heard as words of
    nothing like them ("den Armen mehr Zudrager zu übschicken." came within the margin of "Lumi
    Streifen, Schlafzimmer, Aus!"; "Ja, dat is leuk." of "Raam, de keuken sluiten."): the
    likeliest reading is then no reading at all. Of the sentences with names taken on the five
    languages' sets (base) whose letters were this unlike the text, 5 were wrong actions and 2
    right."""
    kept, forms = _text_words(sentence), _name_forms(names)
    said = any(_name_at(kept, i, forms) for i in range(len(kept)))
    return said and letters_likeness(sentence, heard) < NAME_LIKENESS


def _heard_words(form: tuple[str, ...]) -> int:
    """The most words a name (its words) is heard as."""
    return max(len(form) + 1, -(-sum(map(len, form)) // COMPOUND_PART))


def _text_words(text: str) -> list[str]:
    return re.findall(r"[\w']+", text.casefold())


def _name_forms(names: Iterable[str]) -> list[tuple[str, ...]]:
    """Each name's words, the longest first: a name is read before a shorter one it begins with."""
    return sorted({w for n in names if (w := tuple(_text_words(n)))}, key=len, reverse=True)


def _name_at(words: list[str], i: int, forms: list[tuple[str, ...]]) -> tuple[str, ...] | None:
    """The name (of `forms`) said from words[i] on, if any."""
    return next((f for f in forms if tuple(words[i : i + len(f)]) == f), None)


def letters_likeness(sentence: str, heard: str) -> float:
    """The share of letters two texts spell alike (difflib's ratio; case, spaces and marks left
    out)."""
    return _likeness(tuple(_text_words(heard)), tuple(_text_words(sentence)))


def _alike(heard: tuple[str, ...], name: tuple[str, ...]) -> bool:
    """Do two spans spell about the same letters?"""
    return _likeness(heard, name) >= NAME_LIKENESS


def _likeness(heard: tuple[str, ...], name: tuple[str, ...]) -> float:
    a, b = ("".join(c for word in words for c in word if c.isalnum()) for words in (heard, name))
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()
