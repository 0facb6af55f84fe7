"""A final window of speech heard with the home's vocabulary, read as the home's command it says.

The reading comes after the decoding and apart from it: it takes the text as decoded and the
window's encoder output as values (`CommandReader.read`), finds the home's command the window
says (`CommandHearing.hear`), and gives the transcription with the command's intent: when the
command was heard slightly wrong, its text is put right; when it must not reach the home, the
transcription is left empty. What a reading may spend is budget.py's.

A window of speech heard with a home's vocabulary: which of the home's commands it says.

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
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from edgeasr.asr.beam import BatchDecoderSession
from edgeasr.asr.commands.budget import DEFAULT_BUDGET, MATCH, UNLIMITED, BudgetOptions, ReadingBudget
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
    PROMPT_TOKENS,
    VOCABULARY_CACHE,
    names_prompt,
    prompt_items,
    unsure,
)
from edgeasr.asr.decoding import DecoderSession, DecodingOptions, prime
from edgeasr.asr.gates import compression_ratio
from edgeasr.asr.tail import WindowEnd
from edgeasr.asr.tokenizer import Tokenizer
from edgeasr.stages import Intent, Sentences, TextSegment, Transcription, Vocabulary, WordGraph

log = logging.getLogger(__name__)

# the home's sentences for a vocabulary and a language (home.sentences: asr does not import
# it), None where no language has them
SentenceSource = Callable[[Vocabulary, str], Sentences | None]

# a number joined to its unit ("a 10-minute timer", as Whisper writes it): Home Assistant 2025.4's
# matcher (hassil 2) takes no command written so, newer ones do; both take "a 10 minute timer"
_NUMBER_JOINED = re.compile(r"(\d)-(?=[^\W\d_])")
# a word elided before the next, written apart from it ("l' entrée", "dell' ufficio")
_ELIDED = re.compile(r"(\w['’]) (?=\w)")
# the decode's parts (Transcription.timings_ms) the reading's budget is a share of
DECODE_PARTS = ("features", "encoder", "decoder", "words")


@dataclass(frozen=True)
class EncodedWindow:
    """A window's encoder output and how its audio ends: what the reading decodes again."""

    features: np.ndarray
    end: WindowEnd


class CommandReader:
    """`prompt`: the names go before the home's sentences (bench-commands measures without).
    `batch` gives the batched step the search takes its hypotheses' steps in, None where the
    bundle has none; `budget`: how much a reading may do (budget.py)."""

    def __init__(self, hearing: CommandHearing, sentences: SentenceSource, tokenizer: Tokenizer,
                 options: DecodingOptions, max_prompt: int, prompt: bool = True,
                 batch: Callable[[], BatchDecoderSession | None] = lambda: None,
                 budget: BudgetOptions = DEFAULT_BUDGET) -> None:
        self.hearing, self.sentences, self.tokenizer = hearing, sentences, tokenizer
        self.options, self.max_prompt, self.prompt, self.batch = options, max_prompt, prompt, batch
        self.budget = budget

    def prepare(self, vocabulary: Vocabulary, language: str) -> bool:
        """Build what reading a command with `vocabulary` in `language` needs (the home's
        sentences, their graph and its search, the graphs a reading runs) before the first
        command asks for it: a home's graph takes seconds to build (docs/benchmarks.md), which
        the first command would otherwise wait. False where the language has no sentences."""
        sentences = self.sentences(vocabulary, language)
        if sentences is None:
            return False
        self.hearing.prepare(sentences, self.batch())
        return True

    def read(self, result: Transcription, window: EncodedWindow, vocabulary: Vocabulary,
             said_before: Sequence[int] = ()) -> Transcription:
        """The transcription of one window as the home's command it says, if any, with its
        intent. `said_before`: the text tokens said before the window (the call's prompt)."""
        sentences = self.sentences(vocabulary, result.language)
        if sentences is None or not result.text:
            return result
        decode_ms = sum(result.timings_ms.get(part, 0.0) for part in DECODE_PARTS)
        budget = ReadingBudget(self.budget, self.budget.allowed_ms(decode_ms))
        result = _elisions_glued(result, sentences)
        heard = self.hearing.hear(result.text, sentences, window.features, window.end,
                                  replace(self.options, language=result.language), vocabulary, self.batch(),
                                  prompt=self.prompt,
                                  unsure=unsure(result.language, result.doubtful_windows > 0), budget=budget)
        result.timings_ms["command"] = budget.spent_ms()
        result = replace(result, reading=budget.counters())
        if heard is None:
            return result
        if heard is WITHHELD:
            log.info("a window the decoder did not know reads as a command only through free text: withheld")
            return replace(result, text="", segments=(), intent=None, context=tuple(said_before[-self.max_prompt:]))
        if heard.score is None:  # the text as decoded
            return _numbers_apart(replace(result, intent=heard.intent), sentences)
        first, last = result.segments[0], result.segments[-1]
        tokens = tuple(self.tokenizer.encode(" " + heard.text))
        segment = TextSegment(start=first.start, end=last.end, text=" " + heard.text, tokens=tokens,
                              avg_logprob=heard.score, no_speech_prob=first.no_speech_prob,
                              compression_ratio=compression_ratio(heard.text))
        return replace(result, text=heard.text, segments=(segment,), intent=heard.intent,
                       context=tuple([*said_before, *tokens][-self.max_prompt:]))


def _written(result: Transcription, pattern: re.Pattern[str], repl: str) -> Transcription:
    """The transcription with `pattern` written `repl` in its text and its segments."""
    segments = tuple(replace(s, text=pattern.sub(repl, s.text)) for s in result.segments)
    return replace(result, text=pattern.sub(repl, result.text), segments=segments)


def _elisions_glued(result: Transcription, sentences: Sentences) -> Transcription:
    """The text with an elided word written against the next ("l' entrée": "l'entrée", as
    base writes French and Italian) where Home Assistant then reads a command in it and did
    not before: its sentences write them so, and its matcher reads "l' entrée" as no word it
    knows. Elsewhere the text stays as decoded."""
    if not _ELIDED.search(result.text) or sentences.recognize(result.text) is not None:
        return result
    glued = _written(result, _ELIDED, r"\1")
    return glued if sentences.recognize(glued.text) is not None else result


def _numbers_apart(result: Transcription, sentences: Sentences) -> Transcription:
    """A command read as decoded, its numbers written apart from their units where that asks
    the home the same thing (Home Assistant 2025.4 then takes it as newer releases do)."""
    text = _NUMBER_JOINED.sub(r"\1 ", result.text)
    if text == result.text or sentences.recognize(text) != result.intent:
        return result
    return _written(result, _NUMBER_JOINED, r"\1 ")


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

    def hear(self, text: str, sentences: Sentences, encoded: np.ndarray, end: WindowEnd, options: DecodingOptions,
             vocabulary: Vocabulary, batch: BatchDecoderSession | None = None, prompt: bool = True,
             unsure: bool = False, budget: ReadingBudget | None = None) -> Heard | None:
        """The command the window (its encoder output and how its audio ends) says, `text` as
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
        taken = self._weigh(text, sentences, encoded, end, options, vocabulary, batch, prompt,
                            DOUBTFUL_LIKENESS if unsure else 0.0, budget) if _has_letters(text) else None
        return WITHHELD if taken is None and withheld(intent, unsure) else taken

    def _weigh(self, text: str, sentences: Sentences, encoded: np.ndarray, end: WindowEnd, options: DecodingOptions,
               vocabulary: Vocabulary, batch: BatchDecoderSession | None, prompt: bool,
               likeness: float, budget: ReadingBudget) -> Heard | None:
        """The home's sentence the window is taken to say instead of `text`, or None."""
        search = self.search_for(sentences.graph())
        heard = self.tokenizer.encode(" " + text)
        budget.for_text(len(heard))
        before = names_prompt(self.items(vocabulary), self.encode, heard=text) if prompt else []
        # one start for both readings; the text as decoded is scored in the same run
        primed = prime(self.decoder, encoded, options, end, before, text=heard)
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

    def prepare(self, sentences: Sentences, batch: BatchDecoderSession | None = None) -> None:
        """The search of the home's sentences, kept for the readings to come; and the graphs a
        reading runs (the scoring step, the batched one) made and run once: the first command
        read after a start waited about 200 ms for them (base, measured)."""
        self.search_for(sentences.graph()).prepare()
        self.decoder.ready_scoring(2 * PROMPT_TOKENS)  # the names prompt, at most, and a text
        if batch is not None:
            batch.warm(PROMPT_TOKENS)

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
