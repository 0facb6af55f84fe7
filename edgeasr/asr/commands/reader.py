"""A final window of speech heard with the home's vocabulary, read as the home's command it says.

The reading comes after the decoding and apart from it: it takes the text as decoded and the
window's encoder output as values, and gives the transcription with the command's intent.
When the command was heard slightly wrong, its text is put right (asr/commands_heard.py); when
it must not reach the home, the transcription is left empty.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from edgeasr.asr.beam import BatchDecoderSession
from edgeasr.asr.commands.budget import DEFAULT_BUDGET, BudgetOptions, ReadingBudget
from edgeasr.asr.commands.heard import WITHHELD, CommandHearing
from edgeasr.asr.commands.vocabulary import unsure
from edgeasr.asr.decoding import DecodingOptions
from edgeasr.asr.gates import compression_ratio
from edgeasr.asr.tokenizer import Tokenizer
from edgeasr.stages import Sentences, TextSegment, Transcription, Vocabulary

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
    """A window's encoder output and its silence level: what the reading decodes again."""

    features: np.ndarray
    silence: float


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
        heard = self.hearing.hear(result.text, sentences, window.features, window.silence,
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
