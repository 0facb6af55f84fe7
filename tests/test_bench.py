"""`edgeasr bench` on a few real utterances: every row reports, skipped rows say why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # 39 s in the full run
def test_bench_table_json_and_plot(tiny_bundle, dev_dir, tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    proc = subprocess.run(
        [sys.executable, "-m", "edgeasr", "bench", "--dataset", str(dev_dir), "--model", str(tiny_bundle),
         "--limit", "3", "--rows", "10s-int8,hybrid-hailo,full-npu-ref,faster-whisper",
         "--out", str(out), "--plot", str(png)],
        capture_output=True, text=True, cwd=REPO, timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert "Hailo" in rows["hybrid-hailo"]["skipped"]
    for name in ("10s-int8", "full-npu-ref", "faster-whisper"):
        row = rows[name]
        assert row["utterances"] == 3 and 0 <= row["wer"] < 0.5 and row["peak_rss_mb"] > 50, name
        assert row["total_ms_median"] > 0 and row["cpu_ms_median"] > 0
    assert rows["10s-int8"]["encoder_ms_per_window"] > 0 and rows["10s-int8"]["decoder_ms_per_token"] > 0
    assert rows["10s-int8"]["decoder_ms_per_token_median"] > 0
    # tiny.en's int8 step: 8.4 MB of layers, 19.9 MB of projection; 501 positions of cross K/V
    read = rows["10s-int8"]["bytes_per_token"]
    assert 27 < read["weights_mb"] < 30 and 6 < read["cross_kv_mb"] < 6.5 and 0 < read["self_kv_mb"] < 1
    assert rows["faster-whisper"]["bytes_per_token"] is None
    for name in ("10s-int8", "full-npu-ref"):  # a pass per token and one for end-of-text, per window
        assert rows[name]["decoder_steps"] > rows[name]["windows"] >= 3, name
    assert set(report["presets"]) == {"conservative", "balanced", "aggressive"}
    pair = report["interleaved"]
    assert pair["utterances"] == 3 and pair["ours_ms_median"] > 0 and pair["faster_whisper_ms_median"] > 0
    ratios = report["ratios"]
    assert ratios["faster-whisper / ours, interleaved, median of per-utterance ratios"] == pair["ratio_median"] > 0
    assert ratios["faster-whisper median / ours, interleaved"] == round(
        pair["faster_whisper_ms_median"] / pair["ours_ms_median"], 2)
    assert "interleaved, median ms per utterance: ours" in proc.stdout
    assert "| 10 s int8 CPU (default) |" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # 69 s in the full run
def test_bench_on_base_compares_with_faster_whisper_on_the_same_weights(base_bundle, dev_dir, tmp_path):
    """Whisper base ships its model.bin in two parts: faster-whisper loads them joined in
    memory, greedy and with beam 5, and every row has its WER and CER."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "edgeasr", "bench", "--dataset", str(dev_dir), "--model", str(base_bundle),
         "--limit", "2", "--rows", "10s-int8,faster-whisper,faster-whisper-beam5", "--no-presets",
         "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=900, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["model"] == "whisper-base"
    for name in ("10s-int8", "faster-whisper", "faster-whisper-beam5"):
        row = report["rows"][name]
        assert "skipped" not in row, (name, row)
        assert row["utterances"] == 2 and 0 <= row["wer"] < 0.3 and 0 <= row["cer"] < 0.2, name
    assert "| faster-whisper int8, beam 5 |" in proc.stdout
    assert report["interleaved"]["utterances"] == 2


@pytest.mark.slow  # 40 s in the full run
def test_bench_under_load_reports_each_load_against_the_first(tiny_bundle, dev_dir, tmp_path):
    """`--load`: the pair takes turns under every load; the first load's slowdowns are 1, and
    the neighbours are gone when the bench is. With `--cpu-weight` (as root, as CI runs) each
    side runs in a cpu cgroup of its own, and the groups are gone afterwards too."""
    from edgeasr.lab.evaluation.cpu_groups import CGROUP_ROOT, PREFIX

    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "edgeasr", "bench", "--dataset", str(dev_dir), "--model", str(tiny_bundle),
         "--limit", "2", "--rows", "10s-int8,faster-whisper", "--no-presets", "--load", "idle,busy1,wakeful",
         "--out", str(out), "--cpu-weight", "1000"],
        capture_output=True, text=True, cwd=REPO, timeout=900, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    loads = report["load"]
    assert list(loads) == ["idle", "busy1", "wakeful"]
    assert loads["idle"]["ours_slowdown"] == loads["idle"]["faster_whisper_slowdown"] == 1.0
    for summary in loads.values():
        assert summary["utterances"] == 2 and summary["ours_ms_median"] > 0
        assert summary["ratio_of_medians"] == round(summary["faster_whisper_ms_median"] / summary["ours_ms_median"], 2)
    assert report["interleaved"]["ours_ms_median"] == loads["idle"]["ours_ms_median"]
    assert "| busy1 |" in proc.stdout and "| wakeful |" in proc.stdout
    assert set(report["load_average_1min"]) == {"start", "end"}
    assert report["cpu_weight"] == {"ours": 1000, "faster-whisper and the neighbours": 100}
    assert "cpu cgroup weights: ours 1000" in proc.stdout
    assert not [g for base in (CGROUP_ROOT, CGROUP_ROOT / "cpu") for g in base.glob(f"{PREFIX}-*")]


def test_an_unknown_load_is_refused_before_any_row_runs(tiny_bundle, dev_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "edgeasr", "bench", "--dataset", str(dev_dir), "--model", str(tiny_bundle),
         "--rows", "10s-int8,faster-whisper", "--no-presets", "--load", "idle,busy3"],
        capture_output=True, text=True, cwd=REPO, timeout=300, env=dict(os.environ))
    assert proc.returncode != 0 and "--load: 'busy3' is not a load" in proc.stderr
    assert "bench: 10 s int8" not in proc.stderr
