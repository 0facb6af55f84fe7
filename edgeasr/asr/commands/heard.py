"""A window of speech heard with a home's vocabulary: which of the home's commands it says.

When the text as decoded is one of the home's sentences (Home Assistant's matcher), that is
the command. Otherwise the home's sentences the audio is likeliest to be (a decoding held to
them, asr/grammar.py, after the names as a prompt) are weighed against the decoded text read
the same way (in the run of that prompt: decoding.prime with a text), and the likeliest within
COMMAND_MARGIN of the text's own score is taken (within NAME_MARGIN when it differs only in
names the text nearly spells: mishearing.names_misheard; never below MIN_COMMAND_SCORE), unless
it could not have been heard as the text (mishearing.misheard_as: "what time is it in Denver" is
not "what time is it"; a sentence of 10 words is no command of 4): a command heard slightly
wrong is put right, other speech is left as it was decoded.

A wrong action is worse than none, so no sentence is taken when another that asks something
else of the home is nearly as likely (AMBIGUOUS), and a text that is a command only through
its free-text slots (a delayed command, a timer's name) is weighed like text that is none.
Outside English, where the decoder did not know what was said (every decoding of the window
failed a quality gate), the sentence must also spell the text's letters about alike
(vocabulary.DOUBTFUL_LIKENESS), and a text that is a command only through its free-text slots
is withheld: any words fit there, so Home Assistant would act on whatever was misheard.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np

from edgeasr.asr.beam import BatchDecoderSession
from edgeasr.asr.commands.budget import MATCH, UNLIMITED, ReadingBudget
from edgeasr.asr.commands.grammar import GrammarSearch
from edgeasr.asr.commands.mishearing import (
    letters_likeness,
    misheard_as,
    names_alone_unlike,
    names_misheard,
    names_unlike,
)
from edgeasr.asr.commands.vocabulary import (
    AMBIGUOUS,
    COMMAND_MARGIN,
    DOUBTFUL_LIKENESS,
    MIN_COMMAND_SCORE,
    NAME_MARGIN,
    PROMPT_ITEMS_CACHE,
    VOCABULARY_CACHE,
    names_prompt,
    prompt_items,
)
from edgeasr.asr.decoding import DecoderSession, DecodingOptions, prime
from edgeasr.asr.tokenizer import Tokenizer
from edgeasr.stages import Intent, Sentences, Vocabulary, WordGraph

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Heard:
    """The home's command a window says."""

    text: str  # the home's sentence; empty: the window's text is withheld
    intent: Intent | None
    score: float | None = None  # its mean log-probability per token when put in for the decoded text


WITHHELD = Heard("", None)  # the window's text must not reach the home


class CommandHearing:
    """Reads windows as the home's commands on the transcriber's decoder; keeps, per vocabulary
    (a few at a time), the items of its names prompt (and each item's tokens) and the search of
    its graph (spellings, closures)."""

    def __init__(self, decoder: DecoderSession, tokenizer: Tokenizer, eot: int) -> None:
        self.decoder, self.tokenizer, self.eot = decoder, tokenizer, eot
        self.items = functools.lru_cache(maxsize=VOCABULARY_CACHE)(prompt_items)
        self.encode = functools.lru_cache(maxsize=PROMPT_ITEMS_CACHE)(lambda text: tuple(tokenizer.encode(text)))
        self._searches: dict[int, tuple[WordGraph, GrammarSearch]] = {}

    def hear(self, text: str, sentences: Sentences, encoded: np.ndarray, silence: float, options: DecodingOptions,
             vocabulary: Vocabulary, batch: BatchDecoderSession | None = None, prompt: bool = True,
             unsure: bool = False, budget: ReadingBudget | None = None) -> Heard | None:
        """The command the window (its encoder output and silence level) says, `text` as
        decoded; None when it says none, WITHHELD when its text must not reach the home.
        `prompt`: the names go before the home's sentences (bench-commands measures without);
        `batch`: the search steps its hypotheses at once; `unsure`: the decoder did not know
        the window (vocabulary.unsure); `budget`: what the reading may spend (none: no limit),
        and where it counts what it did."""
        budget = budget if budget is not None else ReadingBudget(UNLIMITED)
        intent = _recognize(sentences, text, budget)
        if intent is not None and not intent.free:
            return Heard(text, intent)
        # a command through free-text slots only ("set a timer for 2 minutes in 30 seconds": a
        # delayed command) is read against the home's sentences like text that is no command
        taken = self._weigh(text, sentences, encoded, silence, options, vocabulary, batch, prompt,
                            DOUBTFUL_LIKENESS if unsure else 0.0, budget) if _has_letters(text) else None
        return WITHHELD if taken is None and withheld(intent, unsure) else taken

    def _weigh(self, text: str, sentences: Sentences, encoded: np.ndarray, silence: float, options: DecodingOptions,
               vocabulary: Vocabulary, batch: BatchDecoderSession | None, prompt: bool,
               likeness: float, budget: ReadingBudget) -> Heard | None:
        """The home's sentence the window is taken to say instead of `text`, or None."""
        search = self.search_for(sentences.graph())
        heard = self.tokenizer.encode(" " + text)
        budget.for_text(len(heard))
        before = names_prompt(self.items(vocabulary), self.encode, heard=text) if prompt else []
        # one start for both readings; the text as decoded is scored in the same run
        primed = prime(self.decoder, encoded, options, silence, before, text=heard)
        assert primed.text_score is not None
        own = primed.text_score
        # the search looks for sentences within COMMAND_MARGIN; of those it finished below, a
        # near name's is still taken (searching down to NAME_MARGIN took more nonsense)
        sought = max(own - COMMAND_MARGIN, MIN_COMMAND_SCORE)
        # a command is about as long as what was heard: the search goes little further
        held = search.search(self.decoder, primed, max_tokens=2 * len(heard) + 4,
                                                         batch=batch, floor=sought, budget=budget)
        if budget.cut:  # its rivals not all found: no sentence is weighed
            return None
        found = [(self.tokenizer.decode(tokens).strip(), score, len(tokens) + 1) for tokens, score in held]
        log.debug("the home's sentences %s against %.3f", found, own)
        return choose(text, own, found, sentences, [said for name in vocabulary.names for said in name.spoken],
                      likeness, budget)

    def search_for(self, graph: WordGraph) -> GrammarSearch:
        """The search of a graph, kept while its vocabulary is in use."""
        key = id(graph)
        if key not in self._searches or self._searches[key][0] is not graph:
            if len(self._searches) >= VOCABULARY_CACHE:
                self._searches.pop(next(iter(self._searches)))
            self._searches[key] = (graph, GrammarSearch(graph, self.tokenizer.encode, self.tokenizer.decode, self.eot))
        return self._searches[key][1]


def _has_letters(text: str) -> bool:
    return any(c.isalpha() for c in text)  # digits alone: numbers heard are no words misheard


def withheld(intent: Intent | None, unsure: bool) -> bool:
    """Is a window's text, which Home Assistant reads as `intent` and no sentence of the home
    was taken for, withheld: a command only through free-text slots from a window the decoder
    did not know (vocabulary.unsure)?"""
    return unsure and intent is not None and bool(intent.free)


def _recognize(sentences: Sentences, text: str, budget: ReadingBudget) -> Intent | None:
    """Home Assistant's matcher on `text`, timed and counted on the budget."""
    t0 = budget.clock()
    intent = sentences.recognize(text)
    budget.spent(MATCH, t0)
    budget.matched += 1
    return intent


def choose(text: str, own: float, found: list[tuple[str, float, int]], sentences: Sentences,
           names: list[str], likeness: float = 0.0, budget: ReadingBudget | None = None) -> Heard | None:
    """Of the home's sentences the search found for a window (each with its mean log-probability
    per token and its tokens, likeliest first), the one `text`, as decoded and scored `own`, is
    taken to mean; None when none may be taken, when the likeliest spells less than `likeness`
    of the text's letters alike, or when two that ask different things are alike likely; None
    too when `budget` does not afford reading one more with Home Assistant's matcher: a
    sentence not weighed against its rivals is no action."""
    budget = budget if budget is not None else ReadingBudget(UNLIMITED)
    lowest = max(own - max(COMMAND_MARGIN, NAME_MARGIN), MIN_COMMAND_SCORE)
    best: tuple[Heard, float] | None = None
    for sentence, score, tokens in found:
        if score < lowest:
            break
        total = score * tokens
        if best is not None and total < best[1] - AMBIGUOUS:
            continue  # no rival of the best: Home Assistant's matcher need not read it
        near = score >= own - COMMAND_MARGIN or names_misheard(sentence, text, names)
        if not (near and misheard_as(sentence, text) and not names_alone_unlike(sentence, text, names)):
            continue
        if not budget.affords(MATCH):
            return None
        if (meant := _recognize(sentences, sentence, budget)) is not None:
            if best is None:
                if names_unlike(sentence, text, names) or letters_likeness(sentence, text) < likeness:
                    return None  # the likeliest reading spells nothing of the text: no reading
                best = (Heard(sentence, meant, score), total)
            elif meant != best[0].intent:
                log.debug("%r and %r are alike likely: neither taken", best[0].text, sentence)
                return None
    return None if best is None else best[0]
