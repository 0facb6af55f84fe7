"""The daemon: `build(cfg, bundle)` wires every collaborator from the configuration; `Daemon`
runs them under systemd.

This is the composition root, the one place that knows the concrete classes of every stage
(audio in, the engine, publishers out, the service manager). `Daemon` itself receives them
built, so a test can run it in process with fakes.

SIGTERM/SIGINT: stop capture, finish the segment in progress and the queue within
pipeline.stop_deadline_s, publish `offline`, exit 0. SIGHUP: reload the config file; the
keys the config marks `live` (config.live_keys) apply at once, every other change needs a
restart (the log names them).
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edgeasr import __version__
from edgeasr.bundle import Bundle
from edgeasr.config import Config
from edgeasr.config_warnings import Facts
from edgeasr.errors import ConfigError, EdgeAsrError
from edgeasr.reload import changed_keys, live_keys, with_live
from edgeasr.stages import AudioSource, Notifier, Publisher

if TYPE_CHECKING:  # built in build() and its helpers, imported there when needed
    from edgeasr.asr.supervision import DeviceHealth
    from edgeasr.asr.transcriber import Transcriber
    from edgeasr.home.source import VocabularySource
    from edgeasr.notify import Progress
    from edgeasr.output.mqtt import MqttPublisher
    from edgeasr.output.outbox import Outbox
    from edgeasr.pipeline import Pipeline
    from edgeasr.stages import Vocabulary
    from edgeasr.worker import Worker
    from edgeasr.wyoming.server import WyomingServer

log = logging.getLogger(__name__)


def window_s(cfg: Config, bundle: Bundle) -> float:
    """The longest speech window: vad.max_window_s, at most the model's window."""
    limit = bundle.audio.window_s
    if cfg.vad.max_window_s is not None and cfg.vad.max_window_s > limit:
        raise ConfigError(f"vad.max_window_s: {cfg.vad.max_window_s} is not allowed "
                          f"(at most the model's {limit:g} s window)")
    return cfg.vad.max_window_s or limit


def bundle_facts(cfg: Config, bundle: Bundle | None) -> Facts:
    """What the configuration meets here: this machine's cores and the model bundle's window and
    languages (None: no bundle to read)."""
    if bundle is None:
        return Facts.here()
    try:
        window: float | None = window_s(cfg, bundle)
    except ConfigError:  # vad.max_window_s beyond the model's window: an error of its own
        window = None
    return Facts.here(window, bundle.multilingual)


def open_source(cfg: Config) -> AudioSource:
    i = cfg.input
    if i.source == "file":
        from edgeasr.audio.sources import FileSource

        assert i.path is not None  # load_config requires it for a file source
        return FileSource(i.path, i.realtime, i.block_ms)
    if i.source == "stdin":
        from edgeasr.audio.sources import StdinSource

        return StdinSource(sys.stdin.buffer, i.block_ms)
    from edgeasr.audio.capture import MicSource

    return MicSource(i.device, i.samplerate, i.block_ms, i.ring_s)


@dataclass
class Outputs:
    """Where transcripts go: the publishers, and the MQTT side when there is a broker."""

    publishers: list[Publisher]
    mqtt: MqttPublisher | None = None
    outbox: Outbox | None = None

    def report_error(self, error: str, context: str, resolved: bool = False) -> None:
        if self.mqtt is not None:
            self.mqtt.publish_error(error, context, resolved=resolved)

    def close(self, timeout_s: float) -> None:
        for publisher in self.publishers:
            publisher.close(timeout_s)
        if self.outbox is not None:
            self.outbox.close()


def build_outputs(cfg: Config, model: str, backend: str) -> Outputs:
    outputs = Outputs([])
    if cfg.mqtt.host:
        from edgeasr.output.mqtt import MqttPublisher
        from edgeasr.output.outbox import Outbox

        outputs.outbox = Outbox.in_state_dir(cfg.state_dir, cfg.mqtt.outbox_max)
        outputs.mqtt = MqttPublisher(cfg.mqtt, device_id=cfg.device_id, outbox=outputs.outbox,
                                     version=__version__, model=model, backend=backend, intent=cfg.output.intent)
        outputs.publishers.append(outputs.mqtt)
    stdout = cfg.output.stdout if cfg.output.stdout is not None else not cfg.mqtt.host
    if stdout:
        from edgeasr.output.payload import StdoutPublisher

        outputs.publishers.append(StdoutPublisher(device_id=cfg.device_id, model=model, backend=backend,
                                                  intent=cfg.output.intent))
    return outputs


def languages(bundle: Bundle) -> list[str]:
    """What the model can transcribe: English for .en bundles, else every language it knows."""
    return sorted(bundle.tokens.languages) if bundle.multilingual else ["en"]


def engine_for(cfg: Config, bundle: Bundle, words: bool = False) -> Transcriber:
    """The engine as the daemon hears with it: the configured decoding, the segmenter's pause
    rule for long audio, and the home's sentences where they are installed. `edgeasr
    transcribe` and `bench-commands` build theirs here too, so that they hear as it does."""
    from edgeasr.asr.transcriber import build_engine
    from edgeasr.audio.vad import SpeechJudge
    from edgeasr.home.sentences import sentences_for_engine

    return build_engine(bundle, cfg.model, cfg.encoder, cfg.decoder, SpeechJudge(cfg.vad), words=words,
                        sentences=sentences_for_engine(cfg))


def build_pipeline(cfg: Config, bundle: Bundle, worker: Worker, outputs: Outputs,
                   progress: Callable[[str], None] = lambda stage: None,
                   vocabulary: Callable[[], Vocabulary] | None = None) -> Pipeline:
    """The front end of input.source (a microphone, a file, stdin) on `worker`, publishing to
    `outputs`: live (partial results, speculation, the oldest speech dropped when behind) for
    a microphone or a file read at real time."""
    from edgeasr.audio.clock import StreamClock
    from edgeasr.audio.segmenter import Segmenter
    from edgeasr.pipeline import Pipeline
    from edgeasr.stages import Vocabulary

    live = cfg.input.source == "mic" or (cfg.input.source == "file" and cfg.input.realtime)
    return Pipeline(open_source(cfg), Segmenter(cfg.vad, window_s(cfg, bundle), StreamClock()), worker,
                    outputs.publishers, cfg.pipeline, live=live, log_transcripts=cfg.log.transcripts,
                    progress=progress, report_error=outputs.report_error, vocabulary=vocabulary or Vocabulary)


def build(cfg: Config, bundle: Bundle) -> Daemon:
    """Every collaborator of the daemon, built from the configuration."""
    from edgeasr.home.source import VocabularySource
    from edgeasr.notify import Progress, SystemdNotifier
    from edgeasr.worker import Worker

    notifier = SystemdNotifier()
    notifier.status("loading the model")
    vocabulary = VocabularySource.from_config(cfg)  # a bad home file fails here, before READY
    engine = engine_for(cfg, bundle, words=cfg.output.words)
    backend = engine.encoder.backend
    outputs = build_outputs(cfg, bundle.name, backend)
    capture = cfg.input.source != "none"
    progress = Progress(*(["capture"] if capture else []), "worker", *(["wyoming"] if cfg.wyoming.uri else []))
    worker = Worker(engine, progress=lambda: progress.mark("worker"))
    pipeline = None
    if capture:
        pipeline = build_pipeline(cfg, bundle, worker, outputs, progress.mark, vocabulary.current)
    server = None
    if cfg.wyoming.uri:
        server = build_wyoming(cfg, bundle, worker, lambda: progress.mark("wyoming"), vocabulary.current)
    if outputs.mqtt is not None:  # the publisher sends these every mqtt.metrics_interval_s
        outputs.mqtt.metrics = lambda: metrics(engine, worker, pipeline, server)
    return Daemon(cfg, engine=engine, worker=worker, pipeline=pipeline, server=server, outputs=outputs,
                  notifier=notifier, progress=progress, model=bundle.name, backend=backend, vocabulary=vocabulary)


def prepare_reading(engine: Transcriber, vocabulary: Vocabulary, language: str) -> None:
    """Transcriber.prepare, timed; where it cannot be done, the first command does it and says why."""
    t0 = time.monotonic()
    try:
        if engine.prepare(vocabulary, language):
            log.info("the home's sentences (%s) ready for commands in %.1f s", language, time.monotonic() - t0)
    except EdgeAsrError as exc:
        log.warning("the home's sentences were not built ahead (the first command builds them): %s", exc)


def metrics(engine: Transcriber, worker: Worker, pipeline: Pipeline | None, server: WyomingServer | None) -> dict:
    """The /metrics message's counters: every front end's, the worker's and the device's."""
    from edgeasr.asr.supervision import encoder_health

    out = pipeline.metrics() if pipeline is not None else {}
    out["worker"] = dataclasses.asdict(worker.stats)
    out["encoder"] = dataclasses.asdict(encoder_health(engine.encoder))
    if server is not None:
        out["wyoming"] = server.metrics()
    return out


def build_wyoming(cfg: Config, bundle: Bundle, worker: Worker, progress: Callable[[], None],
                  vocabulary: Callable[[], Vocabulary]) -> WyomingServer:
    try:
        from edgeasr.wyoming.connection import Service
        from edgeasr.wyoming.server import WyomingServer
        from edgeasr.wyoming.session import SessionOptions
    except ImportError as exc:
        from edgeasr.errors import ToolMissingError

        raise ToolMissingError(f"wyoming.uri is set but the Wyoming server cannot load ({exc}): "
                               "pip install 'wyoming>=1.10,<1.11' zeroconf") from exc
    from edgeasr.audio.vad import make_detector

    service = Service(model=bundle.name, languages=languages(bundle), version=__version__)
    session = SessionOptions(window_s=bundle.audio.window_s, max_audio_s=cfg.wyoming.max_audio_s,
                             partial_interval_ms=cfg.pipeline.partial_interval_ms,
                             speculate_after_ms=cfg.pipeline.speculate_after_ms, frame_ms=cfg.vad.frame_ms,
                             endpoint_ms=cfg.wyoming.endpoint_ms, min_speech_ms=cfg.vad.min_speech_ms)
    return WyomingServer(cfg.wyoming, worker, service, session,
                         lambda: make_detector(cfg.vad), progress=progress, vocabulary=vocabulary)


class Liveness:
    """What the watchdog asks: every stage made progress, and the encoder device has not
    failed for good (a failed device's windows fail at once, which would count as progress)."""

    def __init__(self, progress: Progress, engine: Transcriber) -> None:
        self.progress, self.engine = progress, engine
        self.stalled: tuple[str, ...] = ()

    def __call__(self) -> bool:
        from edgeasr.asr.supervision import encoder_health

        moving = self.progress()
        self.stalled = self.progress.stalled
        if encoder_health(self.engine.encoder).failed:
            self.stalled += ("the encoder device (failed)",)
            return False
        return moving


@dataclass
class Daemon:
    """Runs the worker and the front ends, handles signals and talks to the service manager."""

    cfg: Config
    engine: Transcriber
    worker: Worker
    pipeline: Pipeline | None  # None without local capture (input.source: none)
    server: WyomingServer | None  # None without wyoming.uri
    outputs: Outputs
    notifier: Notifier
    progress: Progress
    model: str
    backend: str
    vocabulary: VocabularySource  # the home's names: the config's and Home Assistant's
    # re-reads the config file on SIGHUP (None: reloading is not possible)
    reload_config: Callable[[], Config] | None = None
    _reload: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _health: DeviceHealth | None = None  # the encoder device's health, as last seen
    _failure: EdgeAsrError | None = None  # why the daemon stops on its own
    _activity: str = "listening"  # what the front end says it does
    _sent_status: str = ""
    _prepared: Vocabulary | None = None  # the vocabulary the command reading was last prepared for
    _preparing: threading.Thread | None = None

    def run(self) -> int:
        from edgeasr.notify import Watchdog

        pipeline, notifier = self.pipeline, self.notifier
        self._install_signals()
        watchdog = Watchdog(notifier, Liveness(self.progress, self.engine))
        if self.outputs.mqtt is not None:
            self.outputs.mqtt.start()
        self.worker.start()
        if self.server is not None:
            self.server.start()
        runner = None
        if pipeline is not None:
            pipeline.status = self._set_activity
            runner = threading.Thread(target=pipeline.run, name="edgeasr-capture")
            runner.start()
        self._prepare_reading()
        log.info("edgeasr %s: model %s on %s, input %s%s", __version__, self.model, self.backend,
                 self.cfg.input.source, f", Wyoming on {self.cfg.wyoming.uri}" if self.server else "")
        if pipeline is not None and runner is not None:  # READY once audio arrives (or the input ended)
            while runner.is_alive() and not pipeline.wait_for_audio(0.5):
                pass
        self._sent_status = self._status()
        notifier.ready(self._sent_status)
        watchdog.start()
        while (runner.is_alive() if runner is not None else not self._stop.is_set()):
            if runner is not None:
                runner.join(0.5)
            else:
                self._stop.wait(0.5)
            if self._reload.is_set():
                self._reload.clear()
                self.reload()
            self._watch_device()
            self._refresh_status()
            self._prepare_reading()
        deadline = self.cfg.pipeline.stop_deadline_s
        if self.server is not None:
            self.server.stop()
        # a signal bounds the wait for what is queued; an input that ended is finished whole
        if not self.worker.stop(deadline if self._stop.is_set() else None):
            log.warning("stop deadline (%.0f s) passed with speech still queued", deadline)
        self._watch_device()  # the last segments may have been what broke it
        self.vocabulary.close()
        watchdog.stop()  # first: no ping may follow STOPPING=1
        notifier.stopping()
        self.outputs.close(deadline)
        if pipeline is not None:
            pipeline.source.close()
            stats = pipeline.stats
            log.info("stopped: %d transcripts from %d segments decoded, %d failed, %d dropped (inference behind)",
                     stats.transcripts, stats.segments, stats.failures, pipeline.lane.dropped)
            if pipeline.error is not None:
                raise pipeline.error  # after everything read was transcribed and delivered
        if self._failure is not None:
            raise self._failure
        return 0

    def _prepare_reading(self) -> None:
        """Whenever the vocabulary changed (the start, SIGHUP, Home Assistant's names), build the
        command reading's graph for it on a thread of its own, so that the next command does not
        wait for it (Transcriber.prepare); one at a time."""
        vocabulary = self.vocabulary.current()
        if vocabulary == self._prepared or (self._preparing is not None and self._preparing.is_alive()):
            return
        self._prepared = vocabulary
        language = self.cfg.model.language or vocabulary.language or (None if self.engine.bundle.multilingual else "en")
        if vocabulary.names and language is not None:
            self._preparing = threading.Thread(target=prepare_reading, args=(self.engine, vocabulary, language),
                                               name="edgeasr-prepare", daemon=True)
            self._preparing.start()

    def _watch_device(self) -> None:
        """Report the encoder device's changes (STATUS, /error); a device failed for good
        stops the daemon (exit 69), and the watchdog has stopped pinging already."""
        from edgeasr.asr.supervision import encoder_health

        health = encoder_health(self.engine.encoder)
        previous, self._health = self._health, health
        if previous is None:
            return
        # a stall the device recovered from between two looks shows only in the count
        missed = health.state == previous.state == "ok" and health.failures > previous.failures
        if health.state == previous.state and not missed:
            return
        if health.state == "ok":
            log.info("the encoder device works again (%d reopened)", health.reopens)
            self.outputs.report_error(f"encoder device ok again ({health.failures} failed encodes in all, "
                                      f"{health.reopens} reopens)", health.last_error or "", resolved=True)
        else:
            log.warning("the encoder device is %s: %s", health.state, health.last_error)
            self.outputs.report_error(f"encoder device {health.state}", health.last_error or "")
        self._refresh_status()
        if health.failed:
            from edgeasr.errors import DeviceError

            self._failure = DeviceError(f"the encoder device failed for good ({health.last_error}); "
                                        "restart the service (systemd does, Restart=on-failure)")
            self._stop.set()
            if self.pipeline is not None:
                self.pipeline.request_stop()

    def _set_activity(self, text: str) -> None:
        self._activity = text
        self._refresh_status()

    def _refresh_status(self) -> None:
        """systemd's STATUS=, sent when it changes (the front end's activity, the device, the
        broker and the outbox's storage)."""
        text = self._status()
        if text != self._sent_status:
            self._sent_status = text
            self.notifier.status(text)

    def _status(self) -> str:
        parts = [self._activity]
        health = self._health
        if health is not None and health.state != "ok":
            parts.append(f"NPU {health.state} ({health.failures} failures: {health.last_error})")
        if self.pipeline is not None:
            source_status = getattr(self.pipeline.source, "status", "")
            if "lost" in source_status:
                parts.append(source_status)
        mqtt = self.outputs.mqtt
        if mqtt is not None and (summary := mqtt.health().summary()):
            parts.append(summary)
        return "; ".join(parts)

    def _install_signals(self) -> None:
        def stop(signum: int, frame: object) -> None:
            log.info("%s: finishing the current speech and the queue", signal.Signals(signum).name)
            self._stop.set()
            if self.pipeline is not None:
                self.pipeline.request_stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, lambda signum, frame: self._reload.set())
    def reload(self) -> None:
        """SIGHUP: apply the live keys of the file as it is now, compared with what runs."""
        from edgeasr.asr.transcriber import reconfigured

        if self.reload_config is None:
            log.warning("SIGHUP: no configuration file to reload")
            return
        try:
            new = self.reload_config()
        except EdgeAsrError as exc:
            log.error("SIGHUP: keeping the running configuration: %s", exc)
            return
        changed = changed_keys(self.cfg, new)
        live = set(live_keys())
        self.cfg = with_live(self.cfg, new)
        logging.getLogger().setLevel(self.cfg.log.level)
        # a new engine on the same sessions: the worker's next job runs on it
        self.engine = self.worker.engine = reconfigured(self.engine, self.cfg.model, self.cfg.decoder)
        try:  # the home file may have changed though no key did
            self.vocabulary.reload(self.cfg.vocabulary)
        except EdgeAsrError as exc:
            log.error("SIGHUP: keeping the running vocabulary: %s", exc)
        if self.pipeline is not None:  # none when only Wyoming listens (input.source: none)
            self.pipeline.log_transcripts = self.cfg.log.transcripts
        applied = [k for k in changed if k in live]
        restart = [k for k in changed if k not in live]
        log.info("SIGHUP: applied %s", ", ".join(applied) or "nothing new")
        if restart:
            log.warning("SIGHUP: restart to apply %s", ", ".join(restart))
