"""What the decoder makes of a request's vocabulary (stages.Vocabulary): the home's names and
terms as a prompt (faster-whisper's `initial_prompt`, what wyoming-faster-whisper's Home
Assistant names do) and as keyterms whose tokens get a boost.

The prompt goes before the home's sentences when they are searched and weighed, not before
free speech (it cost tiny.en 1.1 points of WER on the dev pool: docs/benchmarks.md), and within
a token budget: a long prompt takes the decoder's attention from the audio.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from edgeasr.stages import Vocabulary

PROMPT_TOKENS = 64  # budget of the names prompt, in tokens
KEYTERM_BOOST = 1.0  # logits added to a token that begins a name or term (more deeper into one)
# a home's sentence is taken for the decoded text when the decoder finds it at most this much
# less likely (mean log-probability per token)
COMMAND_MARGIN = 0.8
# and this much less likely when it differs from the text only in names the text spells nearly
# alike (mishearing.names_misheard): a name the decoder never saw is improbable even when said
NAME_MARGIN = 1.5
# a window whose every decoding failed a quality gate (the decoder itself did not know what
# was said), in a language the model has heard less of than English: the likeliest sentence is
# taken only when it spells at least this share of the text's letters alike
# (mishearing.letters_likeness). base on the five languages' command sets (espeak-ng): 35 of
# 143 readings of such windows were wrong actions; this bar, chosen on the first homes' sets,
# took 16 of their 31 wrong actions away for 19 of 118 right, and on the held-out homes' 7 of 12
# for 15 of 74 (a wrong action is worse than none). In English such readings were right: 35 of
# 35 (tiny.en) and 30 of 30 (base) on 665 commands.
DOUBTFUL_LIKENESS = 0.65
WELL_HEARD = frozenset({"en"})  # languages whose doubtful windows are read like any other
# Nor does such a window's text go out when Home Assistant would read it as a command only
# through a free-text slot, where any words fit: French "mets {search_query}", which also
# takes "mais", played "c'est mieux d'y aller" for "ma sœur vient dîner vendredi soir". base,
# espeak-ng, five languages: of 249 such windows of commands that hold free text (media, shopping
# lists), 17 read as commands through it, none right (other words in the slot); of the 800
# commands and non-commands, 17, none right. The text is withheld (empty: no action).
# nor is a sentence taken that the decoder finds less likely than this in itself (mean
# log-probability per token): next to nonsense heard for speech that is no command, a command
# can come within the margin ("THOU ALSO THOU ALSO", heard "D'Awalsu D'Awalsu." at -2.20, became
# "What is the time?" at -2.92). Measured on both command sets, the everyday ones and the dev
# pool: no sentence put right was below -2.23
MIN_COMMAND_SCORE = -2.5
# of two of the home's sentences that ask different things of it, the likelier is taken only
# when the decoder finds it at least 9 times as likely as the other (log-probabilities summed
# over their tokens): a guess between two actions ("mute" or "unmute", "to 60%" or "to 68%")
# is no action
AMBIGUOUS = math.log(9.0)
# the means by which decoding hears a vocabulary: the names as the prompt of the home's
# sentences, a boost of their tokens (a trie, shallow fusion), and the home's sentences as a
# grammar (EngineOptions.hearing)
MEANS = ("prompt", "boost", "grammar")
VOCABULARY_CACHE = 8  # vocabularies whose tokens and searches are kept (a home's changes seldom)
PROMPT_ITEMS_CACHE = 4096  # names and terms whose tokens are kept (the prompt's items, encoded alone)
KIND_ORDER = ("name", "entity", "area", "floor")  # plain names (the request's own) first


def unsure(language: str, doubtful: bool) -> bool:
    """A window the decoder did not know (`doubtful`: every decoding failed a quality gate) in a
    language it has heard less of than English: its reading needs letters alike, and its free
    text is no command."""
    return doubtful and language not in WELL_HEARD


def prompt_items(vocabulary: Vocabulary) -> tuple[str, ...]:
    """The names then the terms, each once (plain names, the request's own, first)."""
    names = sorted(vocabulary.names, key=lambda n: KIND_ORDER.index(n.kind) if n.kind in KIND_ORDER else len(KIND_ORDER))
    spoken = [s for n in names for s in n.spoken] + list(vocabulary.terms)
    return tuple(dict.fromkeys(s.strip() for s in spoken if s.strip()))


def prompt_text(vocabulary: Vocabulary) -> str:
    """The names then the terms, each once, as a comma-separated list."""
    items = prompt_items(vocabulary)
    return ", ".join(items) + ("." if items else "")


def names_prompt(items: Sequence[str], encode: Callable[[str], Sequence[int]], budget: int = PROMPT_TOKENS,
                 heard: str = "") -> list[int]:
    """The prompt's tokens: whole items (prompt_items) as a comma-separated list, at most
    `budget` tokens. A home's names fill more than the budget (both of our homes ~150 tokens, and
    a real home's more): with `heard`, the text as first decoded, the items most like some part
    of it go first, so that the name said is in the prompt ("Sledge latch": Schlage Latch);
    without, they go in their order. `encode` may be cached: each item is encoded alone."""
    if heard:
        items = sorted(items, key=lambda item: -likeness(item, heard))  # stable: ties keep the order
    kept, used = list[str](), 1  # the full stop
    for item in items:
        cost = len(encode(" " + item)) + 1  # ", " after it: BPE never merges across the space
        if used + cost <= budget:
            kept.append(item)
            used += cost

    def listed(items: list[str]) -> list[int]:
        return list(encode(" " + ", ".join(items) + ".")) if items else []

    tokens = listed(kept)
    while len(tokens) > budget:  # a mark of an item's own merged with the comma after it
        kept.pop()
        tokens = listed(kept)
    return tokens


def likeness(item: str, heard: str) -> float:
    """How nearly `heard` spells `item` somewhere (rapidfuzz's partial ratio, 0-100)."""
    from rapidfuzz import fuzz

    return float(fuzz.partial_ratio(item.casefold(), heard.casefold()))


def keyterms(vocabulary: Vocabulary, encode: Callable[[str], list[int]]) -> tuple[tuple[int, ...], ...]:
    """Each way of saying each name and term, as written and lower-cased, tokenized with the
    leading space a word has inside a sentence (and without it, as the first word of a text)."""
    spoken = [s for n in vocabulary.names for s in n.spoken] + list(vocabulary.terms)
    forms = dict.fromkeys(f for s in spoken if s.strip() for f in (s.strip(), s.strip().lower()))
    return tuple(dict.fromkeys(tuple(encode(prefix + f)) for f in forms for prefix in (" ", "")))
