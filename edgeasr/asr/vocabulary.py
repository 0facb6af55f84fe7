"""What the decoder makes of a request's vocabulary (stages.Vocabulary): the home's names and
terms as a prompt (faster-whisper's `initial_prompt`, what wyoming-faster-whisper's Home
Assistant names do) and as keyterms whose tokens get a boost.

The prompt goes before the home's sentences when they are searched and weighed, not before
free speech (it cost tiny.en 1.1 points of WER on the dev pool: docs/benchmarks.md), and within
a token budget: a long prompt takes the decoder's attention from the audio.
"""

from __future__ import annotations

from collections.abc import Callable

from edgeasr.stages import Vocabulary

PROMPT_TOKENS = 64  # budget of the names prompt, in tokens
KEYTERM_BOOST = 1.0  # logits added to a token that begins a name or term (more deeper into one)
# a home's sentence is taken for the decoded text when the decoder finds it at most this much
# less likely (mean log-probability per token)
COMMAND_MARGIN = 0.8
# and this much less likely when it differs from the text only in names the text spells nearly
# alike (grammar.names_misheard): a name the decoder never saw is improbable even when said
NAME_MARGIN = 1.5
# the means by which decoding hears a vocabulary: the names as the prompt of the home's
# sentences, a boost of their tokens (a trie, shallow fusion), and the home's sentences as a
# grammar (Transcriber.hearing)
MEANS = ("prompt", "boost", "grammar")
VOCABULARY_CACHE = 8  # vocabularies whose tokens and searches are kept (a home's changes seldom)
KIND_ORDER = ("name", "entity", "area", "floor")  # plain names (the request's own) first


def prompt_text(vocabulary: Vocabulary) -> str:
    """The names then the terms, each once, as a comma-separated list."""
    names = sorted(vocabulary.names, key=lambda n: KIND_ORDER.index(n.kind) if n.kind in KIND_ORDER else len(KIND_ORDER))
    spoken = [s for n in names for s in n.spoken] + list(vocabulary.terms)
    unique = list(dict.fromkeys(s.strip() for s in spoken if s.strip()))
    return ", ".join(unique) + ("." if unique else "")


def names_prompt(vocabulary: Vocabulary, encode: Callable[[str], list[int]], budget: int = PROMPT_TOKENS) -> list[int]:
    """The prompt's tokens, whole names only, at most `budget` of them."""
    if not vocabulary:
        return []
    text = prompt_text(vocabulary)
    tokens = encode(" " + text)
    if len(tokens) <= budget:
        return tokens
    # cut after the last whole item that fits
    items, kept = text.rstrip(".").split(", "), list[str]()
    for item in items:
        trial = encode(" " + ", ".join([*kept, item]) + ".")
        if len(trial) > budget:
            break
        kept.append(item)
    return encode(" " + ", ".join(kept) + ".") if kept else []


def keyterms(vocabulary: Vocabulary, encode: Callable[[str], list[int]]) -> tuple[tuple[int, ...], ...]:
    """Each way of saying each name and term, as written and lower-cased, tokenized with the
    leading space a word has inside a sentence (and without it, as the first word of a text)."""
    spoken = [s for n in vocabulary.names for s in n.spoken] + list(vocabulary.terms)
    forms = dict.fromkeys(f for s in spoken if s.strip() for f in (s.strip(), s.strip().lower()))
    return tuple(dict.fromkeys(tuple(encode(prefix + f)) for f in forms for prefix in (" ", "")))
