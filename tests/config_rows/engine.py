"""Rows for `model`, `encoder` and `decoder`: the engine as the daemon builds it
(daemon.engine_for), seen through what it returns (Transcription's text and fields), the
encoder the config opens (asr.encoder.create_encoder: on the CPU, or on the HailoRT stand-in
with a fake clock for its backoff), and the threads onnxruntime starts."""

from __future__ import annotations

from contextlib import closing

import numpy as np
import pytest
from helpers.audio import as_float, dev_clip
from helpers.hailo import FakeTime

from config_rows.lab import Lab, Rows, noise
from edgeasr.asr.encoder import create_encoder
from edgeasr.asr.features import MelSpec, log_mel
from edgeasr.asr.supervision import FAILED, RECOVERING, EncoderFailedError
from edgeasr.bundle import load_bundle
from edgeasr.errors import DeviceError

rows = Rows()
SPEECH = dev_clip("ls_test-other_1688-142285-0002")  # "You don't mean that you thought me so silly."
SHORT = dev_clip("alsa_front-center")  # "Front Center."
REPEATED = dev_clip("ls_test-other_367-130732-0000")  # "Lobsters and lobsters."
TWICE = dev_clip("ls_test-other_2414-128291-0008")  # "Thou also, thou also."
RUNS_ON = dev_clip("ljs_LJ001-0012")  # 6.3 s: fed without padding, the decoder runs on past the speech
LONG = dev_clip("ls_dev-clean_2412-153948-0000")  # 11.7 s: two windows
TERMS = dev_clip("houndify_how_many_megabytes_in_a_bit")
STALL_MS = 60_000


# -- model ------------------------------------------------------------------------------------------

@rows.observe("model.path", "model")
def _model_path(lab: Lab) -> None:
    from edgeasr.models.default import open_bundle

    base = lab.fixture("base_bundle")
    bundle = open_bundle(lab.cfg({"model.path": str(base)}), verify=False)
    assert bundle.root == base and bundle.multilingual and bundle.name != load_bundle(lab.bundle).name


@rows.observe("model.language", "model")
def _model_language(lab: Lab) -> None:
    """English speech heard as German (null: the language is detected: English)."""
    result = lab.transcribe({"model.language": "de"}, SPEECH, lab.fixture("base_bundle"))
    assert result.language == "de" and "silly" not in result.text.lower(), result.text


@rows.observe("model.task", "model")
def _model_task(lab: Lab) -> None:
    """Heard as German, translated to English."""
    base = lab.fixture("base_bundle")
    german = lab.transcribe({"model.language": "de"}, SPEECH, base)
    english = lab.transcribe({"model.language": "de", "model.task": "translate"}, SPEECH, base)
    assert "silly" in english.text.lower() and "silly" not in german.text.lower(), (english.text, german.text)


# -- encoder ------------------------------------------------------------------------------------------

def mel(lab: Lab, bundle_dir=None):
    a = load_bundle(bundle_dir or lab.bundle).audio
    spec = MelSpec(a.sample_rate, a.n_fft, a.hop_length, a.n_mels, a.n_frames)
    return log_mel(as_float(SHORT), spec)


def npu(lab: Lab, keys: dict, **standin: str):
    """The stand-in's Hailo-8 with a HEF for the bundle; the encoder these keys open on it."""
    stand, bundle = lab.fixture("standin"), lab.fixture("hailo_bundle")
    stand.set(**standin)
    stand.write_hef(bundle)
    t = FakeTime()
    return create_encoder(load_bundle(bundle), lab.cfg(keys).encoder, clock=t.clock, sleep=t.sleep)


@rows.observe("encoder.backend", "model")
def _encoder_backend(lab: Lab) -> None:
    """With an NPU present, auto takes it; onnx keeps the encoder on the CPU."""
    with closing(npu(lab, {})) as auto:
        assert auto.backend == "hailo"
    with closing(npu(lab, {"encoder.backend": "onnx"})) as cpu:
        assert cpu.backend == "onnx"


@rows.observe("encoder.precision", "model")
def _encoder_precision(lab: Lab) -> None:
    bundle, features = load_bundle(lab.bundle), mel(lab)
    int8 = create_encoder(bundle, lab.cfg({"encoder.backend": "onnx"}).encoder).encode(features)
    fp32 = create_encoder(bundle, lab.cfg({"encoder.backend": "onnx", "encoder.precision": "fp32"}).encoder)
    assert not np.array_equal(fp32.encode(features), int8)
    assert np.array_equal(fp32.encode(features), fp32.encode(features))  # the same graph each time


@rows.observe("encoder.threads", "model")
def _encoder_threads(lab: Lab) -> None:
    counts = lab.fixture("thread_counts")
    assert counts["encoder 4"] - counts["encoder"] == 2  # onnxruntime's pool: the caller and n - 1


@rows.observe("encoder.hef", "model")
def _encoder_hef(lab: Lab) -> None:
    stand, bundle = lab.fixture("standin"), lab.fixture("hailo_bundle")
    hef = stand.write_hef(bundle, out=lab.tmp / "elsewhere.hef", record=False)  # not in the bundle
    cfg = lab.cfg({"encoder.backend": "hailo"})
    with pytest.raises(DeviceError, match="encoder.hef: no compiled HEF"):
        create_encoder(load_bundle(bundle), cfg.encoder)
    cfg = lab.cfg({"encoder.backend": "hailo", "encoder.hef": str(hef)})
    with closing(create_encoder(load_bundle(bundle), cfg.encoder)) as encoder:
        assert encoder.backend == "hailo" and encoder.encode(mel(lab)).shape[0] == 1


@rows.observe("encoder.timeout_ms", "model")
def _encoder_timeout_ms(lab: Lab) -> None:
    """A chip 300 ms slow: within the default 2000 ms; past 50 ms, a failed window."""
    features = mel(lab)
    with closing(npu(lab, {}, latency_ms="300")) as patient:
        assert patient.encode(features).shape[0] == 1
    with closing(npu(lab, {"encoder.timeout_ms": 50}, latency_ms="300")) as hasty, \
            pytest.raises(EncoderFailedError, match="HAILO_TIMEOUT"):
        hasty.encode(features)


rows.cannot("encoder.scheduler", "how HailoRT time-shares the chip needs a Hailo-8: the stand-in runs one network "
                                 "either way (with none, encoder.service_group is refused: tests/test_config.py)")


@rows.observe("encoder.service_group", "model")
def _encoder_service_group(lab: Lab) -> None:
    """In a group, hailort.service shares the chip; alone, the first encoder holds it."""
    shared = {"encoder.service_group": "SHARED"}
    first = npu(lab, shared, service="running")
    second = npu(lab, shared, service="running")
    assert first.encode(mel(lab)).shape == second.encode(mel(lab)).shape
    first.close(), second.close()
    with closing(npu(lab, {})), pytest.raises(DeviceError, match="busy"):
        npu(lab, {})


@rows.observe("encoder.max_failures", "model")
def _encoder_max_failures(lab: Lab) -> None:
    """A stalled chip: after one failure in a row the encoder gives up for good (default: 5)."""
    state = {}
    for failures in (5, 1):
        with closing(npu(lab, {"encoder.timeout_ms": 50, "encoder.max_failures": failures})) as encoder:
            lab.fixture("standin").control(latency_ms=STALL_MS)
            with pytest.raises(EncoderFailedError):
                encoder.encode(mel(lab))
            state[failures] = encoder.health().state
            lab.fixture("standin").control()
    assert state == {5: RECOVERING, 1: FAILED}


@rows.observe("encoder.reopen_timeout_s", "model")
def _encoder_reopen_timeout_s(lab: Lab) -> None:
    """A chip gone from the bus: reopened with backoff for up to 8 s (default); 0: no second try."""
    tries = {}
    for seconds in (8.0, 0.0):
        with closing(npu(lab, {"encoder.reopen_timeout_s": seconds})) as encoder:
            lab.fixture("standin").control(lost=True)
            with pytest.raises(EncoderFailedError, match="reopen_timeout_s"):
                encoder.encode(mel(lab))
            tries[seconds] = encoder.health().reopen_failures
            lab.fixture("standin").control()
    assert tries[0.0] == 1 and tries[8.0] > 1, tries


# -- decoder: the engine's transcriptions ---------------------------------------------------------

def text(lab: Lab, keys: dict, audio: np.ndarray) -> str:
    return lab.transcribe(keys, audio).text


@rows.observe("decoder.preset", "model")
def _decoder_preset(lab: Lab) -> None:
    """aggressive: no padding, no penalty, no end-of-text threshold: what encoder_padding 0 gives."""
    preset = lab.transcribe({"decoder.preset": "aggressive"}, SPEECH)
    unpadded, default = lab.transcribe({"decoder.encoder_padding": 0}, SPEECH), lab.transcribe({}, SPEECH)
    assert (preset.text, preset.avg_logprob, preset.no_speech_prob) == (
        unpadded.text, unpadded.avg_logprob, unpadded.no_speech_prob)
    assert preset.no_speech_prob != default.no_speech_prob


@rows.observe("decoder.precision", "model")
def _decoder_precision(lab: Lab) -> None:
    fp32, int8 = lab.transcribe({"decoder.precision": "fp32"}, SPEECH), lab.transcribe({}, SPEECH)
    assert fp32.text == int8.text and fp32.avg_logprob != int8.avg_logprob


@rows.observe("decoder.threads", "model")
def _decoder_threads(lab: Lab) -> None:
    counts = lab.fixture("thread_counts")
    assert counts["decoder 4"] > counts["engine"]


@rows.observe("decoder.spin", "model")
def _decoder_spin(lab: Lab) -> None:
    """The step's pool is asked to spin (the same text: spinning changes only the time)."""
    def spinning(keys: dict) -> str:
        options = lab.engine(keys).sessions.decoder.step_session.get_session_options()
        return options.get_session_config_entry("session.intra_op.allow_spinning")

    assert (spinning({"decoder.spin": True}), spinning({})) == ("1", "0")
    assert lab.transcribe({"decoder.spin": True}, SPEECH).text == lab.transcribe({}, SPEECH).text


@rows.observe("decoder.projection", "model")
def _decoder_projection(lab: Lab) -> None:
    """The greedy steps are taken on shortlists (counted), and the text is the full projection's."""
    engine = lab.engine({"decoder.projection": "shortlist"})
    assert lab.transcribe({"decoder.projection": "shortlist"}, SPEECH).text == lab.transcribe({}, SPEECH).text
    assert engine.sessions.decoder.shortlist.counts.steps > 0
    assert lab.engine({}).sessions.decoder.shortlist is None


@rows.observe("decoder.encoder_padding", "model")
def _decoder_encoder_padding(lab: Lab) -> None:
    """The decoder sees the 2.8 s of audio only, not the window padded with silence: it is surer
    there is speech."""
    unpadded, padded = lab.transcribe({"decoder.encoder_padding": 0}, SPEECH), lab.transcribe({}, SPEECH)
    assert unpadded.no_speech_prob < padded.no_speech_prob


@rows.observe("decoder.repetition_penalty", "model")
def _decoder_repetition_penalty(lab: Lab) -> None:
    plain, penalised = text(lab, {}, REPEATED), text(lab, {"decoder.repetition_penalty": 3.0}, REPEATED)
    words = plain.lower().rstrip(".").split()
    assert words[0] == words[-1] == "lobsters", plain  # said twice, written twice alike
    # the penalty lowers the repeated word's tokens: it is not written twice alike any more
    assert penalised.lower().count("lobsters") < plain.lower().count("lobsters"), penalised


@rows.observe("decoder.eos_threshold", "model")
def _decoder_eos_threshold(lab: Lab) -> None:
    """Without padding the decoder runs on past the speech; a 5 % end-of-text ends it sooner."""
    runs_on = lab.transcribe({"decoder.encoder_padding": 0}, RUNS_ON)
    ends = lab.transcribe({"decoder.encoder_padding": 0, "decoder.eos_threshold": 0.05}, RUNS_ON)
    assert ends.tokens < runs_on.tokens, (ends.tokens, runs_on.tokens)


@rows.observe("decoder.condition_on_previous_text", "model")
def _decoder_condition_on_previous_text(lab: Lab) -> None:
    """The second window, prompted with the first's text, reads otherwise; the first alike."""
    prompted, plain = lab.transcribe({"decoder.condition_on_previous_text": True}, LONG), lab.transcribe({}, LONG)
    assert prompted.windows == plain.windows == 2
    assert prompted.segments[0] == plain.segments[0] and prompted.segments[1:] != plain.segments[1:]


@rows.observe("decoder.max_tokens_per_s", "model")
def _decoder_max_tokens_per_s(lab: Lab) -> None:
    """0.3 tokens a second: 3 in the 10 s window, and the text stops there."""
    capped, default = lab.transcribe({"decoder.max_tokens_per_s": 0.3}, SPEECH), lab.transcribe({}, SPEECH)
    assert (capped.runaway_windows, default.runaway_windows) == (1, 0)
    assert default.text.startswith(capped.text.rstrip(".")) and len(capped.text.split()) == 2, capped.text


@rows.observe("decoder.logprob_threshold", "model")
def _decoder_logprob_threshold(lab: Lab) -> None:
    """Above every window's average: each fails, and is decoded again at the fallback temperatures."""
    strict, default = lab.transcribe({"decoder.logprob_threshold": 0.0}, SPEECH), lab.transcribe({}, SPEECH)
    assert strict.decoder_steps > 3 * default.decoder_steps and strict.text == default.text


@rows.observe("decoder.no_speech_threshold", "model")
def _decoder_no_speech_threshold(lab: Lab) -> None:
    """Noise the model thinks 91 % silence: dropped at 0.6, text at 0.95."""
    audio = noise(2.0)
    assert text(lab, {}, audio) == "" and text(lab, {"decoder.no_speech_threshold": 0.95}, audio) != ""


@rows.observe("decoder.compression_ratio_threshold", "model")
def _decoder_compression_ratio_threshold(lab: Lab) -> None:
    strict, default = lab.transcribe({"decoder.compression_ratio_threshold": 0.5}, SPEECH), lab.transcribe({}, SPEECH)
    assert strict.decoder_steps > 3 * default.decoder_steps


@rows.observe("decoder.on_gate_fail", "model")
def _decoder_on_gate_fail(lab: Lab) -> None:
    """Noise: retry drops what is silence after all; keep keeps it."""
    audio = noise(2.0)
    kept, retried = lab.transcribe({"decoder.on_gate_fail": "keep"}, audio), lab.transcribe({}, audio)
    assert retried.text == "" and retried.dropped_windows == 1 and kept.text and kept.dropped_windows == 0
    assert kept.doubtful_windows == 1 and retried.doubtful_windows == 0


@rows.observe("decoder.fallback_temperature_step", "model")
def _decoder_fallback_temperature_step(lab: Lab) -> None:
    """A window that fails every attempt: at 0, 1.0 (two attempts) instead of 0, 0.2 ... 1.0 (six)."""
    failing = {"decoder.logprob_threshold": 0.0}
    six = lab.transcribe(failing, SPEECH)
    two = lab.transcribe({**failing, "decoder.fallback_temperature_step": 1.0}, SPEECH)
    assert two.decoder_steps < six.decoder_steps / 2


@rows.observe("decoder.beam_size", "model")
def _decoder_beam_size(lab: Lab) -> None:
    """Beam search finds a likelier text than greedy decoding."""
    beam, greedy = lab.transcribe({"decoder.beam_size": 3}, SHORT), lab.transcribe({}, SHORT)
    assert beam.text != greedy.text and beam.avg_logprob > greedy.avg_logprob


@rows.observe("decoder.drop_unspoken_words", "model")
def _decoder_drop_unspoken_words(lab: Lab) -> None:
    """A phrase said twice: kept twice when the audio under it is judged, cut as a loop if not."""
    judged, cut = text(lab, {}, TWICE), text(lab, {"decoder.drop_unspoken_words": False}, TWICE)
    assert len(judged.split()) == 2 * len(cut.split()), (judged, cut)
