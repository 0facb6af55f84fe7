"""What the tests share: every function, class and constant more than one test file uses, one
contract each. The fixtures are in tests/conftest.py, and in the helper modules it loads as
plugins (broker, hailo, notify, wyoming); a test module imports from here, never from another
test module.

- audio: the recordings of ../shared/eval by id (`dev_clip`), `read_wav`, `as_float`, the long-form
  streams' utterances (`stream_rows`), SHORT and LONG (the two dev utterances the Wyoming tests
  send).
- text: `normalize` (Whisper's English normalizer) and `wer`, as the benchmarks score.
- engines: `make_engine`, the engine as the daemon builds it, in process.
- ports: `free_port`, a loopback port below the ephemeral range.
- waiting: `wait_until`, for state with no event to wait on (raises on timeout).
- daemon: the daemon and the CLI in subprocesses (`run_edgeasr`, `write_config`, `start_daemon`,
  `finish`, `Running`: its transcripts read as they are printed).
- wyoming: the daemon as a Wyoming server (`start_server`, `stop_server`, fixture
  `wyoming_daemon`) and a client as Home Assistant's (`transcribe` -> `Reply`); `verdicts`.
- broker: real Mosquitto brokers (fixtures `mosquitto`, `mosquitto_tls`, `subscribe`).
- mqtt: MqttPublisher as the daemon builds it against them (`make_publisher`, `sample_draft`,
  `wait_seqs`).
- payload: the shipped JSON Schema as a validator, and a made-up transcript.
- alsa: a virtual ALSA microphone fed at real time (`VirtualMics`) and child processes.
- hailo: the HailoRT stand-in (fixtures `standin`, `hailo_bundle`) and `FakeTime`.
- notify: a NOTIFY_SOCKET as systemd's (`NotifySocket`, fixture `notify_socket`).
- systemd: the unit's settings and its system call filter (`SyscallSandbox`).
- small_disk: a disk that really fills (`small_tmpfs`) and SQLite's own size limit (`cap_pages`).
- homeassistant: a loopback server speaking Home Assistant's websocket API (`FakeHomeAssistant`).
- assist, supervisor, supervisor_standin, supervisor_rules: a real Home Assistant core judging
  commands, and the Supervisor as the add-on meets it.
- voices: commands said by piper and espeak-ng (`said`).
- ct2_reference: CTranslate2's Whisper, the graphs' independent reference, and the inputs both
  are given (`mel_of`, `prompt_of`).
- import_graph: edgeasr's modules and what each imports, read from the source.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
