"""SIGHUP, in process: the daemon gets its collaborators from outside, so fakes do here."""

from __future__ import annotations

import logging
import types
from pathlib import Path

from edgeasr.asr.decoding import DecodingOptions
from edgeasr.asr.engine import EngineOptions
from edgeasr.config import load_config
from edgeasr.daemon import Daemon, Outputs
from edgeasr.home.source import VocabularySource


class Engine:
    """What a reload asks of the engine: its options and bundle, a variant with other options,
    and the command reading prepared for a vocabulary (recorded, for every variant alike)."""

    def __init__(self, options: EngineOptions, prepared: list | None = None) -> None:
        self.options = options
        self.bundle = types.SimpleNamespace(decoding={}, multilingual=False)  # an uncalibrated English bundle
        self.prepared = prepared if prepared is not None else []

    def variant(self, options: EngineOptions) -> Engine:
        return Engine(options, self.prepared)

    def prepare(self, vocabulary, language: str) -> bool:
        self.prepared.append((tuple(n.name for n in vocabulary.names), language))
        return True


def daemon_for(path: Path, capture: bool = True) -> Daemon:
    cfg = load_config(path)
    engine = Engine(EngineOptions(DecodingOptions()))
    worker = types.SimpleNamespace(engine=engine)
    pipeline = types.SimpleNamespace(log_transcripts=cfg.log.transcripts) if capture else None
    return Daemon(cfg, engine=engine, worker=worker, pipeline=pipeline, server=None, outputs=Outputs([]),
                  notifier=None, progress=None, model="m", backend="onnx",
                  vocabulary=VocabularySource.from_config(cfg), reload_config=lambda: load_config(path))


def reload(daemon: Daemon, caplog) -> list[str]:
    caplog.clear()
    daemon.reload()
    return [r.getMessage() for r in caplog.records if r.name == "edgeasr.daemon"]


def test_reload_compares_with_what_runs(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="edgeasr.daemon")
    path = tmp_path / "edgeasr.yaml"
    path.write_text("decoder:\n  preset: balanced\n  threads: 2\nlog:\n  transcripts: false\n")
    daemon = daemon_for(path)
    try:
        path.write_text("decoder:\n  preset: conservative\n  threads: 1\nlog:\n  transcripts: true\n")
        assert reload(daemon, caplog) == ["SIGHUP: applied log.transcripts, decoder.preset",
                                          "SIGHUP: restart to apply decoder.threads"]
        assert daemon.cfg.decoder.preset == "conservative" and daemon.cfg.decoder.threads == 2
        assert daemon.engine.options.decoding.repetition_penalty == 1.3 and daemon.pipeline.log_transcripts
        assert daemon.worker.engine is daemon.engine  # the worker's next job runs on the new engine
        # the same file again: nothing new applies, the restart is still owed
        assert reload(daemon, caplog) == ["SIGHUP: applied nothing new",
                                          "SIGHUP: restart to apply decoder.threads"]
        # back to the start: the revert applies, and no restart is owed any more
        path.write_text("decoder:\n  preset: balanced\n  threads: 2\nlog:\n  transcripts: false\n")
        assert reload(daemon, caplog) == ["SIGHUP: applied log.transcripts, decoder.preset"]
        assert daemon.engine.options.decoding.repetition_penalty == 1.1 and not daemon.pipeline.log_transcripts
    finally:
        logging.getLogger().setLevel(logging.WARNING)


def test_a_broken_file_keeps_the_running_configuration(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="edgeasr.daemon")
    path = tmp_path / "edgeasr.yaml"
    path.write_text("decoder:\n  preset: aggressive\n")
    daemon = daemon_for(path)
    path.write_text("decoder:\n  preset: [not, a, preset]\n")
    messages = reload(daemon, caplog)
    assert len(messages) == 1 and messages[0].startswith("SIGHUP: keeping the running configuration: decoder.preset")
    assert daemon.cfg.decoder.preset == "aggressive"


def test_a_daemon_without_local_audio_reloads(tmp_path, caplog):
    """input.source: none (Wyoming only) builds no pipeline: a reload must not need one."""
    caplog.set_level(logging.INFO, logger="edgeasr.daemon")
    path = tmp_path / "edgeasr.yaml"
    path.write_text("decoder:\n  preset: balanced\n")
    daemon = daemon_for(path, capture=False)
    try:
        path.write_text("decoder:\n  preset: conservative\nlog:\n  transcripts: true\n")
        assert reload(daemon, caplog) == ["SIGHUP: applied log.transcripts, decoder.preset"]
        assert daemon.engine.options.decoding.repetition_penalty == 1.3 and daemon.cfg.log.transcripts
    finally:
        logging.getLogger().setLevel(logging.WARNING)


def test_reload_reads_the_home_file_again(tmp_path, caplog):
    """The home's names are live: SIGHUP reads the home file again, even when no key changed;
    a broken file keeps the running names, with one line saying why."""
    caplog.set_level(logging.INFO, logger="edgeasr.daemon")
    home = tmp_path / "home.yaml"
    home.write_text("areas: [Kitchen]\n")
    config = tmp_path / "edgeasr.yaml"
    config.write_text(f"vocabulary:\n  home: {home}\n")
    daemon = daemon_for(config)
    assert [n.name for n in daemon.vocabulary.current().names] == ["Kitchen"]
    home.write_text("areas: [Kitchen, Attic]\n")
    reload(daemon, caplog)
    assert [n.name for n in daemon.vocabulary.current().names] == ["Kitchen", "Attic"]
    home.write_text("areas: [{aliases: [x]}]\n")
    lines = reload(daemon, caplog)
    assert [n.name for n in daemon.vocabulary.current().names] == ["Kitchen", "Attic"]
    assert any("keeping the running vocabulary" in line and str(home) in line for line in lines), lines


def test_the_command_reading_is_prepared_once_for_each_new_vocabulary(tmp_path):
    """Whenever the vocabulary changes (the start, SIGHUP, Home Assistant's names), the engine
    builds the reading's graph for it on a thread of its own (Transcriber.prepare), once."""
    home = tmp_path / "home.yaml"
    home.write_text("areas: [Kitchen]\n")
    config = tmp_path / "edgeasr.yaml"
    config.write_text(f"vocabulary:\n  home: {home}\n")
    daemon = daemon_for(config)
    for _ in range(2):  # the same vocabulary twice: prepared once
        daemon._prepare_reading()
        daemon._preparing.join(10)
    home.write_text("areas: [Kitchen, Attic]\n")
    daemon.vocabulary.reload(daemon.cfg.vocabulary)
    daemon._prepare_reading()
    daemon._preparing.join(10)
    assert daemon.engine.prepared == [(("Kitchen",), "en"), (("Kitchen", "Attic"), "en")]
