"""Commands heard with the home's names: the keyterm boost and the sentence scoring in
the engine, a home's sentences putting a misheard command right and leaving other speech alone,
a Wyoming request's own names, the intent in the payload, and endpointing."""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers.engines import make_engine
from helpers.text import normalize
from helpers.voices import said
from helpers.wyoming import start_server, stop_server
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncClient

from edgeasr.asr import logits as rules
from edgeasr.asr.decoding import prime, score_texts
from edgeasr.asr.features import log_mel, silence_level
from edgeasr.asr.tail import WindowEnd
from edgeasr.home.names import load_home
from edgeasr.home.sentences import sentences_for
from edgeasr.models.voices import Voice
from edgeasr.stages import SAMPLE_RATE, Intent, Vocabulary

REPO = Path(__file__).resolve().parents[1]
HOME = REPO / "tests" / "data" / "home.yaml"
HELD_OUT = REPO / "tests" / "data" / "held-out-home.yaml"


@pytest.fixture(scope="module")
def tiny(tiny_default_bundle):
    return make_engine(tiny_default_bundle, sentences=sentences_for)


def test_the_names_prompt_holds_the_names_most_like_what_was_heard_within_its_budget(tiny_default_bundle):
    """A home's names fill more than the prompt's budget (this one ~150 tokens): with the text as
    first decoded, the names most like some part of it go first, so that the name said is in the
    prompt; whole names only, the budget held in the bundle's own tokens."""
    from edgeasr.asr.commands.vocabulary import PROMPT_TOKENS, names_prompt, prompt_items, prompt_text
    from edgeasr.asr.tokenizer import Tokenizer
    from edgeasr.bundle import load_bundle

    tokenizer = Tokenizer(load_bundle(tiny_default_bundle))
    home = load_home(HELD_OUT)
    items = prompt_items(home)
    assert ", ".join(items) + "." == prompt_text(home) and len(set(items)) == len(items)
    assert len(tokenizer.encode(" " + prompt_text(home))) > 2 * PROMPT_TOKENS
    plain = tokenizer.decode(names_prompt(items, tokenizer.encode)).strip()
    heard = tokenizer.decode(names_prompt(items, tokenizer.encode, heard="I'm off the Sledge latch.")).strip()
    for prompt in (plain, heard):
        assert len(tokenizer.encode(" " + prompt)) <= PROMPT_TOKENS and prompt.endswith(".")
        assert set(prompt.rstrip(".").split(", ")) <= set(items)  # whole names only
    assert plain.startswith(items[0]) and "Schlage Latch" not in plain
    assert heard.startswith("Schlage Latch")
    assert names_prompt([], tokenizer.encode, heard="anything") == []


def test_the_boost_favours_a_name_under_way_and_its_first_token():
    boost = rules.KeytermBoost([[10, 11, 12], [20]], boost=1.0, first_special=100)
    logits = np.zeros(30, np.float32)
    boost.apply(logits, [5, 10, 11])  # "... <10> <11>": the name goes on with 12
    assert logits[12] > logits[10] == logits[20] == 1.0 > logits[5] == 0.0
    logits = np.zeros(30, np.float32)
    boost.apply(logits, [5, 10, 11, 150])  # a timestamp ends the name: only its beginnings
    assert logits[12] == 0.0 and logits[10] == 1.0
    logits = np.full(30, -np.inf, np.float32)
    boost.apply(logits, [])  # a suppressed token stays suppressed
    assert np.all(np.isneginf(logits))


def test_the_decoder_finds_what_was_said_likelier_than_a_near_sentence(tiny, speakers):
    audio = said(speakers, "pause the timer")
    mel = log_mel(audio, tiny.spec)
    texts = [tiny.sessions.tokenizer.encode(" " + t) for t in ("Pause the timer.", "Post the timer.", "Turn on the lights.")]
    primed = prime(tiny.sessions.decoder, tiny.encoder.encode(mel), tiny.options.decoding, WindowEnd(silence_level(mel), inside=True))
    scores = score_texts(tiny.sessions.decoder, primed, texts)
    assert scores[0] > scores[1] > scores[2]


def test_a_text_is_read_in_one_run_of_the_scoring_step_as_token_by_token(tiny_bundle, speakers):
    """The embedded default bundle's scoring step (decoder_score: every position's logits) reads
    a text by teacher forcing in one run; token by token, the step reads it alike (int8's
    activation scales differ with the rows run together: within 0.1 nats per token) and ranks it
    alike. A bundle without the scoring step (imported without `beam`) reads token by token."""
    tiny = make_engine(tiny_bundle)
    audio = said(speakers, "pause the timer")
    mel = log_mel(audio, tiny.spec)
    texts = [tiny.sessions.tokenizer.encode(" " + t) for t in ("Pause the timer.", "Post the timer.", "Turn on the lights.")]
    primed = prime(tiny.sessions.decoder, tiny.encoder.encode(mel), tiny.options.decoding, WindowEnd(silence_level(mel), inside=True))
    assert tiny.sessions.decoder.every_logits(texts[0]) is not None
    at_once = score_texts(tiny.sessions.decoder, primed, texts)
    graph, tiny.sessions.decoder._score_graph = tiny.sessions.decoder._score_graph, None
    try:
        one_by_one = score_texts(tiny.sessions.decoder, primed, texts)
    finally:
        tiny.sessions.decoder._score_graph = graph
    assert np.allclose(at_once, one_by_one, atol=0.1), (at_once, one_by_one)
    assert np.argsort(at_once).tolist() == np.argsort(one_by_one).tolist()
    # the prompt and a text in one run: the text scored alike, the same place to read others from
    for every in (True, False):
        graph = tiny.sessions.decoder._score_graph
        tiny.sessions.decoder._score_graph = graph if every else None
        try:
            with_text = prime(tiny.sessions.decoder, tiny.encoder.encode(mel), tiny.options.decoding, WindowEnd(silence_level(mel), inside=True), text=texts[0])
            after = score_texts(tiny.sessions.decoder, with_text, texts)
        finally:
            tiny.sessions.decoder._score_graph = graph
        assert with_text.length == primed.length and with_text.text_score is not None
        assert abs(with_text.text_score - at_once[0]) < 0.1 and np.allclose(after, at_once, atol=0.1), (every, after)
        assert np.argmax(with_text.logits) == np.argmax(primed.logits)  # int8: the scales of the rows run together


def test_a_misheard_name_is_put_right_and_other_speech_left_alone(tiny, speakers):
    home = load_home(HOME)
    audio = said(speakers, "turn on the Nanoleaf Shapes")
    result = tiny.transcribe(audio, vocabulary=home)
    assert "nanoleaf shapes" in normalize(result.text), result.text
    assert result.intent is not None and result.intent.name == "HassTurnOn"
    assert ("name", "Nanoleaf Shapes") in result.intent.slots
    look = tiny.transcribe(audio, vocabulary=home, partial=True)  # speech under way: no command read
    assert look.intent is None and "command" not in look.timings_ms and "command" in result.timings_ms
    for text in ("the quick brown fox jumps over the lazy dog", "remind me to buy oat milk and bread"):
        other = tiny.transcribe(said(speakers, text), vocabulary=home)
        assert other.intent is None and normalize(other.text) != "", other.text


def test_a_home_sentence_the_text_could_not_be_a_mishearing_of_is_never_taken(tiny, speakers):
    """"what time is it in Denver" heard right is not one of the home's sentences; "what time is
    it" is: taking it would drop two spoken words, so it is never taken, however near its score
    (a recorded clip of dev-commands came within 0.87 nats per token). Nor is a sentence of fewer
    than half or more than twice the words heard: a one-word command misheard as two is put
    right."""
    from edgeasr.asr.commands.mishearing import misheard_as

    assert not misheard_as("What time is it?", "What time is it in Denver?")
    assert not misheard_as("our lutron shades,", "Our Lutron Shades open attic.")
    assert misheard_as("Resume timer.", "Resin timer.")  # a word put right
    assert misheard_as("Pause.", "Pause.") and misheard_as("Cancel the timer.", "Timer.")
    assert not misheard_as("Lampe de la cuisine,", "La ménue m'a été déplacée à cas de nott.")
    assert not misheard_as("What is the value of the Lumi Strip?", "D'Awalsu D'Awalsu.")
    assert misheard_as("Unpause.", "and pause.")  # half: a word heard as two
    heard = tiny.transcribe(said(speakers, "what time is it in Denver"), vocabulary=load_home(HOME))
    assert normalize(heard.text) == "what time is it in denver" and heard.intent is None, heard.text


def test_a_name_heard_as_a_near_name_is_put_right_with_a_wider_margin(tiny, speakers):
    """A name the decoder never saw is improbable even said plainly: "start the Roborock" decodes
    as "Start the row burah.", and the home's sentence is ~1.1 nats a token less likely than
    that, beyond COMMAND_MARGIN. It differs only in the name, whose letters the text nearly
    spells, so NAME_MARGIN applies (Home Assistant matches near-miss names on text alike)."""
    from edgeasr.asr.commands.mishearing import names_misheard

    names = ["Roborock", "Bose Soundbar", "Schlage Latch", "Living Room"]
    assert names_misheard("Start the Roborock.", "Start the row burah.", names)
    assert names_misheard("Next track on the Bose Soundbar.", "Next track on the Bull Sound Bar.", names)
    assert not names_misheard("Pause the Bose Soundbar.", "Hoss the Bosem Bar.", names)  # "pause" too
    assert not names_misheard("Start the Roborock.", "Start the Roborock!", names)  # no name differs
    assert not names_misheard("Start the Roborock.", "Start the car.", names)  # other letters
    assert not names_misheard("What time is it?", "What time is it in Denver?", names)  # no name
    audio = said(speakers, "start the Roborock", Voice("piper", "en_US-joe-medium", 1.0, 0.0))
    heard = tiny.transcribe(audio, vocabulary=load_home(HOME))
    assert heard.text == "Start the Roborock." and heard.intent == Intent("HassVacuumStart", (("name", "Roborock"),))
    assert normalize(tiny.transcribe(audio).text) != "start the roborock"  # what the rule puts right


def test_a_name_alone_is_taken_only_for_a_text_that_spells_it():
    """A name said alone turns it on in Home Assistant; with the names as the prompt the decoder
    finds one likely for any word heard unclearly ("pause" heard as "Ours.": "Bose Soundbar,"
    came within the margin). With no word of the text to agree with, only its letters can."""
    from edgeasr.asr.commands.mishearing import names_alone_unlike, names_unlike

    names = ["Bose Soundbar", "Roborock", "Living Room"]
    assert names_alone_unlike("Bose Soundbar,", "Ours.", names)
    assert names_alone_unlike("Roborock, Living Room.", "For now.", names)  # names only, other letters
    assert not names_alone_unlike("Bose Soundbar.", "Bo sound bar.", names)  # the letters agree
    assert not names_alone_unlike("Pause.", "Ours.", names)  # no name
    assert not names_alone_unlike("Turn on the Bose Soundbar.", "Ours.", names)  # words besides the name
    # with words besides a name, the letters of the whole must still agree (else nothing is taken)
    assert names_unlike("Roborock, Living Room, off!", "Rock and roll, he said.", names)
    assert not names_unlike("Start the Roborock.", "Start the row burah.", names)
    assert not names_unlike("Pause.", "Ours.", names)


def test_speech_heard_as_nonsense_does_not_become_a_command(tiny, dev_dir):
    """LibriSpeech's "THOU ALSO THOU ALSO" is heard "D'Awalsu D'Awalsu." (-2.2 nats a token), and
    "What is the time?" came within the margin of that (-2.9): a sentence the decoder finds so
    unlikely in itself is not taken (MIN_COMMAND_SCORE)."""
    from edgeasr.audio.files import load_audio

    audio = load_audio(dev_dir / "audio" / "ls_test-other_2414-128291-0008.wav", SAMPLE_RATE)
    heard = tiny.transcribe(audio, vocabulary=load_home(HOME))
    assert heard.intent is None and "time" not in heard.text.lower(), heard.text


def test_a_first_word_heard_wrong_is_put_right(tiny, speakers):
    """A command's first word is heard with no word before it: "are Lutron Shades open attic",
    said slowly, decodes as "Our Lucron shades open attic." Beside its beam, the search keeps
    the likeliest hypothesis of other first words (grammar.FIRST_WORDS), and a sentence it
    finishes written several ways ("Our Lutron Shades," and "our lutron shades.") is one: those
    ways filled the beam before "are ..." was reached."""
    held = load_home(HELD_OUT)
    search = tiny.sessions.command_hearing.search_for(sentences_for(held, "en").graph())
    for rate in (1.15, 1.3):
        audio = said(speakers, "are Lutron Shades open attic", Voice("piper", "en_US-joe-medium", rate, 0.0))
        heard = tiny.transcribe(audio, vocabulary=held)
        assert normalize(heard.text) == "are lutron shades open attic", heard.text
        assert heard.intent is not None and heard.intent.name == "HassGetState"
        mel = log_mel(audio, tiny.spec)
        primed = prime(tiny.sessions.decoder, tiny.encoder.encode(mel), tiny.options.decoding, WindowEnd(silence_level(mel), inside=True))
        found = [normalize(tiny.sessions.tokenizer.decode(tokens)) for tokens, _ in search.search(tiny.sessions.decoder, primed)]
        assert "are lutron shades open attic" in found and len(found) == len(set(found)), found


def test_the_search_drops_only_hypotheses_that_cannot_or_hopelessly_reach_the_bar():
    from edgeasr.asr.commands.grammar import HOPELESS, HOPELESS_AFTER, _goes_on

    bar, most = -1.0, 20
    assert _goes_on(-2.0 * (HOPELESS_AFTER + 1), HOPELESS_AFTER + 1, most, bar)  # behind, may yet reach it
    assert not _goes_on(bar * (most + 2), 3, most, bar)  # even spread over the most tokens: behind
    worst = (bar - HOPELESS - 0.1) * HOPELESS_AFTER
    assert _goes_on(worst, HOPELESS_AFTER, most, bar)  # a first word heard wrong: not judged yet
    assert not _goes_on(worst / HOPELESS_AFTER * (HOPELESS_AFTER + 1), HOPELESS_AFTER + 1, most, bar)


def test_the_search_writes_the_home_sentences_as_the_decoder_does(tiny):
    """Sentences sampled from the templates of both homes, written as the decoder writes them
    (capitalized, a full stop at the end), are the search's sentences token by token, the end of
    text after them: decimals ("to 20.5 degrees"), a mark the tokenizer merges into a word ("to
    50%." is " 50", "%."), "66°" and "66 °". Not "5200k": hassil's pieces of a word that ends a
    number are not known apart from a word of their own."""
    for path in (HOME, HELD_OUT):
        sentences = sentences_for(load_home(path), "en")
        search = tiny.sessions.command_hearing.search_for(sentences.graph())
        sampled = [text for text, _ in sentences.sample(random.Random(3), 300) if not re.search(r"\dk\b", text)]
        written = [" " + text[:1].upper() + text[1:] + "." for text in sampled]
        assert any(re.search(r"\d\.\d", w) for w in written) and any(w.endswith("%.") for w in written)
        missing = [w for w in written if not search.spells(tiny.sessions.tokenizer.encode(w))]
        assert not missing, missing[:5]
        assert not search.spells(tiny.sessions.tokenizer.encode(" Turn on the moon."))


def test_without_a_vocabulary_nothing_changes(tiny, speakers):
    audio = said(speakers, "turn on the Nanoleaf Shapes")
    plain = tiny.transcribe(audio)
    empty = tiny.transcribe(audio, vocabulary=Vocabulary())
    assert plain.text == empty.text and plain.intent is None and empty.intent is None


def test_each_means_of_hearing_a_vocabulary_can_be_measured_alone(tiny, speakers):
    """bench-commands measures the prompt, the boost and the grammar one by one (`hearing`):
    with none of them a vocabulary changes nothing; the grammar alone still finds the intent
    of a command heard right."""
    home = load_home(HOME)
    audio = said(speakers, "pause the timer")
    plain = tiny.transcribe(audio)
    assert tiny.variant(replace(tiny.options, vocabulary_means=frozenset())).transcribe(audio, vocabulary=home).text == plain.text
    heard = tiny.variant(replace(tiny.options, vocabulary_means=frozenset({"grammar"}))).transcribe(audio, vocabulary=home)
    assert heard.intent is not None and heard.intent.name == "HassPauseTimer", heard


def test_transcribe_json_carries_the_intent_when_asked(tiny_default_bundle, speakers, tmp_path):
    import soundfile as sf

    wav = tmp_path / "pause.wav"
    sf.write(wav, said(speakers, "pause the timer"), SAMPLE_RATE, subtype="PCM_16")
    base = [sys.executable, "-m", "edgeasr", "--log-level", "WARNING", "transcribe", "--json",
            "--model", str(tiny_default_bundle), "--set", f"vocabulary.home={HOME}", str(wav)]
    asked = json.loads(subprocess.run([*base, "--set", "output.intent=true"], capture_output=True, text=True,
                                      check=True, cwd=REPO).stdout)
    assert asked["intent"] == {"name": "HassPauseTimer", "slots": {}}, asked
    # what the command reading did: the text as decoded read by Home Assistant's matcher
    assert asked["reading"]["matched"] >= 1 and asked["reading"]["cut"] == 0 and "command" in asked["timings_ms"]
    quiet = json.loads(subprocess.run(base, capture_output=True, text=True, check=True, cwd=REPO).stdout)
    assert "intent" not in quiet and quiet["text"] == asked["text"]


async def _request(uri: str, audio: np.ndarray, names: list[str] | None = None, realtime: bool = False,
                   stop_after_s: float | None = None) -> tuple[str | None, float | None, float]:
    """One request: the transcript, when it came and when the last audio was sent (monotonic
    clock). With `stop_after_s`, audio-stop is sent only after that long waiting for it."""
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    step = int(0.1 * SAMPLE_RATE) * 2
    async with AsyncClient.from_uri(uri) as client:
        await client.write_event(Transcribe(transcript_names=names).event())
        await client.write_event(AudioStart(rate=SAMPLE_RATE, width=2, channels=1).event())
        sent = time.monotonic()
        transcript: str | None = None
        came: float | None = None

        async def read() -> None:
            nonlocal transcript, came
            while True:
                event = await client.read_event()
                if event is None:
                    return
                if Transcript.is_type(event.type):
                    transcript, came = Transcript.from_event(event).text, time.monotonic()
                    return

        reader = asyncio.create_task(read())
        for i in range(0, len(pcm), step):
            await client.write_event(AudioChunk(rate=SAMPLE_RATE, width=2, channels=1, audio=pcm[i : i + step]).event())
            sent = time.monotonic()
            if realtime:
                await asyncio.sleep(0.1)
        if stop_after_s is not None:
            await asyncio.wait([reader], timeout=stop_after_s)
        if not reader.done():
            await client.write_event(AudioStop().event())
        await asyncio.wait_for(reader, 60)
        return transcript, came, sent


def test_a_wyoming_requests_names_are_heard_and_the_transcript_comes_at_the_endpoint(
        tiny_default_bundle, speakers, tmp_path):
    """transcript_names (wyoming >= 1.10) join the home's vocabulary for that request; with
    wyoming.endpoint_ms the transcript comes once the VAD has heard that much silence after the
    speech, before the client's audio-stop."""
    server = start_server(tmp_path, tiny_default_bundle, {"wyoming.endpoint_ms": 600})
    try:
        speech = said(speakers, "turn on the Nanoleaf Shapes")
        text, _, _ = asyncio.run(_request(server.uri, speech, names=["Nanoleaf Shapes", "Living Room"]))
        assert text is not None and "nanoleaf shapes" in normalize(text), text
        trailing = np.zeros(3 * SAMPLE_RATE, np.float32)
        started = time.monotonic()
        text, came, last_sent = asyncio.run(_request(server.uri, np.concatenate([speech, trailing]),
                                                     realtime=True, stop_after_s=0.0))
        speech_end = started + len(speech) / SAMPLE_RATE
        # it came while the silence after the speech was still being sent, soon after the speech
        assert text is not None and came is not None, text
        assert came < last_sent and came - speech_end < 1.5, (came - speech_end, last_sent - came)
    finally:
        stop_server(server)


def test_the_search_takes_its_steps_one_hypothesis_at_a_time_or_batched_alike(tiny_bundle, speakers):
    """The embedded default bundle holds the batched step (models/default.py): the hypotheses
    of the search held to the home's sentences take each step in one run, and find what the
    search one hypothesis at a time finds."""
    engine = make_engine(tiny_bundle)
    assert engine.sessions.batch() is not None
    search = engine.sessions.command_hearing.search_for(sentences_for(load_home(HOME), "en").graph())
    audio = said(speakers, "pause the timer")
    mel = log_mel(audio, engine.spec)
    encoded, options = engine.encoder.encode(mel), replace(engine.options.decoding, language="en")
    primed = prime(engine.sessions.decoder, encoded, options, WindowEnd(silence_level(mel), inside=True))
    ones = search.search(engine.sessions.decoder, primed)
    batched = search.search(engine.sessions.decoder, primed, batch=engine.sessions.batch())
    assert ones and batched
    one = ones[0]
    assert one[0] == batched[0][0] and abs(one[1] - batched[0][1]) < 0.05
    assert normalize(engine.sessions.tokenizer.decode(one[0])) == "pause the timer"
    assert [s for _, s in ones] == sorted((s for _, s in ones), reverse=True)  # likeliest first
    # a floor the sentence reaches changes nothing; one no sentence can reach ends the search
    for batch in (None, engine.sessions.batch()):
        reached = search.search(engine.sessions.decoder, primed, batch=batch, floor=one[1] - 0.1)
        assert reached and reached[0][0] == one[0]
        assert search.search(engine.sessions.decoder, primed, batch=batch, floor=0.0) == []


def test_the_searchs_caches_are_bounded_and_change_nothing(tiny, speakers):
    """The places in the graph the search has been are cached (GrammarSearch.max_places each):
    with a cache too small for one search, it finds the same sentence."""
    from edgeasr.asr.commands.grammar import GrammarSearch

    graph = sentences_for(load_home(HOME), "en").graph()
    tok = tiny.sessions.tokenizer
    roomy, tight = (GrammarSearch(graph, tok.encode, tok.decode, tiny.bundle.tokens.eot, max_places=n)
                    for n in (4096, 8))
    mel = log_mel(said(speakers, "turn on the Nanoleaf Shapes"), tiny.spec)
    primed = prime(tiny.sessions.decoder, tiny.encoder.encode(mel), tiny.options.decoding, WindowEnd(silence_level(mel), inside=True))
    found = roomy.search(tiny.sessions.decoder, primed)
    assert found and found == tight.search(tiny.sessions.decoder, primed)
    assert "nanoleaf shapes" in normalize(tok.decode(found[0][0]))
    caches = (tight._closures, tight._labelled, tight._allowed, tight._next)
    assert all(0 < len(c) <= 8 for c in caches) and len(roomy._next) > 8


def test_prepare_builds_what_a_reading_needs_before_the_first_command(tiny_bundle, speakers):
    """Transcriber.prepare (the daemon calls it whenever the vocabulary changes): the home's
    graph, every word of it spelled, the first step of its search, and the graphs a reading runs
    (the scoring step; the batched step, run once for every number of rows) exist before any
    command is read, and the reading then uses them; a language the templates do not have
    prepares nothing."""
    from edgeasr.stages import WordGraph

    engine = make_engine(tiny_bundle, sentences=sentences_for)  # every extra: the steps a reading runs
    sessions = engine.sessions
    assert sessions.decoder._score_session is None and sessions._batch is None  # made on first use
    vocabulary = load_home(HELD_OUT)
    assert engine.prepare(vocabulary, "en")
    graph = sentences_for(vocabulary, "en")._graph  # built, and kept for the reading
    assert graph is not None
    search = sessions.command_hearing._searches[id(graph)][1]
    assert len(search._allowed) >= 1  # the sentences' first words
    words = {label for arcs in graph.arcs.values() for label, _ in arcs if label not in (None, WordGraph.NUMBER)}
    assert words and words <= set(search._spellings)
    scoring, batch = sessions.decoder._score_session, sessions._batch
    assert scoring is not None and batch is not None and batch._warm
    heard = engine.transcribe(said(speakers, "turn on the nano leaf shapes"), language="en", vocabulary=vocabulary)
    assert heard.reading and heard.reading["steps"] > 0  # searched, on the sessions prepared
    assert sessions.decoder._score_session is scoring and sessions._batch is batch
    assert not engine.prepare(vocabulary, "xx")
