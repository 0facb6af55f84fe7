"""Text-level repairs of a transcription's segments: what the decoder writes that no one said.

- A segment of punctuation alone ("." decoded as a window of its own) belongs to the text
  before it: joined with a space it would score as a word.
- A double quote without its pair (`...my native country." The narrative...`): Whisper
  learnt quoted speech from subtitles, and a window cut inside the quote keeps one half.
- An ellipsis that ends a complete transcription ("...too much of steel. Anon..."): the
  decoder's mark for speech that trails off or runs into the end of the audio. Once the
  speech is over it is a full stop; left as it is, Whisper's English normalizer (how WER is
  scored, and how a consumer that strips marks would see it) turns it into a lone ".".

A segment's words (output.words) are repaired with its text, so that they still spell it.
"""

from __future__ import annotations

import dataclasses

from edgeasr.stages import TextSegment, Word

QUOTE = '"'


def has_words(text: str) -> bool:
    return any(c.isalnum() for c in text)


def join_bare_punctuation(segments: list[TextSegment]) -> list[TextSegment]:
    """Segments without a letter or digit are appended (spaces stripped) to the segment
    before them; without one before them they are dropped."""
    out: list[TextSegment] = []
    for s in segments:
        if has_words(s.text):
            out.append(s)
        elif out and s.text.strip():
            prev = out[-1]
            out[-1] = dataclasses.replace(prev, text=prev.text.rstrip() + s.text.strip(), end=s.end,
                                          tokens=prev.tokens + s.tokens, words=_append(prev.words, s))
    return out


def _append(words: tuple[Word, ...], bare: TextSegment) -> tuple[Word, ...]:
    """The words with a bare-punctuation segment's text joined to the last one."""
    if not words:
        return words
    last = words[-1]
    end = max([last.end, *(w.end for w in bare.words)])
    return (*words[:-1], dataclasses.replace(last, word=last.word.rstrip() + bare.text.strip(), end=end))


def unpaired_quotes(text: str) -> set[int]:
    """Indexes of the double quotes in `text` that have no partner: with an odd count, the
    one that opens (followed by a space or the end) or closes (after a space or the start)
    on the wrong side; failing that the last one."""
    at = [i for i, c in enumerate(text) if c == QUOTE]
    if len(at) % 2 == 0:
        return set()
    for k, i in enumerate(at):
        opening = k % 2 == 0  # paired left to right, an even index opens
        before = text[i - 1] if i > 0 else " "
        after = text[i + 1] if i + 1 < len(text) else " "
        if (opening and after.isspace()) or (not opening and before.isspace()):
            return {i}
    return {at[-1]}


def drop_unpaired_quotes(segments: list[TextSegment]) -> list[TextSegment]:
    """The segments with the transcription's unpaired double quote removed."""
    text = "".join(s.text for s in segments)
    remove = unpaired_quotes(text)
    if not remove:
        return segments
    out, offset = [], 0
    for s in segments:
        here = {i - offset for i in remove if 0 <= i - offset < len(s.text)}
        offset += len(s.text)
        if here:
            s = dataclasses.replace(s, text=_drop(s.text, here), words=_drop_in_words(s.words, here))
        out.append(s)
    return out


def _drop(text: str, at: set[int]) -> str:
    return "".join(c for i, c in enumerate(text) if i not in at)


def _drop_in_words(words: tuple[Word, ...], at: set[int]) -> tuple[Word, ...]:
    """The words with the characters at these indexes of their joined text removed; a word
    left without a letter or digit is dropped."""
    out, offset = [], 0
    for w in words:
        text = _drop(w.word, {i - offset for i in at})
        offset += len(w.word)
        if text == w.word or has_words(text):
            out.append(dataclasses.replace(w, word=text) if text != w.word else w)
    return tuple(out)


ELLIPSES = ("...", "\u2026")


def end_with_a_full_stop(segments: list[TextSegment]) -> list[TextSegment]:
    """The last segment's closing ellipsis (and its last word's) made a full stop."""
    if not segments:
        return segments
    last = segments[-1]
    text = last.text.rstrip()
    mark = next((e for e in ELLIPSES if text.endswith(e)), None)
    if mark is None or not has_words(text[: -len(mark)]):
        return segments
    words = last.words
    if words and words[-1].word.rstrip().endswith(mark):
        w = words[-1]
        words = (*words[:-1], dataclasses.replace(w, word=w.word.rstrip()[: -len(mark)] + "."))
    return [*segments[:-1], dataclasses.replace(last, text=text[: -len(mark)] + ".", words=words)]


def tidy(segments: list[TextSegment], complete: bool = True) -> list[TextSegment]:
    """complete: the speech is over (the transcription's last window kept everything)."""
    segments = drop_unpaired_quotes(join_bare_punctuation(segments))
    return end_with_a_full_stop(segments) if complete else segments
