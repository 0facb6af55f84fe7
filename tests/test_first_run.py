"""Two first runs at once on a fresh state_dir: both prepare the embedded
default bundle, one builds it while the other waits, and both transcribe with it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgeasr.bundle import load_bundle
from edgeasr.models.default import default_dir, models_dir

REPO = Path(__file__).resolve().parents[1]

# builds the default bundle from the weights package, twice at once: 49 s in the full run
pytestmark = [pytest.mark.model, pytest.mark.slow]


def test_two_first_runs_at_once_share_one_build(tmp_path, dev_dir):
    """...and the default bundles an earlier release made are removed (its lock and killed
    builds too); a directory that is no default bundle is left alone."""
    state = tmp_path / "state"
    models_dir(state).mkdir(parents=True)
    earlier = ["whisper-tiny.en-0.1.0-edgeasr0.9.0-b10", "whisper-tiny.en-0.1.0-edgeasr0.9.0-b10.lock",
               "whisper-tiny.en-0.1.0-edgeasr0.9.0-b10.partial-x1"]
    for name in (earlier[0], earlier[2], "my-bundle"):
        (models_dir(state) / name).mkdir()
        (models_dir(state) / name / "manifest.json").write_text("{}")
    (models_dir(state) / earlier[1]).touch()
    wav = dev_dir / "audio" / "cmu_goforward.wav"
    runs = [subprocess.Popen([sys.executable, "-m", "edgeasr", "transcribe", "--json", "--set",
                              f"state_dir={state}", "--log-level", "INFO", str(wav)], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [run.communicate(timeout=600) for run in runs]
    for run, (_, err) in zip(runs, results):
        assert run.returncode == 0 and "Traceback" not in err, err[-3000:]
    texts = [json.loads(out)["text"] for out, _ in results]
    assert texts[0] == texts[1] and texts[0]
    logs = "".join(err for _, err in results)
    assert logs.count("default: preparing the default model bundle in") == 1
    assert "another process is preparing the default model bundle: waiting for it" in logs
    root = default_dir(state)
    load_bundle(root, verify_checksums=True)
    assert sorted(p.name for p in models_dir(state).iterdir()) == ["my-bundle", root.name, root.name + ".lock"]
    assert all(f"removed {models_dir(state) / name}: made by another release" in logs for name in earlier)
