"""Home Assistant's sentences for a home: the language's intent templates
(`home-assistant-intents`) with the home's names in their slot lists, matched by `hassil` as
Home Assistant's default conversation agent matches them, and sampled into sentences for a
command set.

The only module that imports hassil and home_assistant_intents (lazily: they are the
`commands` extra). The slot lists are built as the default agent builds them: `name` holds
every entity name and alias (value: the text said, context: the entity's domain), `area` every
area name and alias, `floor` every floor name and alias (an alias's value is the floor's
name). A plain name, whose role is not known, joins both `name` and `area`; a name without a
domain joins `name` once per domain the templates ask for, so that it fits wherever a template
takes an entity. Sentences without a name ("pause", "turn on the lights") match as on a
satellite in an area: the home's first area unless another is given (with plain names only,
the first of them).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import random
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from edgeasr.errors import ToolMissingError, UsageError
from edgeasr.stages import HomeName, Intent, Vocabulary, WordGraph

if TYPE_CHECKING:
    from edgeasr.config import Config

log = logging.getLogger(__name__)

PIP_HINT = "pip install 'edgeasr[commands]'"
# What Home Assistant's default agent passes to recognize_best: custom sentences first, then
# results that fill the `name` slot
CUSTOM_SENTENCE_KEY = "hass_custom_sentence"
BEST_SLOT = "name"
SAMPLE_TRIES = 50  # random sentences drawn per sentence wanted before giving up
SKIP = "<skip>"  # hassil's FST arc for a word the sentence may begin or end with unheard
SENTENCES_CACHE = 8  # vocabularies whose sentences are kept built (a home's changes seldom)
MAX_WAYS = 32  # ways to say one list value taken into the word graph (its alternatives)
# texts whose intent is kept: a home says its commands again and again, and Home Assistant's
# matcher takes 4-17 ms a text on this machine
RECOGNIZED_CACHE = 256


def _vendor() -> tuple[Any, Any]:
    try:
        import hassil
        import home_assistant_intents
        import rapidfuzz  # noqa: F401  (the names prompt before them is ranked with it: asr/vocabulary.py)
    except ImportError as exc:
        raise ToolMissingError("Home Assistant's sentences need hassil, home-assistant-intents and rapidfuzz: "
                               f"{PIP_HINT}") from exc
    return hassil, home_assistant_intents


def _value_text(value: Any) -> str:
    """A slot's value as text: a whole number without its '.0'."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class HomeSentences:
    """The language's intent templates with the home's names: `recognize` a text as Home
    Assistant would, `sample` sentences of the templates with the home's names filled in."""

    def __init__(self, vocabulary: Vocabulary, language: str, area: str | None = None) -> None:
        hassil, _ = _vendor()
        self.language = language
        self._hassil = hassil
        self._intents = _intents(language)
        self._slot_lists = _slot_lists(hassil, vocabulary.names, _template_domains(self._intents))
        self._said = {list_name: _said_in(slot_list) for list_name, slot_list in self._slot_lists.items()}
        self._graph: WordGraph | None = None
        self._graph_lock = threading.Lock()  # built once, by the first of the reading and Transcriber.prepare
        # plain names (a Wyoming request's transcript_names carry no role) stand for areas too:
        # without any area, sentences without a name ("pause", "volume up"), which Home Assistant
        # hears in the satellite's area, would match nothing
        areas = ([n.name for n in vocabulary.names if n.kind == "area"]
                 or [n.name for n in vocabulary.names if n.kind == "name"])
        self.area = area if area is not None else (areas[0] if areas else None)
        self._context = {"area": {"value": self.area, "text": self.area}} if self.area else None
        self._recognized = functools.lru_cache(maxsize=RECOGNIZED_CACHE)(self._recognize)

    def recognize(self, text: str) -> Intent | None:
        """The intent Home Assistant's default agent finds in `text` (its strict match: every
        slot filled from the home's lists), or None."""
        return self._recognized(text)

    def _recognize(self, text: str) -> Intent | None:
        result = self._hassil.recognize_best(
            text, self._intents, slot_lists=self._slot_lists, intent_context=self._context,
            language=self.language, best_metadata_key=CUSTOM_SENTENCE_KEY, best_slot_name=BEST_SLOT)
        if result is None:
            return None
        slots = sorted((e.name, _value_text(e.value)) for e in result.entities_list)
        free = frozenset(e.name for e in result.entities_list if e.is_wildcard)
        return Intent(result.intent.name, tuple(slots), free)

    def graph(self) -> WordGraph:
        """The home's sentences as a graph of words (hassil's FST of the templates, as
        Speech-to-Phrase builds one): the home's names, areas and floors and the templates'
        own lists (colors, states, ...) put in for their slots, NUMBER for a number's; slots of
        free text (a message, a shopping-list item) and the FST's word-skipping arcs left out:
        free decoding hears those."""
        with self._graph_lock:
            if self._graph is None:
                said = self._slot_values()
                self._graph = _joined([self._block_graph(domains, intents, said)
                                       for domains, intents in _by_domains(self._hassil, self._intents).items()])
            return self._graph

    def _block_graph(self, domains: frozenset[str], intents: Any, said: dict[str, tuple[str, ...]]) -> WordGraph:
        """The graph of the templates that ask for an entity of `domains` (none: any), their
        entity slot holding only the names Home Assistant would match there: "the fan mode of
        the blinds" is no sentence of a home whose blinds are a cover, and such sentences took
        the places of the search held to the graph."""
        from hassil.fst import intents_to_fst

        if domains:
            said = {**said, BEST_SLOT: tuple(_said_in(self._slot_lists[BEST_SLOT], domains))}
        fst = intents_to_fst(intents, self._slot_lists)
        return WordGraph(fst.start, _word_arcs(fst, said), frozenset(fst.final_states))

    def _slot_values(self) -> dict[str, tuple[str, ...]]:
        """What may be said for each slot the templates name: the home's names, areas and floors;
        a text list's values; NUMBER for a range. A slot of free text has none."""
        h = self._hassil
        found: dict[str, set[str]] = {slot: set(values) for slot, values in self._said.items()}
        for intent in self._intents.intents.values():
            for data in intent.data:
                lists = {**self._intents.slot_lists, **data.slot_lists}
                rules = {**self._intents.expansion_rules, **data.expansion_rules}
                for sentence in data.sentences:
                    for ref in _list_references(h, sentence.expression, rules):
                        slot_list = lists.get(ref.list_name)
                        if ref.slot_name in self._said:
                            continue
                        if isinstance(slot_list, h.RangeSlotList):
                            found.setdefault(ref.slot_name, set()).add(WordGraph.NUMBER)
                        elif isinstance(slot_list, h.TextSlotList):
                            found.setdefault(ref.slot_name, set()).update(
                                way for v in slot_list.values for way in _ways_to_say(h, v.text_in))
        return {slot: tuple(sorted(v for v in values if v)) for slot, values in found.items()}

    def sample(self, rng: random.Random, n: int, intents: Iterable[str] | None = None) -> list[tuple[str, Intent]]:
        """Up to `n` different sentences of the templates (an intent drawn first, then one of
        its templates, then each choice in it; a name only among those the template's context
        allows) with the home's names, each with the intent `recognize` finds in it; only
        sentences that map back to the intent they were drawn from are kept. Templates with a
        free-text slot (a wildcard) are left out."""
        templates = self._templates(set(intents) if intents is not None else None)
        names = sorted(templates)
        found: dict[str, Intent] = {}
        for _ in range(SAMPLE_TRIES * n if names else 0):
            if len(found) == n:
                break
            name = rng.choice(names)
            text = " ".join(rng.choice(templates[name]).say(rng).split())
            if not text or text in found:
                continue
            intent = self.recognize(text)
            if intent is not None and intent.name == name:
                found[text] = intent
        if len(found) < n:
            log.warning("only %d sentences of the %d asked for map back to their intent", len(found), n)
        return list(found.items())

    def _templates(self, wanted: set[str] | None) -> dict[str, list[_Template]]:
        """Each intent's templates without a wildcard slot."""
        templates: dict[str, list[_Template]] = {}
        for name, intent in sorted(self._intents.intents.items()):
            if wanted is not None and name not in wanted:
                continue
            for data in intent.data:
                rules = {**self._intents.expansion_rules, **data.expansion_rules}
                lists = {**self._intents.slot_lists, **self._slot_lists, **data.slot_lists}
                for sentence in data.sentences:
                    if not data.wildcard_list_names.intersection(sentence.list_names(rules)):
                        templates.setdefault(name, []).append(_Template(self._hassil, sentence, rules, lists, data))
        return templates


class _Template:
    """One sentence template of an intent's block, with the rules and lists it reads."""

    def __init__(self, hassil: Any, sentence: Any, rules: dict, lists: dict, data: Any) -> None:
        self.hassil, self.sentence, self.rules, self.lists, self.data = hassil, sentence, rules, lists, data

    def say(self, rng: random.Random) -> str:
        return self._walk(self.sentence.expression, rng)

    def _allows(self, value: Any) -> bool:
        """May this list value fill the template (the block's required and excluded context)?"""
        requires, excludes = self.data.requires_context, self.data.excludes_context
        return (self.hassil.check_required_context(requires, value.context, allow_missing_keys=True)
                and self.hassil.check_excluded_context(excludes, value.context))

    def _walk(self, expression: Any, rng: random.Random) -> str:
        """One random way to say `expression`."""
        h = self.hassil
        if isinstance(expression, h.TextChunk):
            return expression.original_text
        if isinstance(expression, h.Alternative):
            return self._walk(rng.choice(expression.items), rng)
        if isinstance(expression, h.Permutation):
            items = list(expression.items)
            rng.shuffle(items)
            return " ".join(self._walk(item, rng) for item in items)
        if isinstance(expression, h.Sequence):
            return "".join(self._walk(item, rng) for item in expression.items)
        if isinstance(expression, h.RuleReference):
            return self._walk(self.rules[expression.rule_name].expression, rng)
        if isinstance(expression, h.ListReference):
            if expression.is_inline_range:
                start, stop, step = expression.get_inline_range()
                return str(rng.randrange(start, stop + 1, step))
            slot_list = self.lists[expression.list_name]
            if isinstance(slot_list, h.TextSlotList):
                values = [v for v in slot_list.values if self._allows(v)]
                return self._walk(rng.choice(values).text_in, rng) if values else ""
            if isinstance(slot_list, h.RangeSlotList):
                return _value_text(rng.choice(list(slot_list.get_numbers())))
        raise ValueError(f"cannot sample {expression!r}")


@functools.cache
def _intents(language: str) -> Any:
    """The language's templates, parsed once per process (every home's sentences share them)."""
    hassil, intents_package = _vendor()
    data = intents_package.get_intents(language)
    if not data:
        raise UsageError(f"home-assistant-intents has no sentences for language {language!r}")
    return hassil.Intents.from_dict(data)


def _word_arcs(fst: Any, said: dict[str, tuple[str, ...]]) -> dict[int, tuple[tuple[str | None, int], ...]]:
    """The FST's arcs as a WordGraph's: a slot's arc becomes one per value said for it, a space
    or an epsilon one that says nothing, and the pieces of a word become whole words. hassil
    spells "hour[s]" as the arc "hour" and an optional arc "s" with no space between: from
    where a word may start (the start, after a space or a slot), every run of pieces to where
    the word may end is one arc ("hour", "hours"); a piece only inside a word has none."""
    from hassil.fst import EPS, SPACE

    def is_slot(label: str) -> bool:
        return label.startswith("{") and label.endswith("}")

    def is_piece(label: str) -> bool:
        return label not in (EPS, SPACE, SKIP) and not is_slot(label)

    def over_eps(states: Iterable[int]) -> set[int]:
        todo, seen = list(states), set(states)
        while todo:
            for arc in fst.arcs.get(todo.pop(), ()):
                if arc.in_label == EPS and arc.to_state not in seen:
                    seen.add(arc.to_state)
                    todo.append(arc.to_state)
        return seen

    starts = over_eps([fst.start, *(arc.to_state for out in fst.arcs.values() for arc in out
                                    if not is_piece(arc.in_label) and arc.in_label != EPS)])

    @functools.cache
    def may_end(state: int) -> bool:
        return any(s in fst.final_states or any(not is_piece(a.in_label) and a.in_label != EPS
                                                for a in fst.arcs.get(s, ())) for s in over_eps([state]))

    def words(state: int, word: str, seen: frozenset[int]) -> Iterator[tuple[str, int]]:
        """The words that go on from `word` at `state`, and where each ends."""
        if may_end(state):
            yield word, state
        for arc in fst.arcs.get(state, ()):
            if arc.to_state not in seen and (arc.in_label == EPS or is_piece(arc.in_label)):
                more = "" if arc.in_label == EPS else arc.in_label
                yield from words(arc.to_state, word + more, seen | {arc.to_state})

    arcs: dict[int, list[tuple[str | None, int]]] = {}
    for state, out in fst.arcs.items():
        for arc in out:
            label = arc.in_label
            if label in (EPS, SPACE):
                arcs.setdefault(state, []).append((None, arc.to_state))
            elif is_slot(label):
                arcs.setdefault(state, []).extend((value, arc.to_state) for value in said.get(label[1:-1], ()))
            elif is_piece(label) and state in starts:
                arcs.setdefault(state, []).extend(words(arc.to_state, label, frozenset([arc.to_state])))
    return {state: tuple(dict.fromkeys(out)) for state, out in arcs.items()}


def _by_domains(hassil: Any, intents: Any) -> dict[frozenset[str], Any]:
    """The templates split by the entity domains their blocks ask for (none: any)."""
    blocks: dict[frozenset[str], dict[str, list[Any]]] = {}
    for name, intent in intents.intents.items():
        for data in intent.data:
            blocks.setdefault(frozenset(data.domains or ()), {}).setdefault(name, []).append(data)
    return {domains: dataclasses.replace(intents, intents={name: hassil.intents.Intent(name=name, data=data)
                                                           for name, data in by_intent.items()})
            for domains, by_intent in blocks.items()}


def _joined(graphs: list[WordGraph]) -> WordGraph:
    """One graph of several: a start of its own that goes to each one's start saying nothing."""
    arcs: dict[int, tuple[tuple[str | None, int], ...]] = {}
    starts, finals, offset = [], set[int](), 1
    for graph in graphs:
        states = {graph.start, *graph.arcs, *(to for out in graph.arcs.values() for _, to in out), *graph.finals}
        arcs.update({state + offset: tuple((label, to + offset) for label, to in out)
                     for state, out in graph.arcs.items()})
        starts.append(graph.start + offset)
        finals.update(state + offset for state in graph.finals)
        offset += max(states) + 1
    arcs[0] = tuple((None, start) for start in starts)
    return WordGraph(0, arcs, frozenset(finals))


def _ways_to_say(hassil: Any, text_in: Any) -> Iterator[str]:
    """Every way a list value of the templates is said: a word, or alternatives ("(up|increase)"
    of `volume_step`, the fan modes, the cover classes)."""
    if isinstance(text_in, hassil.TextChunk):
        yield " ".join(str(text_in.text).split())
        return
    from hassil.sample import sample_expression

    for text in itertools.islice(sample_expression(text_in), MAX_WAYS):
        yield " ".join(text.split())


def _said_in(slot_list: Any, domains: frozenset[str] = frozenset()) -> list[str]:
    """Every way a text slot list's values are said; with `domains`, of the values whose
    context names one of them or no domain."""
    def fits(value: Any) -> bool:
        domain = (value.context or {}).get("domain")
        return not domains or domain is None or domain in domains

    return list(dict.fromkeys(" ".join(str(v.text_in.text).split()) for v in getattr(slot_list, "values", [])
                              if fits(v)))


def _list_references(hassil: Any, expression: Any, rules: dict, seen: frozenset[str] = frozenset()) -> Iterator[Any]:
    """Every list a template expression refers to, through its rules."""
    if isinstance(expression, hassil.ListReference):
        yield expression
    elif isinstance(expression, hassil.RuleReference):
        rule = rules.get(expression.rule_name)
        if rule is not None and expression.rule_name not in seen:
            yield from _list_references(hassil, rule.expression, rules, seen | {expression.rule_name})
    elif hasattr(expression, "items"):
        for item in expression.items:
            yield from _list_references(hassil, item, rules, seen)


def _template_domains(intents: Any) -> list[str]:
    """Every entity domain a block of the templates requires."""
    found: set[str] = set()
    for intent in intents.intents.values():
        for data in intent.data:
            domain = data.requires_context.get("domain")
            found.update([domain] if isinstance(domain, str) else domain or ())
    return sorted(found)


def _slot_lists(hassil: Any, names: Iterable[HomeName], domains: list[str]) -> dict[str, Any]:
    """`name`, `area` and `floor` as Home Assistant's default agent builds them."""
    entities: list[tuple[str, str, dict]] = []
    areas: list[tuple[str, str]] = []
    floors: list[tuple[str, str]] = []
    for n in names:
        if n.kind in ("entity", "name"):
            contexts = [{"domain": n.domain}] if n.domain else [{}] + [{"domain": d} for d in domains]
            # aliases first, as Home Assistant
            entities += [(s, s, context) for context in contexts for s in (*n.aliases, n.name)]
        if n.kind in ("area", "name"):
            areas += [(s, s) for s in n.spoken]
        if n.kind == "floor":
            floors += [(s, n.name) for s in n.spoken]
    return {list_name: hassil.TextSlotList.from_tuples(values, allow_template=False, name=list_name)
            for list_name, values in (("name", entities), ("area", areas), ("floor", floors))}


def available() -> bool:
    """Are hassil and home-assistant-intents installed (the `commands` extra)?"""
    try:
        _vendor()
    except ToolMissingError:
        return False
    return True


@functools.lru_cache(maxsize=SENTENCES_CACHE)
def sentences_for(vocabulary: Vocabulary, language: str) -> HomeSentences | None:
    """The home's sentences for a vocabulary (each request may bring names of its own), or
    None where the templates have no sentences in that language."""
    try:
        return HomeSentences(vocabulary, language)
    except UsageError:
        return None


def sentences_for_engine(cfg: Config) -> Callable[[Vocabulary, str], HomeSentences | None] | None:
    """What the engine hears commands with (`Transcriber.sentences`): None without the
    `commands` extra, said once when the configuration gives names it could use."""
    if available():
        return sentences_for
    if cfg.vocabulary.home or cfg.vocabulary.names or cfg.homeassistant.url or cfg.output.intent:
        log.info("Home Assistant's sentences are not installed (%s): the home's names are heard as a prompt "
                 "and a boost only, and no intent is found", PIP_HINT)
    return None
