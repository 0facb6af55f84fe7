"""`edgeasr [--config FILE]`: build the pipeline from the configuration and run it under systemd.

SIGTERM/SIGINT: stop capture, finish the segment in progress and the queue within
pipeline.stop_deadline_s, publish `offline`, exit 0. SIGHUP: reload the config file;
log.level, log.transcripts and the decoder's preset, penalty, EOS threshold and gate
thresholds apply live, every other key needs a restart (the log says which changed).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import threading
from pathlib import Path

from edgeasr import __version__

log = logging.getLogger(__name__)

LIVE_KEYS = ("log.level", "log.transcripts", "decoder.preset", "decoder.repetition_penalty",
             "decoder.eos_threshold", "decoder.logprob_threshold", "decoder.no_speech_threshold",
             "decoder.compression_ratio_threshold", "decoder.on_gate_fail", "decoder.max_tokens_per_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None, metavar="FILE",
                        help="YAML configuration (default: built-in defaults)")
    parser.add_argument("--input", default=None, metavar="FILE",
                        help="transcribe this audio file instead of the microphone ('-': raw "
                        "s16le 16 kHz on stdin); same as input.source=file, input.path=FILE")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set vad.aggressiveness=3 (repeatable)")


def overrides_from_args(args: argparse.Namespace) -> dict:
    import yaml

    from edgeasr.errors import UsageError

    out: dict = {}
    if args.input == "-":
        out["input.source"] = "stdin"
    elif args.input:
        out.update({"input.source": "file", "input.path": args.input})
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--set {item}: expected KEY=VALUE")
        out[key.strip()] = yaml.safe_load(value)
    return out


def engine_settings(cfg):
    from edgeasr.engine import EngineSettings

    e, d, m = cfg.encoder, cfg.decoder, cfg.model
    return EngineSettings(
        backend=e.backend, encoder_precision=e.precision, encoder_threads=e.threads, hef=e.hef,
        hailo_timeout_ms=e.timeout_ms, hailo_scheduler=e.scheduler, hailo_service_group=e.service_group,
        decoder_precision=d.precision, decoder_threads=d.threads, preset=d.preset,
        language=m.language, task=m.task, encoder_padding=d.encoder_padding,
        repetition_penalty=d.repetition_penalty, eos_threshold=d.eos_threshold,
        max_tokens_per_s=d.max_tokens_per_s, logprob_threshold=d.logprob_threshold,
        no_speech_threshold=d.no_speech_threshold,
        compression_ratio_threshold=d.compression_ratio_threshold, on_gate_fail=d.on_gate_fail)


def open_source(cfg):
    i = cfg.input
    if i.source == "file":
        from edgeasr.sources import FileSource

        return FileSource(i.path, i.realtime, i.block_ms)
    if i.source == "stdin":
        from edgeasr.sources import StdinSource

        return StdinSource(sys.stdin.buffer, i.block_ms)
    from edgeasr.capture import MicSource

    return MicSource(i.device, i.samplerate, i.block_ms, i.ring_s)


def window_s(cfg, bundle) -> float:
    from edgeasr.errors import ConfigError

    limit = bundle.audio.window_s
    if cfg.vad.max_window_s is not None and cfg.vad.max_window_s > limit:
        raise ConfigError(f"vad.max_window_s: {cfg.vad.max_window_s} is not allowed "
                          f"(at most the model's {limit:g} s window)")
    return cfg.vad.max_window_s or limit


def setup_logging(cfg, level_override: str | None) -> None:
    from edgeasr.notify import journal_handler

    handler = journal_handler() or logging.StreamHandler(sys.stderr)
    if isinstance(handler, logging.StreamHandler):
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level_override or cfg.log.level)


def main(args: argparse.Namespace) -> int:
    from edgeasr.config import load_config

    cfg = load_config(args.config, overrides_from_args(args))
    setup_logging(cfg, args.log_level)
    return Daemon(cfg, args).run()


class Daemon:
    """Builds the collaborators, runs the pipeline, handles signals and the service manager."""

    def __init__(self, cfg, args: argparse.Namespace) -> None:
        self.cfg, self.args = cfg, args
        self._reload = threading.Event()

    def run(self) -> int:
        from edgeasr.engine import build_transcriber, open_bundle
        from edgeasr.notify import Progress, SystemdNotifier, Watchdog
        from edgeasr.pipeline import Pipeline, PipelineOptions
        from edgeasr.segmenter import Segmenter
        from edgeasr.sources import StreamClock

        cfg = self.cfg
        notifier = SystemdNotifier()
        notifier.status("loading the model")
        bundle = open_bundle(cfg.model.path, cache_dir=cfg.state_dir / "models")
        engine = build_transcriber(bundle, engine_settings(cfg), cfg.vad)
        self.engine = engine
        backend = engine.encoder.backend
        source = open_source(cfg)
        segmenter = Segmenter(cfg.vad, window_s(cfg, bundle), StreamClock())
        progress = Progress("capture", "worker")
        publishers, mqtt = self._publishers(bundle.name, backend)
        live = cfg.input.source == "mic" or (cfg.input.source == "file" and cfg.input.realtime)
        options = PipelineOptions(device_id=cfg.device_id, model=bundle.name, backend=backend,
                                  queue_s=cfg.pipeline.queue_s, stop_deadline_s=cfg.pipeline.stop_deadline_s,
                                  live=live, log_transcripts=cfg.log.transcripts)

        def report_error(error: str, context: str) -> None:
            if mqtt is not None:
                mqtt.publish_error(error, context)

        pipeline = Pipeline(source, segmenter, engine, publishers, options, progress=progress.mark,
                            status=lambda text: notifier.status(self._status(text, source, mqtt)),
                            report_error=report_error)
        self.pipeline = pipeline
        if mqtt is not None:
            mqtt.metrics = pipeline.metrics  # the publisher sends these every metrics_interval_s
        self._install_signals(pipeline)
        watchdog = Watchdog(notifier, progress)
        runner = threading.Thread(target=pipeline.run, name="edgeasr-capture")
        runner.start()
        log.info("edgeasr %s: model %s on %s, input %s", __version__, bundle.name, backend, cfg.input.source)
        while runner.is_alive() and not pipeline.wait_for_audio(0.5):
            pass
        notifier.ready(self._status("listening", source, mqtt))
        watchdog.start()
        while runner.is_alive():
            runner.join(0.5)
            if self._reload.is_set():
                self._reload.clear()
                self._apply_reload()
        watchdog.stop()  # first: no ping may follow STOPPING=1
        notifier.stopping()
        for publisher in publishers:
            publisher.close(cfg.pipeline.stop_deadline_s)
        if self.outbox is not None:
            self.outbox.close()
        source.close()
        log.info("stopped: %d transcripts from %d segments (%d dropped)", pipeline.stats.transcripts,
                 pipeline.stats.segments, pipeline.queue.dropped)
        return 0

    def _publishers(self, model: str, backend: str):
        cfg = self.cfg
        publishers, mqtt, self.outbox = [], None, None
        if cfg.mqtt.host:
            from edgeasr.mqtt import MqttPublisher
            from edgeasr.outbox import Outbox

            outbox = self.outbox = Outbox.in_state_dir(cfg.state_dir, cfg.mqtt.outbox_max)
            mqtt = MqttPublisher(cfg.mqtt, device_id=cfg.device_id, outbox=outbox, version=__version__,
                                 model=model, backend=backend).start()
            publishers.append(mqtt)
        stdout = cfg.output.stdout if cfg.output.stdout is not None else not cfg.mqtt.host
        if stdout:
            from edgeasr.payload import StdoutPublisher

            publishers.append(StdoutPublisher())
        return publishers, mqtt

    @staticmethod
    def _status(text: str, source, mqtt) -> str:
        parts = [text]
        source_status = getattr(source, "status", "")
        if "lost" in source_status:
            parts.append(source_status)
        if mqtt is not None and not mqtt.connected:
            parts.append("broker down (transcripts kept in the outbox)")
        return "; ".join(parts)

    def _install_signals(self, pipeline) -> None:
        def stop(signum, frame) -> None:
            log.info("%s: finishing the current speech and the queue", signal.Signals(signum).name)
            pipeline.request_stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, lambda signum, frame: self._reload.set())

    def _apply_reload(self) -> None:
        from edgeasr.config import as_dict, load_config
        from edgeasr.decoding import preset_options
        from edgeasr.errors import EdgeAsrError
        from edgeasr.gates import default_gates

        try:
            new = load_config(self.args.config, overrides_from_args(self.args))
        except EdgeAsrError as exc:
            log.error("SIGHUP: keeping the running configuration: %s", exc)
            return
        old_flat, new_flat = _flatten(as_dict(self.cfg)), _flatten(as_dict(new))
        changed = sorted(k for k in new_flat if new_flat[k] != old_flat.get(k))
        restart = [k for k in changed if k not in LIVE_KEYS]
        logging.getLogger().setLevel(self.args.log_level or new.log.level)
        d = new.decoder
        self.engine.options = preset_options(
            d.preset, language=new.model.language, task=new.model.task, encoder_padding=d.encoder_padding,
            repetition_penalty=d.repetition_penalty, eos_threshold=d.eos_threshold,
            max_tokens_per_s=d.max_tokens_per_s)
        self.engine.gates = default_gates(d.logprob_threshold, d.no_speech_threshold,
                                          d.compression_ratio_threshold)
        self.engine.on_gate_fail = d.on_gate_fail
        self.pipeline.options = dataclasses.replace(self.pipeline.options,
                                                    log_transcripts=new.log.transcripts)
        log.info("SIGHUP: applied %s", ", ".join(k for k in changed if k in LIVE_KEYS) or "nothing new")
        if restart:
            log.warning("SIGHUP: restart to apply %s", ", ".join(restart))


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
