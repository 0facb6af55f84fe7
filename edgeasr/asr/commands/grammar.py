"""Decoding held to a home's sentences: a beam search in which every token must keep the text on
a path of the home's WordGraph (stages.WordGraph: Home Assistant's templates with the home's
names), so that what comes out is the home's sentence the audio is likeliest to be.

A word or a name is spelled the ways the decoder writes it (with its leading space; as written,
lower-cased, capitalized); a number is a digit token with its space, then digit tokens without
one, a decimal point maybe among them; a comma may come between words, and a full stop, a
question mark or an exclamation mark where a sentence may end. The search reads the decoder as
`decoding.score_texts` does (no timestamps, no logit rule), so its score compares with a free
text's.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeasr.asr.beam import BatchDecoderSession
from edgeasr.asr.commands.budget import STEP, UNLIMITED, ReadingBudget
from edgeasr.asr.decoding import DecoderSession, Primed, logsumexp
from edgeasr.stages import WordGraph

# hypotheses kept at each step. Measured on both command sets (300), two engines taking turns,
# against 3: sentences +5, intents +4, the command reading's mean 42 -> 54 ms (every row
# costs ~0.4 ms a step); at 4, +2 sentences for 2 ms; 6 with 1 other first word, +7, alike
BEAM = 5
# and besides them, the likeliest of each of this many other first words: a command's first
# word is heard with no words before it, and the likeliest first word is often wrong ("Our
# Lutron Shades open attic" for "are ..."; "and pause" for "unpause"): kept at 3 hypotheses,
# the sentence meant fell out of the beam after its first word (measured on both command sets:
# +4 sentences, +6 intents of 300)
FIRST_WORDS = 2
ROWS = BEAM + FIRST_WORDS  # hypotheses that go on at each step
# a hypothesis whose mean log-probability per token is this much below the floor (or the best
# sentence finished), after this many tokens (a command's first word is often heard wrong), does
# not go on: about half the searches take no sentence, and those are most of the reading's time.
# 1.5 is the lowest that kept every sentence right on the English command sets (1.0 lost some;
# the runs are in docs/benchmarks-archive.md)
HOPELESS, HOPELESS_AFTER = 1.5, 2
MAX_TOKENS = 32  # a command longer than this is not one of the home's
MARKS = (",", ".", "?", "!")  # a comma may come between words; any of them where a sentence may end
ENDS = (".", "?", "!")  # only the end of text may follow these
BARE = ("%", "-", "'s", "°")  # a word that begins so may be written without a space before it ("-hours")
# a word that ends so is elided before the next, which may then be written against it ("l'entrée",
# "dell'ufficio", as the decoder writes them; Home Assistant reads "l' entrée" alike): spelled
# only with the space, "l' Entrée" was less likely than leaving the article out ("Verrouille,
# Entrée.", base, French)
ELIDED = ("'", "’")
# places in the graph whose closures, arcs, allowed tokens and next places are kept: a cache
# that is full starts again (measured: ~700 places and 11 MB after 150 commands, still growing)
MAX_PLACES = 2048


def _one_token(encode: Callable[[str], list[int]], texts: tuple[str, ...]) -> frozenset[int]:
    """The tokens of those texts the tokenizer writes as one token."""
    return frozenset(t for text in texts if len(tokens := encode(text)) == 1 for t in tokens)


def _goes_on(total: float, tokens: int, max_tokens: int, bar: float) -> bool:
    """May a hypothesis of `tokens` tokens whose log-probabilities sum to `total` still end
    above `bar` (the floor, or the best mean finished)? Even spread over the most tokens it may
    have, it may not (a token more only lowers a sum, but may raise a mean); nor, past its
    first word, when its mean so far is HOPELESS below."""
    return total / (max_tokens + 1) >= bar and (tokens <= HOPELESS_AFTER or total / tokens >= bar - HOPELESS)


@dataclass(frozen=True)
class _Unit:
    """A word or a name being spelled: one of its spellings, how far, and where it leads."""

    tokens: tuple[int, ...]
    at: int
    to: int
    mark: str = ""  # the mark its last token carries, where the tokenizer merges them ("%.")
    elided: bool = False  # the word ends elided (ELIDED): the next may follow without a space


@dataclass(frozen=True)
class _Where:
    """Where a hypothesis is in the graph: the states a new word may start from (closed over
    arcs that say nothing), the words under way, and the states after a number under way."""

    states: frozenset[int]
    units: tuple[_Unit, ...] = ()
    number: frozenset[int] = frozenset()
    marked: bool = False  # a mark was the last token: another may not follow
    ended: bool = False  # a mark that ends the sentence was the last token
    decimal: bool = False  # the number under way has its decimal point
    # an elided word was the last: a new word may begin without its space, and no mark follows
    after_elision: bool = False

    def __hash__(self) -> int:
        return self._hash

    @functools.cached_property
    def _hash(self) -> int:
        """Hashed once: a place is looked up in the search's caches at every step of every
        hypothesis, and hashing its words under way anew each time was a third of the
        search's own (Python) time."""
        return hash((self.states, self.units, self.number, self.marked, self.ended, self.decimal,
                     self.after_elision))


@dataclass(frozen=True)
class _Out:
    """The arcs out of a place: each spelling of their words by its first token, and where the
    arcs that take a number lead."""

    spelled: dict[int, tuple[tuple[tuple[int, ...], int, str, bool], ...]]  # spelling, where it leads, mark, elided
    numbers: tuple[int, ...]


@dataclass
class _Hypothesis:
    tokens: list[int]
    total: float  # sum of the tokens' log-probabilities
    where: _Where
    logits: np.ndarray  # for the next token
    rows: np.ndarray  # the self-attention cache rows of its tokens


class GrammarSearch:
    """The decoding of one graph's sentences; its spellings and closures are kept between
    searches (one per vocabulary: see the transcriber's cache)."""

    def __init__(self, graph: WordGraph, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
                 eot: int, max_places: int = MAX_PLACES) -> None:
        self.graph, self.encode, self.decode, self.eot, self.max_places = graph, encode, decode, eot, max_places
        self.marks, self.ends = _one_token(encode, MARKS), _one_token(encode, ENDS)
        self.point = _one_token(encode, (".",))  # a decimal point
        digits = [t for t in range(eot) if decode([t]).strip().isdigit()]
        # a number begins with a space ("to 8") and goes on without one (" 5", "000"): "to8"
        # and "to 8" were two ways of writing one sentence, and took two of its finished places
        self.spaced = frozenset(t for t in digits if decode([t]).startswith(" "))
        self.glued = frozenset(digits) - self.spaced
        self._closures: dict[frozenset[int], frozenset[int]] = {}
        self._spellings: dict[str, tuple[tuple[tuple[int, ...], str], ...]] = {}
        self._allowed: dict[_Where, np.ndarray] = {}
        self._next: dict[tuple[_Where, int], _Where] = {}
        self._labelled: dict[tuple[frozenset[int], bool], _Out] = {}
        self._said: dict[int, str] = {}

    def prepare(self) -> None:
        """Every word of the graph spelled, and the tokens the sentences may begin with, before a
        search asks: a search spelled the words as it came to them, and the first readings of a
        home waited for it (14-24 ms for each test home's 600-900 words, measured)."""
        for label in {label for arcs in self.graph.arcs.values() for label, _ in arcs}:
            if label is not None and label != WordGraph.NUMBER:
                self._spelled(label)
        self._allowed_after(_Where(self._close(frozenset([self.graph.start]))))

    def search(self, session: DecoderSession, primed: Primed, beam: int = BEAM, max_tokens: int = MAX_TOKENS,
               batch: BatchDecoderSession | None = None, floor: float = -np.inf,
               first_words: int = FIRST_WORDS, budget: ReadingBudget | None = None) -> list[tuple[list[int], float]]:
        """The graph's sentences the search finished for the window, likeliest first: each one's
        tokens and mean log-probability per token (end-of-text included); none, or up to `beam`.
        It does not go on with a sentence that can no longer reach the mean of the best one
        finished, nor `floor`, or is hopelessly below them (`_goes_on`), and stops when `beam`
        are finished: speech that is no command ends the search early. The session was `prime`d
        with the window and the prompt. Besides the `beam` likeliest, the likeliest hypothesis of
        each of `first_words` other first words goes on.
        With `batch` (a bundle imported with the batched step), every hypothesis takes its step
        in one run. With `budget`, no step is taken that it does not afford (the sentences
        finished by then are what the search found), and each step is counted there."""
        session.length, logits = primed.length, primed.logits  # the window's prompt, as `prime` left it
        budget = budget if budget is not None else ReadingBudget(UNLIMITED)
        if batch is not None:
            beam = min(beam, batch.size)
            return self._search_batched(batch, logits, beam, min(first_words, batch.size - beam), max_tokens, floor,
                                        budget)
        base = session.length
        hypotheses = [_Hypothesis([], 0.0, _Where(self._close(frozenset([self.graph.start]))), logits,
                                  np.zeros((*session.cache.shape[:2], 0, session.cache.shape[3]), np.float32))]
        finished: dict[str, tuple[list[int], float]] = {}  # by what they say: tokens, mean
        best = -np.inf  # the best mean of the finished sentences
        for _ in range(max_tokens):
            scored = [(total, h, token) for h in hypotheses
                      for total, token in self._extensions(h.where, h.logits, logsumexp(h.logits), h.total,
                                                           beam + first_words)]
            scored.sort(key=lambda x: -x[0])
            going: list[tuple[float, _Hypothesis, int]] = []
            for total, h, token in self._choose(scored, lambda h: h.tokens, finished, beam, first_words):
                if token == self.eot:
                    best = max(best, self._finish(finished, h.tokens, total))
                elif _goes_on(total, len(h.tokens) + 1, max_tokens, max(floor, best)):
                    going.append((total, h, token))
            if not going or len(finished) >= beam or not budget.affords(STEP):
                break
            t0 = budget.clock()
            hypotheses = []
            for total, h, token in going:
                n = h.rows.shape[2]
                session.cache[:, :, base : base + n] = h.rows
                session.length = base + n
                logits = session.step([token]).copy()
                hypotheses.append(_Hypothesis([*h.tokens, token], total, self._after(h.where, token), logits,
                                              session.cache[:, :, base : base + n + 1].copy()))
            budget.spent(STEP, t0)
            budget.steps, budget.rows = budget.steps + 1, budget.rows + len(going)
        return sorted(finished.values(), key=lambda f: -f[1])

    def _search_batched(self, batch: BatchDecoderSession, first: np.ndarray, beam: int, first_words: int,
                        max_tokens: int, floor: float, budget: ReadingBudget) -> list[tuple[list[int], float]]:
        """`search` with the hypotheses as the rows of one batched step."""
        batch.begin()
        # tokens, total, where: hypothesis i is row i of `rows`
        alive: list[tuple[list[int], float, _Where]] = [([], 0.0, _Where(self._close(frozenset([self.graph.start]))))]
        rows, norms = first[None], np.array([logsumexp(first)])
        finished: dict[str, tuple[list[int], float]] = {}
        best = -np.inf
        for _ in range(max_tokens):
            scored = [(total_after, i, token) for i, (_, total, where) in enumerate(alive)
                      for total_after, token in self._extensions(where, rows[i], norms[i], total, beam + first_words)]
            scored.sort(key=lambda x: -x[0])
            going: list[tuple[list[int], float, _Where]] = []
            parents: list[int] = []  # the row each one goes on from
            for total, i, token in self._choose(scored, [a[0] for a in alive].__getitem__, finished, beam,
                                                first_words):
                tokens, _, where = alive[i]
                if token == self.eot:
                    best = max(best, self._finish(finished, tokens, total))
                elif _goes_on(total, len(tokens) + 1, max_tokens, max(floor, best)):
                    going.append(([*tokens, token], total, self._after(where, token)))
                    parents.append(i)
            if not going or len(finished) >= beam or not budget.affords(STEP):
                break
            t0 = budget.clock()
            batch.reorder(parents)
            rows, norms = batch.step([g[0][-1] for g in going]), batch.lse  # only the rows of the hypotheses that go on
            budget.spent(STEP, t0)
            budget.steps, budget.rows = budget.steps + 1, budget.rows + len(going)
            alive = going
        return sorted(finished.values(), key=lambda f: -f[1])

    def _extensions(self, where: _Where, logits: np.ndarray, norm: float, total: float,
                    k: int) -> list[tuple[float, int]]:
        """The k likeliest tokens the graph allows after `where`, each with the hypothesis'
        total once it is said (`norm`: the logits' log-sum-exp)."""
        allowed = self._allowed_after(where)
        if not len(allowed):
            return []
        lp = logits[allowed]
        top = np.argpartition(lp, -k)[-k:] if len(lp) > k else np.arange(len(lp))
        return [(total + float(lp[j] - norm), int(allowed[j])) for j in top[np.argsort(lp[top])[::-1]]]

    def spells(self, tokens: list[int]) -> bool:
        """Is this one of the graph's sentences as the search may write it, the end of text next?"""
        where = _Where(self._close(frozenset([self.graph.start])))
        for token in tokens:
            if token not in self._allowed_after(where):
                return False
            where = self._after(where, token)
        return self.eot in self._allowed_after(where)

    def _choose(self, scored: list[tuple[float, Any, int]], tokens: Callable[[Any], list[int]],
                finished: dict[str, tuple[list[int], float]], beam: int, first_words: int) -> list[tuple]:
        """Of the scored (total, hypothesis, token; likeliest first; `tokens` of a hypothesis),
        the `beam` likeliest, then the likeliest of each of `first_words` first words not among
        them. A sentence finished again is taken only when it is likelier than before: ways of
        writing one sentence that differ only in case or marks ("Pause." and "pause,") filled
        the beam's finished places, and the search stopped before the sentence meant."""
        kept: list[tuple[float, Any, int]] = []
        ended, firsts = set(), set()
        for c in scored:
            said = tokens(c[1])
            first = self._words((said or [c[2]])[:1])
            if len(kept) >= beam and (c[2] == self.eot or first in firsts):
                continue
            if c[2] == self.eot:
                words = self._words(said)
                if words in ended or (words in finished and finished[words][1] >= c[0] / (len(said) + 1)):
                    continue
                ended.add(words)
            kept.append(c)
            firsts.add(first)
            if len(kept) == beam + first_words:
                break
        return kept

    def _finish(self, finished: dict[str, tuple[list[int], float]], tokens: list[int], total: float) -> float:
        """Keep a finished sentence (the likelier way of writing it); its mean per token."""
        mean = total / (len(tokens) + 1)
        words = self._words(tokens)
        if words not in finished or finished[words][1] < mean:
            finished[words] = (tokens, mean)
        return mean

    def _words(self, tokens: list[int]) -> str:
        """What the tokens say, lower-cased, without marks but a decimal point, a number's ".0"
        left out as hassil reads it (a key of sameness, not a text)."""
        for t in tokens:
            if t not in self._said:
                self._said[t] = self.decode([t]).casefold()
        said = re.sub(r"(\d)\.0+(?!\d)", r"\1", "".join(self._said[t] for t in tokens))
        return re.sub(r"[,?!]|\.(?!\d)", "", said).strip()

    # -- the graph, token by token ------------------------------------------------------------
    def _kept(self, cache: dict, key: Any, make: Callable[..., Any], *args: Any) -> Any:
        """cache[key], make(*args) when missing; a full cache starts again (bounded memory). What
        is made is returned as made, not read back: `prepare` may fill the caches from another
        thread."""
        value = cache.get(key)
        if value is None:
            value = make(*args)
            if len(cache) >= self.max_places:
                cache.clear()
            cache[key] = value
        return value

    def _close(self, states: frozenset[int]) -> frozenset[int]:
        """The states reachable over arcs that say nothing."""
        return self._kept(self._closures, states, self._closure, states)

    def _closure(self, states: frozenset[int]) -> frozenset[int]:
        seen, todo = set(states), list(states)
        while todo:
            for label, to in self.graph.arcs.get(todo.pop(), ()):
                if label is None and to not in seen:
                    seen.add(to)
                    todo.append(to)
        return frozenset(seen)

    def _spelled(self, label: str, glued: bool = False) -> tuple[tuple[tuple[int, ...], str], ...]:
        """The ways the decoder writes a word: its tokens, and the mark its last token carries
        where the tokenizer merges a mark into it ("to 50%." is " 50", "%."; "", most words).
        `glued`: after an elided word, also without its space."""
        key = ("" if not glued else "\0") + label
        ways = self._spellings.get(key)  # one per word of the graph: never cleared
        if ways is None:
            ways = self._spellings[key] = self._spellings_of(label, glued)
        return ways

    def _spellings_of(self, label: str, glued: bool) -> tuple[tuple[tuple[int, ...], str], ...]:
        ways: set[tuple[tuple[int, ...], str]] = set()
        forms = {label, label.lower(), label[:1].upper() + label[1:]}
        spaces = ("", " ") if glued or label.startswith(BARE) else (" ",)
        for text in {p + f for f in forms for p in spaces}:
            seq = tuple(self.encode(text))
            ways.add((seq, ""))
            for mark in MARKS:
                merged = tuple(self.encode(text + mark))
                if len(merged) == len(seq) and merged[:-1] == seq[:-1] and merged != seq:
                    ways.add((merged, mark))
        return tuple(ways)

    def _out(self, states: frozenset[int], glued: bool = False) -> _Out:
        """The arcs out of `states` that say something, by the first token of their spellings
        (`glued`: after an elided word)."""
        return self._kept(self._labelled, (states, glued), self._out_of, states, glued)

    def _out_of(self, states: frozenset[int], glued: bool) -> _Out:
        spelled: dict[int, list[tuple[tuple[int, ...], int, str, bool]]] = {}
        numbers: list[int] = []
        for label, to in dict.fromkeys((label, to) for s in states for label, to in self.graph.arcs.get(s, ())
                                       if label is not None):
            if label == WordGraph.NUMBER:
                numbers.append(to)
            else:
                for seq, mark in self._spelled(label, glued):
                    if seq:
                        spelled.setdefault(seq[0], []).append((seq, to, mark, label.endswith(ELIDED)))
        return _Out({t: tuple(units) for t, units in spelled.items()}, tuple(numbers))

    def _allowed_after(self, where: _Where) -> np.ndarray:
        """The tokens the graph allows after `where`, in order."""
        return self._kept(self._allowed, where, self._allowed_tokens, where)

    def _allowed_tokens(self, where: _Where) -> np.ndarray:
        allowed: set[int] = {u.tokens[u.at] for u in where.units}
        if where.number:
            allowed |= self.glued
            if not where.decimal:
                allowed |= self.point
        if where.states and where.ended:
            allowed.add(self.eot)
        elif where.states:
            if not where.marked:
                allowed |= self.marks if where.states & self.graph.finals else self.marks - self.ends
            if where.states & self.graph.finals:
                allowed.add(self.eot)
            out = self._out(where.states, where.after_elision)
            allowed.update(out.spelled)
            if out.numbers:
                allowed |= self.spaced
        return np.array(sorted(allowed), np.int64)

    def _after(self, where: _Where, token: int) -> _Where:
        """Where the hypothesis is once `token` is said."""
        return self._kept(self._next, (where, token), self._step, where, token)

    def _step(self, where: _Where, token: int) -> _Where:
        if token in self.point and where.number and not where.decimal:
            # after digits, a full stop ends the sentence, or digits follow it: "to 20.5 degrees"
            return _Where(where.states & self.graph.finals, number=where.number, marked=True, ended=True, decimal=True)
        if token in self.marks and where.states:
            if token in self.ends:  # only the end of text may follow
                return _Where(where.states & self.graph.finals, marked=True, ended=True)
            return _Where(where.states, marked=True)  # a mark between words: the same place, nothing under way
        units = [_Unit(u.tokens, u.at + 1, u.to, u.mark, u.elided) for u in where.units if u.tokens[u.at] == token]
        out = self._out(where.states, where.after_elision)
        number = (where.number if token in self.glued else frozenset(out.numbers) if token in self.spaced
                  else frozenset())
        units += [_Unit(seq, 1, to, mark, elided) for seq, to, mark, elided in out.spelled.get(token, ())]
        going = tuple(u for u in units if u.at < len(u.tokens))
        done = frozenset(u.to for u in units if u.at == len(u.tokens) and not u.mark) | number
        marked = [u for u in units if u.at == len(u.tokens) and u.mark]
        if marked and not done:  # a word and its mark in one token: as the word, then the mark
            states = self._close(frozenset(u.to for u in marked))
            ended = any(u.mark in ENDS for u in marked)
            return _Where(states & self.graph.finals if ended else states, going, marked=True, ended=ended)
        elided = any(u.elided for u in units if u.at == len(u.tokens) and not u.mark)
        return _Where(self._close(done) if done else frozenset(), going, number, marked=elided,
                      decimal=where.decimal and token in self.glued, after_elision=elided)
